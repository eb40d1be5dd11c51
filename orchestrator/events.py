"""The outbox: one `Event` row per state change, written inside the change's transaction.

`event_record` must be called inside `transaction.atomic()`; it refuses otherwise, because an
event written outside the transaction of its change could survive a rollback of that change.
Each event is also entered in the audit ledger (`audit.services`), in the same transaction:
these two functions are the one path every state change of the engine takes.

On PostgreSQL each also sends `NOTIFY stepwise_events` in the same transaction: PostgreSQL
delivers it when (and only if) the transaction commits, and folds repeats within one
transaction into one, so the live pages' relay (`orchestrator.live.relay`) wakes once per
committed change and never for a rolled-back one.
"""
from django.db import connection

from audit.services import audit_record_events

from .models import Event, Run, StepRun


def event_record(*, run: Run, kind: str, step: StepRun | None = None, payload: dict | None = None,
                 actor: str = "service:stepwise") -> Event:
    """Append an event for `run` (and `step`). Raises RuntimeError outside a transaction."""
    if not connection.in_atomic_block:
        raise RuntimeError("event_record must run inside the transaction of the change it records")
    event = Event.objects.create(run=run, step=step, kind=kind, actor=actor, payload=payload or {})
    audit_record_events([event])
    _notify_on_commit()
    return event


def events_record(events: list[Event]) -> None:
    """Append several events at once (the scheduler's batch of transitions)."""
    if not connection.in_atomic_block:
        raise RuntimeError("events_record must run inside the transaction of the change it records")
    Event.objects.bulk_create(events)
    audit_record_events(events)
    _notify_on_commit()


RELAY_CHANNEL = "stepwise_events"


def _notify_on_commit() -> None:
    """Wake the outbox relays at commit (PostgreSQL; the relay polls elsewhere)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"NOTIFY {RELAY_CHANNEL}")
