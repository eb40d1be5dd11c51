"""Example tools for the example workflows, registered the way a user registers their own:
this module is listed in STEPWISE_TOOL_MODULES (the default when the variable is unset).

They run offline. `email.send` is a side effect: it appends to a local outbox file and is
idempotent by the step's idempotency key, so a replay does not send twice.
"""
import hashlib
import json
import threading
from pathlib import Path

from django.conf import settings

from orchestrator.tools.registry import ToolContext, tool

_lock = threading.Lock()


def outbox_path() -> Path:
    path = Path(settings.VAR_DIR) / "outbox" / "emails.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


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
