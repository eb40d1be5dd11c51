"""A queue event (a RabbitMQ message or a Redis-stream entry), its dead letter, and its replay.

The consumer (`triggers/consumers/`) calls `event_receive` for every message and acknowledges
it only after this returns, that is after the transaction that started the run (or held the
firing, or dead-lettered the message) has committed. The message id is the firing's key
(`message:<id>`), so a redelivered message returns the run the first delivery started.

A message that cannot start a run — too large, not JSON, a failing filter or template, an input
the workflow refuses, a firing refused by admission control — is kept as an `EventDeadLetter`
with its reason, in the same transaction, and acknowledged: it no longer blocks the queue, and
an operator can replay it from the admin or the API (`event_dead_letter_replay`) once the cause
is fixed. Nothing here touches the network.
"""
from __future__ import annotations

import hashlib

from django.db import transaction

from orchestrator.engine.authz import Action, Actor, label, person, require
from orchestrator.engine.clock import now
from orchestrator.engine.definitions import DefinitionInvalid
from orchestrator.engine.definitions.loader import parse_json_text
from orchestrator.engine.errors import NotAllowed

from ..models import EventDeadLetter, Trigger, TriggerKind
from ..selectors import trigger_actor
from .firing import FireOutcome, fire, trigger_audit, trigger_lock

KEPT_BODY_CHARS = 64 * 1024  # what a dead letter keeps of a body too large to replay


def event_key(message_id: str | None, body: bytes, meta: dict) -> str:
    """`message:<id>`; without an id, a digest of the body and where it came from, so a
    redelivery of the same message is still recognized."""
    if message_id:
        return f"message:{message_id[:180]}"
    where = f"{meta.get('routing_key') or meta.get('stream') or ''}".encode()
    return "digest:" + hashlib.sha256(where + b"\n" + body).hexdigest()


def _context(payload: object, key: str, meta: dict) -> dict:
    return {"payload": payload, "message": {"id": key.split(":", 1)[1], **meta}}


def _dead_letter(trigger: Trigger, *, key: str, body: bytes, meta: dict, outcome: FireOutcome,
                 reason: str | None = None) -> EventDeadLetter:
    text = body.decode("utf-8", errors="replace")
    complete = len(body) <= trigger.max_body_bytes
    letter, created = EventDeadLetter.objects.get_or_create(trigger=trigger, key=key, defaults={
        "body": text if complete else text[:KEPT_BODY_CHARS], "body_complete": complete,
        "meta": meta, "reason_class": reason or outcome.reason, "problems": outcome.problems})
    if not created:  # delivered again (or replayed) and still failing: the newest reason
        letter.reason_class, letter.problems = reason or outcome.reason, outcome.problems
        letter.attempts += 1
        letter.status = EventDeadLetter.Status.OPEN
        letter.save(update_fields=["reason_class", "problems", "attempts", "status"])
    trigger_audit(trigger, action="trigger.dead_lettered", actor=str(trigger_actor(trigger)),
                  outcome=letter.reason_class, payload={"key": key, "dead_letter": letter.id,
                                                        "problems": outcome.problems})
    return letter


def _process(trigger: Trigger, *, key: str, body: bytes, meta: dict) -> FireOutcome:
    """Fire the locked trigger for one message; dead-letter it if it cannot start a run."""
    if len(body) > trigger.max_body_bytes:
        outcome = FireOutcome("invalid", reason="too_large", problems=[{"path": "body", "message":
                              f"the message is larger than max_body_bytes ({trigger.max_body_bytes:,})"}])
        _dead_letter(trigger, key=key, body=body, meta=meta, outcome=outcome)
        return outcome
    try:
        payload = parse_json_text(body, what="message body")
    except DefinitionInvalid as error:
        outcome = FireOutcome("invalid", reason="malformed", problems=[
            {"path": "body", "message": p.message} for p in error.problems])
        _dead_letter(trigger, key=key, body=body, meta=meta, outcome=outcome)
        return outcome
    outcome = fire(trigger, key=key, context=_context(payload, key, meta),
                   origin={"message": key.split(":", 1)[1][:180], **_where(meta)})
    if outcome.status in ("invalid", "refused"):
        _dead_letter(trigger, key=key, body=body, meta=meta, outcome=outcome)
    return outcome


def _where(meta: dict) -> dict:
    return {name: meta[name] for name in ("routing_key", "stream") if meta.get(name)}


def event_receive(*, trigger_id, message_id: str | None, body: bytes, meta: dict) -> FireOutcome:
    """Take one message for the queue trigger `trigger_id`; commit before returning.

    `meta` describes where it came from (RabbitMQ: exchange, routing_key, headers; Redis:
    stream, fields), as the filter and template read it under `message`. Returns status
    `disabled` (leave the message in the queue) or any FireOutcome: the caller acknowledges
    the message for every other status.
    """
    key = event_key(message_id, body, meta)
    with transaction.atomic():
        trigger = Trigger.objects.filter(id=trigger_id, kind=TriggerKind.QUEUE).first()
        if trigger is None:
            return FireOutcome("not_found")
        trigger = trigger_lock(trigger_id)
        if not trigger.enabled:
            return FireOutcome("disabled", reason="disabled")
        return _process(trigger, key=key, body=body, meta=meta)


def event_dead_letter_replay(*, dead_letter_id: int, actor: Actor) -> tuple[EventDeadLetter, FireOutcome]:
    """Process a dead-lettered event again, under the trigger's current settings.

    Raises Forbidden without dead_letter.redrive in the trigger's team, NotAllowed when the
    letter was replayed already, its body was not kept whole, or the trigger is disabled.
    When the event still cannot start a run, the letter stays open with the new reason.
    """
    with transaction.atomic():
        trigger_id = EventDeadLetter.objects.values_list("trigger_id", flat=True).get(id=dead_letter_id)
        trigger = trigger_lock(trigger_id)
        letter = EventDeadLetter.objects.select_for_update().get(id=dead_letter_id)
        require(actor, Action.DEAD_LETTER_REDRIVE, team=trigger.team)
        if letter.status != EventDeadLetter.Status.OPEN:
            raise NotAllowed(f"event dead letter {letter.id} was replayed already")
        if not letter.body_complete:
            raise NotAllowed(f"event dead letter {letter.id} keeps only the start of a message "
                             "that was too large: it cannot be replayed")
        if not trigger.enabled:
            raise NotAllowed(f"trigger '{trigger.name}' is disabled: enable it to replay its events")
        outcome = _process(trigger, key=letter.key, body=letter.body.encode(), meta=letter.meta)
        letter.refresh_from_db()
        if outcome.accepted:
            letter.status = EventDeadLetter.Status.REPLAYED
            letter.run = outcome.run
            letter.replayed_at, letter.replayed_by = now(), person(actor)
            letter.save(update_fields=["status", "run", "replayed_at", "replayed_by"])
        trigger_audit(trigger, action="trigger.dead_letter_replayed", actor=label(actor),
                      outcome=outcome.status, payload={"dead_letter": letter.id, "key": letter.key,
                                                       "run": str(outcome.run.id) if outcome.run else None})
    return letter, outcome
