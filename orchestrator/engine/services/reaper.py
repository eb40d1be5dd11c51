"""The reaper: a periodic sweep (Celery beat) over persisted state.

It wakes sleep steps whose time has come, and enforces what no stuck worker can: step and map
item timeouts, runs past their duration (paused or timed out per `budget.on_duration`, their running steps stopped), expired leases, due retries,
lost messages, lost chord callbacks, children never started and finished children, approval deadlines (a gate's timeout:
escalate, reject or expire) and reminders, notifications whose delivery is due again, and flags
runs that stopped moving. Every action goes through the same service a worker would call, so a sweep
racing a worker is harmless: one of them finds the state already moved and does nothing.
"""
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef, Q

from approvals.services import approval_reminders_send
from notifications.services import callbacks_resend, notifications_resend
from orchestrator.models import Event, MapItem, Run, StepRun

from ..authz import REAPER, label
from ..clock import now
from ..dispatch import compensate_on_commit
from ..events import event_record
from ..states import RUN_LIVE, RUN_TERMINAL, RunState, StepState
from . import runs
from .concurrency import held_runs_sweep
from .kinds import handler_for, map_step, sleep, sub_workflow, worker

BATCH = 200
STUCK_AFTER = timedelta(minutes=5)


def reap() -> dict[str, int]:
    """One sweep. Returns how many of each thing it acted on."""
    at = now()
    report = {"woken": 0, "timed_out": 0, "leases": 0, "retries": 0, "redispatched": 0, "joined": 0,
              "items_resent": 0, "children": 0, "children_started": 0, "stuck": 0, "runs_timed_out": 0, "runs_paused": 0,
              "compensations": 0, "approval_reminders": 0, "notifications": 0,
              "callbacks": 0}
    # The longest overdue first (the order of their index): more than a batch wake on the next sweeps.
    due = StepRun.objects.filter(state=StepState.WAITING, wake_at__lte=at).order_by("wake_at")
    for step_id in due.values_list("id", flat=True)[:BATCH]:
        report["woken"] += sleep.sleep_wake(step_id=step_id)
    late = StepRun.objects.filter(state__in=[StepState.RUNNING, StepState.WAITING], deadline_at__lt=at)
    for step_id, kind in late.values_list("id", "kind")[:BATCH]:
        report["timed_out"] += handler_for(kind).time_out(step_id=step_id, reason="step timeout elapsed")
    for step_id in _ids(state=StepState.RUNNING, lease_expires_at__lt=at):
        report["leases"] += worker.step_lease_expired(step_id=step_id)
    for step_id in _ids(state=StepState.RETRYING, next_attempt_at__lte=at):
        report["retries"] += worker.step_retry_due(step_id=step_id)
    stale = at - timedelta(seconds=settings.STEPWISE_REDISPATCH_AFTER_S)
    for step_id in _ids(state=StepState.QUEUED, queued_at__lt=stale):
        report["redispatched"] += worker.step_redispatch(step_id=step_id)
    for run_id in _late_runs(at):
        if outcome := runs.run_over_duration(run_id=run_id):
            report[f"runs_{outcome}"] += 1
    _sweep_compensations(stale, report)
    _sweep_maps(stale, report)
    _sweep_children(stale, report)
    _flag_stuck(at, report)
    report["approval_reminders"] = approval_reminders_send()
    report["notifications"] = notifications_resend()
    report["callbacks"] = callbacks_resend()
    report["held_runs_released"] = held_runs_sweep()
    return report


def _late_runs(at) -> list:
    """Live runs past their deadline, but not one of the `pause` policy already paused with
    nothing left running (it waits for an operator: sweeping it again would change nothing).
    A paused run of the `fail` policy is timed out."""
    running = StepRun.objects.filter(run=OuterRef("pk"), state=StepState.RUNNING)
    late = Run.objects.filter(state__in=RUN_LIVE, deadline_at__lt=at).exclude(
        Q(state=RunState.PAUSED) & ~Exists(running)
        & ~Q(version__normalized__budget__on_duration="fail"))
    return list(late.values_list("id", flat=True)[:BATCH])


def _ids(**filters) -> list[int]:
    return list(StepRun.objects.filter(**filters).values_list("id", flat=True)[:BATCH])


def _sweep_maps(stale, report: dict) -> None:
    """Join a map whose chord callback was lost; recover items that died, overran or went missing."""
    for step_id in _ids(kind="map", state=StepState.WAITING):
        if MapItem.objects.filter(step_id=step_id, done=False).exists():
            report["items_resent"] += map_step.map_items_recover(step_id=step_id, stale_before=stale)
        else:
            report["joined"] += map_step.map_join(step_id=step_id, actor=REAPER)


def _sweep_compensations(stale, report: dict) -> None:
    """A compensating run whose worker died mid-way: send it again (the ledger dedupes)."""
    compensating = Run.objects.filter(state=RunState.COMPENSATING, progressed_at__lt=stale)
    for run_id, capacity in compensating.values_list("id", "capacity")[:BATCH]:
        with transaction.atomic():
            Run.objects.filter(id=run_id).update(progressed_at=now())
            compensate_on_commit(run_id, capacity=capacity)
        report["compensations"] += 1


def _sweep_children(stale, report: dict) -> None:
    """Carry a finished child into its parent step whose notice was lost, and create the child
    of a sub-workflow step whose `child_start` message was lost."""
    finished = Run.objects.filter(parent_step=OuterRef("pk"), state__in=RUN_TERMINAL)
    waiting = StepRun.objects.filter(kind="sub_workflow", state=StepState.WAITING)
    for step_id in waiting.filter(Exists(finished)).values_list("id", flat=True)[:BATCH]:
        report["children"] += sub_workflow.child_finished(parent_step_id=step_id)
    childless = waiting.filter(started_at__lt=stale).exclude(
        Exists(Run.objects.filter(parent_step=OuterRef("pk"))))
    for step_id in childless.values_list("id", flat=True)[:BATCH]:
        report["children_started"] += sub_workflow.child_run_start(parent_step_id=step_id)


def _flag_stuck(at, report: dict) -> None:
    """A running run with no progress past the threshold gets one `run.stuck` event."""
    flagged = Event.objects.filter(run=OuterRef("pk"), kind="run.stuck")
    stuck = Run.objects.filter(state=RunState.RUNNING, progressed_at__lt=at - STUCK_AFTER).exclude(Exists(flagged))
    for run in stuck[:BATCH]:
        with transaction.atomic():
            event_record(run=run, kind="run.stuck", actor=label(REAPER),
                         payload={"since": run.progressed_at.isoformat()})
        report["stuck"] += 1

