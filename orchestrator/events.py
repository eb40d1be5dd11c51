"""The outbox: one `Event` row per state change, written inside the change's transaction.

`event_record` must be called inside `transaction.atomic()`; it refuses otherwise, because an
event written outside the transaction of its change could survive a rollback of that change.
Each event is also entered in the audit ledger (`audit.services`), in the same transaction:
these two functions are the one path every state change of the engine takes.

A run's callback (`notifications.models.RunCallback`, the `callback_url` given at its start) is
owed one delivery per event that says the run waits or has ended (`CALLBACK_KINDS`): the
`CallbackDelivery` row is written here, in the same transaction, and sent after commit.

On PostgreSQL each also sends `NOTIFY stepwise_events` in the same transaction: PostgreSQL
delivers it when (and only if) the transaction commits, and folds repeats within one
transaction into one, so the live pages' relay (`orchestrator.live.relay`) wakes once per
committed change and never for a rolled-back one.
"""
from django.db import connection

from audit.services import audit_record_events
from notifications.models import CallbackDelivery, RunCallback

from .dispatch import callback_on_commit
from .models import Event, Run, StepRun

# The run events a callback reports: it waits (for a person, a child run...), or it has ended.
CALLBACK_KINDS = frozenset({"run.waiting", "run.completed", "run.failed", "run.timed_out",
                            "run.cancelled", "run.compensation_failed"})


def event_record(*, run: Run, kind: str, step: StepRun | None = None, payload: dict | None = None,
                 actor: str = "service:stepwise") -> Event:
    """Append an event for `run` (and `step`). Raises RuntimeError outside a transaction."""
    if not connection.in_atomic_block:
        raise RuntimeError("event_record must run inside the transaction of the change it records")
    event = Event.objects.create(run=run, step=step, kind=kind, actor=actor, payload=payload or {})
    audit_record_events([event])
    _owe_callbacks([event])
    _notify_on_commit()
    return event


def events_record(events: list[Event]) -> None:
    """Append several events at once (the scheduler's batch of transitions)."""
    if not connection.in_atomic_block:
        raise RuntimeError("events_record must run inside the transaction of the change it records")
    Event.objects.bulk_create(events)
    audit_record_events(events)
    _owe_callbacks(events)
    _notify_on_commit()


def _owe_callbacks(events: list[Event]) -> None:
    reported = [event for event in events if event.kind in CALLBACK_KINDS]
    if not reported:
        return
    callbacks = {c.run_id: c for c in RunCallback.objects.filter(run_id__in={e.run_id for e in reported})}
    for event in reported:
        callback = callbacks.get(event.run_id)
        if callback is not None:
            delivery = CallbackDelivery.objects.create(callback=callback, event=event, kind=event.kind)
            callback_on_commit(delivery.id)


RELAY_CHANNEL = "stepwise_events"


def _notify_on_commit() -> None:
    """Wake the outbox relays at commit (PostgreSQL; the relay polls elsewhere)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"NOTIFY {RELAY_CHANNEL}")
