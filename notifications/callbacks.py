"""Delivering a run's callback: a signed POST to the client's `callback_url` when its run waits,
completes or fails (docs/live.md#callbacks).

Runs on a worker, outside any transaction, through the egress policy
(`orchestrator.integrations.egress`, tool name `run.callback`). At least once: a delivery stays
pending until the receiver answers 2xx; a failure is retried with a growing delay (the task's
message, then the reaper's `callbacks_resend` backstop) up to `CALLBACK_MAX_ATTEMPTS`, then it is
marked failed.

The signature: `X-Stepwise-Signature: sha256=<hex>`, the HMAC-SHA256 under the run's callback
secret of `<X-Stepwise-Timestamp>.<body bytes>`; `verify_signature` is the receiver's check.
"""
import hashlib
import hmac
import json
import logging
from datetime import timedelta

from django.conf import settings

from orchestrator.engine.clock import now
from orchestrator.engine.sealing import CALLBACK_SECRETS
from orchestrator.integrations.egress import policy_for, request

from .models import CallbackDelivery
from .services import CALLBACK_MAX_ATTEMPTS

log = logging.getLogger(__name__)
CALLBACK_DEADLINE_S = 10
MAX_DELAY_S = 3600


def sign(secret: str, timestamp: str, body: bytes) -> str:
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return f"sha256={mac.hexdigest()}"


def verify_signature(secret: str, *, timestamp: str, body: bytes, signature: str) -> bool:
    """What a receiver checks (constant-time); it should also refuse an old timestamp."""
    return hmac.compare_digest(sign(secret, timestamp, body), signature)


def callback_body(delivery: CallbackDelivery) -> bytes:
    run = delivery.callback.run
    event = delivery.event
    body = {
        "delivery": delivery.id,
        "event": event.kind,
        "event_id": event.id,
        "at": event.created_at.isoformat(),
        "run": {"id": str(run.id), "state": event.kind.removeprefix("run."),
                "workflow": run.version.workflow.name, "version": run.version.number,
                "url": f"{settings.STEPWISE_BASE_URL.rstrip('/')}/api/v1/runs/{run.id}/"},
    }
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def callback_deliver(*, delivery_id: int) -> bool:
    """POST one callback. True once delivered (now or before)."""
    delivery = (CallbackDelivery.objects.select_related("callback__run__version__workflow", "event")
                .filter(id=delivery_id).first())
    if delivery is None or delivery.status != CallbackDelivery.Status.PENDING:
        return delivery is not None and delivery.status == CallbackDelivery.Status.DELIVERED
    callback = delivery.callback
    body = callback_body(delivery)
    timestamp = str(int(now().timestamp()))
    headers = {"Content-Type": "application/json", "User-Agent": "Stepwise-Callback",
               "X-Stepwise-Delivery": str(delivery.id), "X-Stepwise-Event": delivery.kind,
               "X-Stepwise-Timestamp": timestamp,
               "X-Stepwise-Signature": sign(CALLBACK_SECRETS.unseal(callback.sealed_secret),
                                                timestamp, body)}
    delivery.attempts += 1
    try:
        response = request("POST", callback.url, policy=policy_for(tool="run.callback", team=callback.team),
                           deadline_s=CALLBACK_DEADLINE_S, headers=headers, content=body)
        delivery.response_status = response.status_code
        error = "" if 200 <= response.status_code < 300 else f"the receiver answered {response.status_code}"
    except Exception as exc:  # egress refusals, timeouts, connection errors: all "try later"
        error = f"{type(exc).__name__}: {exc}"
    if error:
        delivery.error = error[:2000]
        if delivery.attempts >= CALLBACK_MAX_ATTEMPTS:
            delivery.status = CallbackDelivery.Status.FAILED
        delivery.next_attempt_at = now() + timedelta(seconds=min(10 * 2 ** delivery.attempts, MAX_DELAY_S))
        log.warning("callback %s of run %s not delivered (attempt %s): %s", delivery.id,
                    callback.run_id, delivery.attempts, error)
    else:
        delivery.status, delivery.delivered_at, delivery.error = (
            CallbackDelivery.Status.DELIVERED, now(), "")
    delivery.save()
    return not error
