"""A webhook delivery: check its size, its signature and its age, then fire the trigger.

The sender's `webhook-id` is the firing's key (`delivery:<id>`), so a retried delivery returns
the run the first one started. Every refusal starts nothing and reaches the ledger. One of a
post that was not authenticated — too large (checked first), unsigned or badly signed, outside
the replay window — can come from anyone, so it is counted per trigger and minute
(`RefusalTally`) and each minute becomes one audit entry with its count once it has passed
(`refusal_tallies_record`, from beat); a refusal of an authenticated post — not JSON, not a valid
input, disabled, over the rate — writes its own entry. The secret is opened only to verify and is
never logged or returned.
"""
from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta

from django.db import transaction
from django.db.models import F

from orchestrator.engine.clock import now
from orchestrator.engine.definitions import DefinitionInvalid
from orchestrator.engine.definitions.loader import parse_json_text

from .. import sealing, signatures
from ..models import RefusalTally, Trigger
from ..selectors import trigger_actor, webhook_trigger
from .firing import FireOutcome, fire, refusal, trigger_audit, trigger_lock

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
            return _unauthenticated(trigger, reason="too_large", status="too_large", problems=[
                {"path": "", "message": "the body is larger than this trigger's max_body_bytes "
                 f"({trigger.max_body_bytes:,})"}])
        try:
            signatures.verify(secrets_=_secrets(trigger), delivery_id=delivery,
                              timestamp=headers.get("webhook-timestamp", ""),
                              signature=headers.get("webhook-signature", ""), body=body,
                              now_s=now().timestamp(), window_s=trigger.replay_window_s)
        except signatures.SignatureRefused as refused:
            return _unauthenticated(trigger, reason=refused.reason, status="unauthorized",
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


def _unauthenticated(trigger: Trigger, *, reason: str, status: str,
                     problems: list[dict]) -> FireOutcome:
    """Count a refusal of a post nobody authenticated in its trigger's tally of this minute (the
    caller holds the trigger's row lock, so the tally's upsert does not race)."""
    minute = now().replace(second=0, microsecond=0)
    tally, created = RefusalTally.objects.get_or_create(
        trigger=trigger, minute=minute,
        defaults={"count": 1, "reasons": {reason: 1}, "first_problem": problems[0]["message"][:500]})
    if not created:
        reasons = {**tally.reasons, reason: tally.reasons.get(reason, 0) + 1}
        RefusalTally.objects.filter(id=tally.id).update(count=F("count") + 1, reasons=reasons)
    return FireOutcome(status, reason=reason, problems=problems)


def refusal_tallies_record(*, limit: int = 500) -> int:
    """Write each minute that has passed of every trigger's unauthenticated refusals to the
    ledger: one entry per trigger and minute, with the count and the reasons. Returns how many
    entries it wrote. Beat calls it; a replay writes nothing twice (the idempotency key)."""
    closed_before = now().replace(second=0, microsecond=0)
    due = list(RefusalTally.objects.filter(recorded=False, minute__lt=closed_before)
               .select_related("trigger__team", "trigger__workflow").order_by("minute")[:limit])
    for tally in due:
        with transaction.atomic():
            if not RefusalTally.objects.filter(id=tally.id, recorded=False).update(recorded=True):
                continue
            until = tally.minute + timedelta(minutes=1)
            trigger_audit(tally.trigger, action="trigger.refused",
                          actor=str(trigger_actor(tally.trigger)), outcome="unauthenticated",
                          idempotency_key=f"refusals:{tally.trigger_id}:{tally.minute.isoformat()}",
                          payload={"reason": "unauthenticated", "count": tally.count,
                                   "reasons": tally.reasons, "from": tally.minute.isoformat(),
                                   "until": until.isoformat(),
                                   "first_problem": tally.first_problem})
    return len(due)
