"""A webhook delivery: check its size, its signature and its age, then fire the trigger.

The sender's `webhook-id` is the firing's key (`delivery:<id>`), so a retried delivery returns
the run the first one started. Every refusal — too large, unsigned or badly signed, outside the
replay window, disabled, not JSON, not a valid input, over the rate — writes an audit entry and
starts nothing. The secret is opened only to verify and is never logged or returned.
"""
from __future__ import annotations

from collections.abc import Mapping

from django.db import transaction

from orchestrator.clock import now
from orchestrator.definitions import DefinitionInvalid
from orchestrator.definitions.loader import parse_json_text

from .. import sealing, signatures
from ..models import Trigger
from ..selectors import trigger_actor, webhook_trigger
from .firing import FireOutcome, fire, refusal, trigger_lock

# Headers a template may read as `headers`: never the signature or credentials.
HIDDEN_HEADERS = frozenset({"webhook-signature", "authorization", "cookie", "proxy-authorization"})


def _secrets(trigger: Trigger) -> list[str]:
    accepted = [sealing.unseal(trigger.secret_ciphertext)]
    if trigger.previous_secret_ciphertext and trigger.previous_secret_until and \
            trigger.previous_secret_until > now():
        accepted.append(sealing.unseal(trigger.previous_secret_ciphertext))
    return accepted


def webhook_receive(*, trigger_id, headers: Mapping[str, str], body: bytes,
                    body_complete: bool = True) -> FireOutcome:
    """Take one delivery for the webhook trigger `trigger_id`.

    `headers` are the request's headers (any case); `body` the raw bytes, of which the caller
    read at most the trigger's `max_body_bytes` + 1 (`body_complete=False` when it stopped
    reading there). Returns the outcome; status `unauthorized` (signature, timestamp), `too_large`,
    `invalid` (not JSON, or not a valid input), `refused`, or a started/duplicate/queued firing.
    """
    trigger = webhook_trigger(trigger_id)
    if trigger is None:
        return FireOutcome("not_found")
    headers = {name.lower(): value for name, value in headers.items()}
    delivery = headers.get("webhook-id", "")
    origin = {"delivery": delivery[:signatures.MAX_DELIVERY_ID]}
    who = str(trigger_actor(trigger))
    with transaction.atomic():
        trigger = trigger_lock(trigger.id)
        if not body_complete or len(body) > trigger.max_body_bytes:
            return refusal(trigger, key="", reason="too_large", actor=who, origin=origin,
                           status="too_large", problems=[{"path": "", "message": "the body is "
                           f"larger than this trigger's max_body_bytes ({trigger.max_body_bytes:,})"}])
        try:
            signatures.verify(secrets_=_secrets(trigger), delivery_id=delivery,
                              timestamp=headers.get("webhook-timestamp", ""),
                              signature=headers.get("webhook-signature", ""), body=body,
                              now_s=now().timestamp(), window_s=trigger.replay_window_s)
        except signatures.SignatureRefused as refused:
            return refusal(trigger, key="", reason=refused.reason, actor=who, origin=origin,
                           status="unauthorized",
                           problems=[{"path": "headers", "message": str(refused)}])
        key = f"delivery:{delivery}"
        try:
            payload = parse_json_text(body, what="JSON body") if body.strip() else None
        except DefinitionInvalid as error:
            return refusal(trigger, key=key, reason="malformed", actor=who, origin=origin,
                           status="invalid", problems=[{"path": "body", "message": p.message}
                                                       for p in error.problems])
        visible = {name: value for name, value in headers.items() if name not in HIDDEN_HEADERS}
        return fire(trigger, key=key, origin=origin,
                    context={"payload": payload, "headers": visible, "delivery": delivery})
