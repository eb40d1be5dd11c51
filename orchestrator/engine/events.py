"""The outbox: one `Event` row per state change, written inside the change's transaction.

`event_record` must be called inside `transaction.atomic()`; it refuses otherwise, because an
event written outside the transaction of its change could survive a rollback of that change.
Each event is also entered in the audit ledger (`audit.services`), in the same transaction:
these two functions are the one path every state change of the engine takes.

They are also where the engine's log lines about its work come from (and its retry and
dead-letter counters, `orchestrator.operations.metrics`): after the transaction
commits, each event of a kind in `LOG_LEVELS` is logged once, at its level, with the run, step,
attempt, workflow and team ids — a failure, a retry, a dead letter, a pause (a budget denial),
an approval decision — so a rolled-back change logs nothing and a change logs one line.

A run's callback (`notifications.models.RunCallback`, the `callback_url` given at its start) is
owed one delivery per event that says the run waits or has ended (`CALLBACK_KINDS`): the
`CallbackDelivery` row is written here, in the same transaction, and sent after commit.

On PostgreSQL the INSERT of the events sends `NOTIFY stepwise_events` in the same transaction
(a trigger: migration 0015): PostgreSQL delivers it when (and only if) the transaction commits,
and folds repeats within one transaction into one, so the live pages' relay
(`orchestrator.web.live.relay`) wakes once per committed change and never for a rolled-back one.

`run_ended` tells another app (the evaluation app) that an evaluation run has ended: a Django
signal, sent after the commit of the change that ended it (`run_ended_on_commit`).
"""
import logging
from uuid import UUID

from django.db import connection, transaction
from django.dispatch import Signal

from audit.services import audit_record_events
from notifications.models import CallbackDelivery, RunCallback
from orchestrator.models import Event, Run, StepRun, WorkflowVersion
from orchestrator.operations.logcontext import describing
from orchestrator.operations.metrics import observe_event
from orchestrator.store import Read, build_row, insert_rows

from .dispatch import callback_on_commit
from .states import RunCapacity

log = logging.getLogger("stepwise.events")

INFO, WARNING, ERROR = logging.INFO, logging.WARNING, logging.ERROR
LOG_LEVELS = {
    "run.created": INFO, "run.completed": INFO, "run.cancelled": INFO,
    "run.failed": ERROR, "run.timed_out": ERROR, "run.compensation_failed": ERROR,
    "run.paused": WARNING, "run.stuck": WARNING, "run.compensating": WARNING,
    "run.compensation_retrying": WARNING, "run.moved": INFO,
    "step.failed": ERROR, "step.timed_out": ERROR, "step.dead_lettered": ERROR,
    "step.retrying": WARNING, "step.item_retrying": WARNING,
    "approval.given": INFO, "approval.approved": INFO, "approval.rejected": INFO,
    "approval.edited": INFO, "approval.revoked": INFO, "approval.escalated": WARNING,
    "approval.expired": WARNING, "dead_letter.redriven": INFO,
    "input.answered": INFO, "input.abstained": INFO, "input.escalated": WARNING,
    "input.expired": WARNING,
}


def _detail(kind: str, payload: dict) -> str:
    """What the line says beyond the kind: the reason, never data (no note, no output)."""
    if not isinstance(payload, dict):
        return ""
    if kind == "run.paused" and payload.get("class") == "budget":
        return f"budget denied step {payload.get('step', '?')}: {payload.get('message', '')}"
    parts = [str(payload[k]) for k in ("class", "message", "reason") if payload.get(k)]
    if payload.get("attempt"):
        parts.insert(0, f"attempt {payload['attempt']}")
    if payload.get("attempts"):
        parts.append(f"after {payload['attempts']} attempt(s)")
    return ": ".join(parts)


def _log_after_commit(events: list[Event]) -> None:
    notable = [(e.kind, e.run_id, e.step.name if e.step_id else None,
                e.step.attempts if e.step_id else None, e.actor, e.payload)
               for e in events if e.kind in LOG_LEVELS]
    if not notable:
        return

    # What the lines name, read off the runs in hand (a service reads a run with its workflow
    # and team): the rest after commit, in one SELECT.
    known = dict(filter(None, (_described(e) for e in events if e.kind in LOG_LEVELS)))

    def write() -> None:
        for kind, *_, payload in notable:
            observe_event(kind, payload)
        described = dict(known)
        if missing := {n[1] for n in notable} - described.keys():
            described |= {pk: (name, team) for pk, name, team in Run.objects.filter(
                pk__in=missing).values_list("pk", "version__workflow__name", "team__slug")}
        names = {pk: name for pk, (name, _) in described.items()}
        teams = {pk: team for pk, (_, team) in described.items()}
        for kind, run_id, step, attempt, actor, payload in notable:
            with describing(run_id=run_id, step=step, attempt=attempt,
                            workflow=names.get(run_id), team=teams.get(run_id)):
                detail = _detail(kind, payload)
                log.log(LOG_LEVELS[kind], "%s%s%s", kind, " " if detail else "", detail,
                        extra={"event": kind, "actor": actor})

    transaction.on_commit(write, robust=True)


def _described(event: Event) -> tuple | None:
    """(run id, (workflow name, team slug)) when the event's run has both loaded, else None."""
    if not Event.run.is_cached(event):
        return None
    run = event.run
    if not (Run.version.is_cached(run) and Run.team.is_cached(run)
            and WorkflowVersion.workflow.is_cached(run.version)):
        return None
    return run.pk, (run.version.workflow.name, run.team.slug)


# The run events a callback reports: it waits (for a person, a child run...), or it has ended.
CALLBACK_KINDS = frozenset({"run.waiting", "run.completed", "run.failed", "run.timed_out",
                            "run.cancelled", "run.compensation_failed"})


def event_record(*, run: Run, kind: str, step: StepRun | None = None, payload: dict | None = None,
                 actor: str = "service:stepwise") -> Event:
    """Append an event for `run` (and `step`). Raises RuntimeError outside a transaction."""
    if not connection.in_atomic_block:
        raise RuntimeError("event_record must run inside the transaction of the change it records")
    event = build_row(Event, run=run, step=step, kind=kind, actor=actor, payload=payload or {})
    insert_rows([event])
    audit_record_events([event])
    _log_after_commit([event])
    _owe_callbacks([event])
    return event


def events_record(events: list[Event]) -> None:
    """Append several events at once (the scheduler's batch of transitions); none, nothing."""
    if not connection.in_atomic_block:
        raise RuntimeError("events_record must run inside the transaction of the change it records")
    if not events:
        return
    insert_rows(events)
    audit_record_events(events)
    _log_after_commit(events)
    _owe_callbacks(events)


def _owe_callbacks(events: list[Event]) -> None:
    reported = [event for event in events
                if event.kind in CALLBACK_KINDS and event.run.has_callback is not False]
    if not reported:
        return
    run_field = RunCallback._meta.get_field("run")
    callbacks = {run_id: found[0] for run_id in {e.run_id for e in reported}
                 if (found := _CALLBACK_OF_RUN.rows(run_field.get_db_prep_value(run_id, connection)))}
    for event in reported:
        callback = callbacks.get(event.run_id)
        if callback is not None:
            delivery = CallbackDelivery.objects.create(callback=callback, event=event, kind=event.kind)
            callback_on_commit(delivery.id)


# Read as every run ends (compiled once per connection: building the queryset cost more than
# the database spent on it).
_CALLBACK_OF_RUN = Read(lambda run_id: RunCallback.objects.filter(run_id=run_id), UUID(int=0))


#: Sent with `run` (the Run as it ended) once the transaction in which a run of the evaluation
#: capacity reached a terminal state commits: completed, failed, cancelled, timed_out,
#: compensation_failed (and again if an operator's redrive reopens it and it ends again).
#: Receivers re-read what they need; one that raises is logged and does not stop the others.
run_ended = Signal()


def run_ended_on_commit(run: Run) -> None:
    """Send `run_ended` for `run`, which the caller's transaction has just ended, once it
    commits (nothing for an interactive run, nothing if it rolls back)."""
    if run.capacity != RunCapacity.EVALUATION or not run.is_terminal:
        return

    def send() -> None:
        for receiver, result in run_ended.send_robust(sender=Run, run=run):
            if isinstance(result, Exception):
                log.error("run_ended receiver %r failed for run %s: %s", receiver, run.id, result,
                          exc_info=result)

    transaction.on_commit(send, robust=True)


# The channel the outbox's INSERT trigger notifies (migration 0015 names it too).
RELAY_CHANNEL = "stepwise_events"
