"""Example tools for the example workflows, registered the way a user registers their own:
this module is listed in STEPWISE_TOOL_MODULES (the default when the variable is unset).

They run offline. `email.send` is a side effect: it appends to a local outbox file and is
idempotent by the step's idempotency key, so a replay does not send twice; like a mail
provider's API log, every request it gets is also logged (`email_requests_path`), the
duplicates it refused included, so a test can see a repeated send the outbox hides. `shop.order` and
`shop.refund` serve the refund-proposal example: a trusted lookup, and an idempotent refund
that re-checks the order before acting.
"""
import hashlib
import json
import threading
from pathlib import Path

from django.conf import settings

from orchestrator.engine.retry import StepError
from orchestrator.integrations.tools.registry import ToolContext, tool

_lock = threading.Lock()


def outbox_path() -> Path:
    path = Path(settings.STEPWISE_OUTBOX_DIR) / "emails.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def email_requests_path() -> Path:
    return Path(settings.STEPWISE_OUTBOX_DIR) / "email-requests.jsonl"


def _sent() -> dict[str, dict]:
    path = outbox_path()
    if not path.exists():
        return {}
    rows = (json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return {row["idempotency_key"]: row for row in rows}


def email_lookup(key: str) -> dict | None:
    """Has the email for this idempotency key been sent? (reconcile an uncertain send)"""
    return _sent().get(key)


@tool("email.send", description="Send an email (to the local outbox file).", lookup=email_lookup,
      params_schema={
    "type": "object", "additionalProperties": False, "required": ["to", "subject", "body"],
    "properties": {"to": {"type": "string", "minLength": 3}, "subject": {"type": "string"},
                   "body": {"type": "string"}},
})
def email_send(params: dict, ctx: ToolContext) -> dict:
    with _lock:
        previous = email_lookup(ctx.idempotency_key)
        with email_requests_path().open("a") as log:
            log.write(json.dumps({"idempotency_key": ctx.idempotency_key,
                                  "duplicate": bool(previous)}) + "\n")
        if previous:
            return {"message_id": previous["message_id"], "duplicate": True}
        message_id = hashlib.sha256(ctx.idempotency_key.encode()).hexdigest()[:16]
        row = {"idempotency_key": ctx.idempotency_key, "message_id": message_id, **params}
        with outbox_path().open("a") as out:
            out.write(json.dumps(row) + "\n")
    return {"message_id": message_id, "duplicate": False}


@tool("support.fetch_history", description="Past tickets of a customer (offline sample data).",
      params_schema={"type": "object", "required": ["ticket_id"], "additionalProperties": False,
                     "properties": {"ticket_id": {"type": "string"}}})
def fetch_history(params: dict, ctx: ToolContext) -> dict:
    seed = int(hashlib.sha256(params["ticket_id"].encode()).hexdigest(), 16)
    count = seed % 4
    return {"ticket_id": params["ticket_id"], "previous_tickets": count,
            "lifetime_value_usd": (seed % 5000) / 10}


# --- the refund-proposal example: a trusted order lookup and an idempotent refund ----------
# The order's total and customer come from here, never from the model or the request.
ORDERS = {
    "ORD-1001": {"total_usd": 40.0, "customer_email": "ann@example.com"},
    "ORD-1002": {"total_usd": 1200.0, "customer_email": "bo@example.com"},
    "ORD-1003": {"total_usd": 15.5, "customer_email": "cy@example.com"},
}
# The orders of the refund example's sample cases (examples/datasets/refund-proposal.jsonl), so an
# evaluation of it runs every case: questions and declines, scratched goods, parcels that never
# arrived (whose full refund needs a person), and messages trying to talk the agent into a refund.
for _first, _count, _total in ((1100, 10, 35.0), (1200, 10, 80.0), (1300, 6, 1200.0), (1400, 4, 60.0)):
    ORDERS.update({f"ORD-{n}": {"total_usd": _total, "customer_email": f"customer{n}@example.com"}
                   for n in range(_first, _first + _count)})


def refunds_path() -> Path:
    path = Path(settings.STEPWISE_OUTBOX_DIR) / "refunds.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def refund_lookup(key: str) -> dict | None:
    """Was the refund for this idempotency key made? (reconcile an uncertain refund)"""
    path = refunds_path()
    if not path.exists():
        return None
    rows = (json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return next((row for row in rows if row["idempotency_key"] == key), None)


@tool("shop.order", description="Look an order up (offline sample data).",
      params_schema={"type": "object", "required": ["order_id"], "additionalProperties": False,
                     "properties": {"order_id": {"type": "string"}}})
def shop_order(params: dict, ctx: ToolContext) -> dict:
    order = ORDERS.get(params["order_id"])
    if order is None:
        raise StepError("permanent", f"no order {params['order_id']}")
    return {"order_id": params["order_id"], **order}


@tool("shop.refund", description="Refund an order (to a local ledger file).", lookup=refund_lookup,
      params_schema={
          "type": "object", "additionalProperties": False,
          "required": ["order_id", "amount_usd", "proposal_hash"],
          "properties": {"order_id": {"type": "string"},
                         "amount_usd": {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?$"},
                         "proposal_hash": {"type": "string", "pattern": "^[0-9a-f]{64}$"}}})
def shop_refund(params: dict, ctx: ToolContext) -> dict:
    """Re-check the order right before acting (the proposal may be stale), then refund once."""
    order = ORDERS.get(params["order_id"])
    amount = round(float(params["amount_usd"]), 2)
    if order is None:
        raise StepError("policy", f"no order {params['order_id']}")
    if not 0 < amount <= order["total_usd"]:
        raise StepError("policy", f"refund {amount} is not within the order total {order['total_usd']}")
    with _lock:
        previous = refund_lookup(ctx.idempotency_key)
        if previous:
            return {"refund_id": previous["refund_id"], "amount_usd": previous["amount_usd"],
                    "duplicate": True}
        refund_id = "rf_" + hashlib.sha256(ctx.idempotency_key.encode()).hexdigest()[:12]
        row = {"idempotency_key": ctx.idempotency_key, "refund_id": refund_id,
               "order_id": params["order_id"], "amount_usd": amount,
               "proposal_hash": params["proposal_hash"]}
        with refunds_path().open("a") as out:
            out.write(json.dumps(row) + "\n")
    return {"refund_id": refund_id, "amount_usd": amount, "duplicate": False}
