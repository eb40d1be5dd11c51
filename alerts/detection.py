"""Finding the conditions alerts report: from the outbox, and from the clock.

`alerts_scan_events` reads the `orchestrator.models.Event` rows written since the last scan (its
`AlertCursor`), in id order, and raises an alert for each condition one reports: a run failed or
paused (by the budget gate or for an operator), a budget past its warning fraction or refusing a
step (the budget gate's `budget.warning` and `budget.denied` events, which carry the level and
the figures: `budgets.alerts`), work dead-lettered, a step retried more than its rule allows or
held back by an open circuit breaker, an output whose attestation failed, a run flagged stuck by the reaper, a run past its deadline.
`alerts_check_time` finds what no event reports: runs without progress, deadlines at risk or
passed, steps waiting too long in a queue. Both run from beat (`alerts.tasks.scan`) and only read
the engine's rows; every alert goes through `alerts.services.alert_raise`, whose unique key makes
a second sighting a no-op.
"""
import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction

from approvals.models import ApprovalRequest, ApprovalState
from budgets.alerts import KINDS as BUDGET_KINDS
from budgets.alerts import budget_alert
from orchestrator.engine.clock import now
from orchestrator.engine.states import RUN_LIVE, RunState, StepKind, StepState
from orchestrator.models import Event, Run, StepRun

from .models import AlertCursor, AlertRule
from .rules import DEFAULTS, RuleKind
from .services import alert_raise, rule_for

log = logging.getLogger(__name__)

CURSOR = "outbox"
BATCH = 500
BREAKER_MARK = "circuit open for "


def alerts_scan(*, at=None) -> dict:
    """One beat's work: the new outbox events, then the time-based conditions."""
    return {"events": alerts_scan_events(), **alerts_check_time(at=at)}


def alerts_scan_events(*, limit: int = BATCH) -> int:
    """Handle up to `limit` events after the cursor; returns how many alerts were raised.

    An event is handled once it is `STEPWISE_ALERTS_SETTLE_S` old, so a transaction that took an
    id earlier but committed later (PostgreSQL) is not passed over.
    """
    AlertCursor.objects.get_or_create(name=CURSOR)
    settled = now() - timedelta(seconds=settings.STEPWISE_ALERTS_SETTLE_S)
    raised = 0
    with transaction.atomic():
        cursor = AlertCursor.objects.select_for_update().get(name=CURSOR)
        events = (Event.objects.filter(id__gt=cursor.last_event_id, created_at__lte=settled)
                  .select_related("run__team", "run__version__workflow", "step")
                  .order_by("id")[:limit])
        for event in events:
            try:
                with transaction.atomic():
                    raised += _on_event(event)
            except Exception:  # one bad event must not stop every later alert
                log.exception("alerts: event %s (%s) could not be handled", event.id, event.kind)
            cursor.last_event_id = event.id
        cursor.updated_at = now()
        cursor.save()
    return raised


def _describe(run: Run) -> str:
    return f"run {run.pk} of {run.version.workflow.name} (team {run.team.slug})"


def _raise(kind: RuleKind, run: Run, key: str, subject: str, detail: str) -> int:
    body = (f"{subject}.\n\n{detail}\n\nRun: {run.pk}\nWorkflow: {run.version.workflow.name} "
            f"v{run.version.number}\nTeam: {run.team.slug}\nState: {run.state}")
    return 1 if alert_raise(kind, team=run.team, run=run, key=key, subject=subject,
                            body=body) else 0


def _message(payload: dict) -> str:
    if not isinstance(payload, dict):
        return ""
    return str(payload.get("message") or payload.get("reason") or "")


def _step_errors(run: Run) -> list[str]:
    broken = run.steps.filter(state__in=[StepState.FAILED, StepState.TIMED_OUT]).order_by("position")
    return [f"Step {step.name}: {(step.error or {}).get('class', step.state)}: {_message(step.error)}"
            for step in broken]


def _ended_by_decision(run: Run) -> bool:
    """Whether every step that failed the run is a human gate a person rejected (a gate
    rejected by its deadline policy is not: nobody decided, so operators hear of it)."""
    broken = list(run.steps.filter(state__in=[StepState.FAILED, StepState.TIMED_OUT])
                  .values_list("id", "kind", "error"))
    if not broken:
        return False
    if any(kind != StepKind.HUMAN_GATE or (error or {}).get("class") != "rejected"
           for _, kind, error in broken):
        return False
    rejected = ApprovalRequest.objects.filter(step_id__in=[pk for pk, *_ in broken],
                                              state=ApprovalState.REJECTED,
                                              decided_by__isnull=False)
    return rejected.count() == len(broken)


def _on_event(event: Event) -> int:
    run, kind, payload = event.run, event.kind, event.payload or {}
    short = str(run.pk)[:8]
    name = run.version.workflow.name
    if kind == "run.failed" and _ended_by_decision(run):
        return 0  # a reviewer said no: a decision the run's owner sees, not an incident
    if kind in ("run.failed", "run.compensation_failed"):
        return _raise(RuleKind.RUN_FAILED, run, f"run.failed:{run.pk}",
                      f"Run {short} of {name} failed",
                      "\n".join([_message(payload) or "The run failed.", *_step_errors(run)]))
    if kind == "run.timed_out":
        return _raise(RuleKind.DEADLINE_BREACHED, run, f"deadline.breached:{run.pk}",
                      f"Run {short} of {name} passed its deadline",
                      _message(payload) or "The run was timed out at its deadline.")
    if kind in BUDGET_KINDS:
        return int(budget_alert(kind=kind, run=run, key=payload["key"], level=payload["level"],
                                message=payload["message"]))
    if kind == "step.attestation_invalid" and event.step is not None:
        return _raise(RuleKind.ATTESTATION_INVALID, run,
                      f"step.attestation_invalid:{run.pk}:{event.step.name}",
                      f"Output of step {event.step.name} of run {short} failed its attestation",
                      f"{payload.get('problem', 'no valid attestation')}. The run is paused for "
                      "an investigation: nothing reads this output until an operator acts.")
    if kind == "run.paused":
        if payload.get("class") in ("budget", "attestation"):
            # The budget gate's `budget.denied` event raises the alert, with the level and the
            # figures; an attestation's, the step's `step.attestation_invalid`.
            return 0
        return _raise(RuleKind.RUN_PAUSED, run, f"run.paused:{run.pk}",
                      f"Run {short} of {name} is paused",
                      "\n".join([f"Reason: {_message(payload) or 'a step failed'}.",
                                 *_step_errors(run),
                                 "An operator may retry or skip the step, or resume the run."]))
    if kind == "run.stuck":
        return _raise(RuleKind.RUN_STUCK, run, f"run.stuck:{run.pk}",
                      f"Run {short} of {name} is stuck",
                      f"No progress since {payload.get('since', 'its last change')}.")
    if kind == "step.dead_lettered" and event.step is not None:
        return _raise(RuleKind.DEAD_LETTER, run, f"dead_letter.created:{run.pk}:{event.step.name}",
                      f"Step {event.step.name} of run {short} was dead-lettered",
                      _message(payload) or "Its retries are exhausted.")
    if kind in ("step.retrying", "step.failed") and event.step is not None:
        return _on_step_failure(event, run)
    return 0


def _on_step_failure(event: Event, run: Run) -> int:
    raised = 0
    step, message = event.step, _message(event.payload)
    short = str(run.pk)[:8]
    if message.startswith(BREAKER_MARK):
        dependency = message[len(BREAKER_MARK):]
        raised += _raise(RuleKind.BREAKER_OPENED, run,
                         f"breaker.opened:{run.pk}:{dependency}",
                         f"Circuit breaker open for {dependency}",
                         f"Step {step.name} of run {short} was held back: {message}.")
    if event.kind == "step.retrying":
        retries = Event.objects.filter(step=step, kind="step.retrying", id__lte=event.id).count()
        limit = rule_for(RuleKind.STEP_RETRIED, team=run.team,
                         workflow_id=run.version.workflow_id).threshold
        if limit is not None and retries > limit:
            raised += _raise(RuleKind.STEP_RETRIED, run, f"step.retried:{run.pk}:{step.name}",
                             f"Step {step.name} of run {short} retried {retries} times",
                             f"More than {limit:g} retries; the last error: {message}.")
    return raised


def _smallest(kind: RuleKind) -> float:
    """The smallest threshold any team set for `kind` (or the default): where a query for
    candidates starts; each candidate is then held to its own rule."""
    values = [DEFAULTS[kind].threshold or 0.0, *AlertRule.objects.filter(
        kind=kind, enabled=True, threshold__isnull=False).values_list("threshold", flat=True)]
    return min(values)


def alerts_check_time(*, at=None) -> dict:
    """Raise the alerts the clock decides: stuck runs, deadlines at risk or passed, old queues."""
    at = at or now()
    found = {"stuck": 0, "deadline": 0, "queue": 0}
    runs = Run.objects.select_related("team", "version__workflow")

    stuck_after = timedelta(seconds=_smallest(RuleKind.RUN_STUCK))
    for run in runs.filter(state=RunState.RUNNING, progressed_at__lt=at - stuck_after)[:BATCH]:
        threshold = _threshold(RuleKind.RUN_STUCK, run)
        if threshold is not None and run.progressed_at < at - timedelta(seconds=threshold):
            idle = (at - run.progressed_at).total_seconds()
            found["stuck"] += _raise(RuleKind.RUN_STUCK, run, f"run.stuck:{run.pk}",
                                     f"Run {str(run.pk)[:8]} of {run.version.workflow.name} is stuck",
                                     f"No progress for {idle:.0f}s (alert after {threshold:g}s).")

    for run in runs.filter(state__in=RUN_LIVE, deadline_at__isnull=False,
                           started_at__isnull=False)[:BATCH]:
        found["deadline"] += _deadline(run, at)

    waited = timedelta(seconds=_smallest(RuleKind.QUEUE_AGE))
    queued = (StepRun.objects.filter(state=StepState.QUEUED, queued_at__lt=at - waited)
              .select_related("run__team", "run__version__workflow").order_by("queued_at"))
    for step in queued[:BATCH]:
        threshold = _threshold(RuleKind.QUEUE_AGE, step.run)
        age = (at - step.queued_at).total_seconds()
        if threshold is not None and age > threshold:
            found["queue"] += _raise(
                RuleKind.QUEUE_AGE, step.run, f"queue.age:{step.run_id}:{step.queue}",
                f"Queue {step.queue}: a step waited {age:.0f}s",
                f"Step {step.name} of {_describe(step.run)} has waited in queue {step.queue} "
                f"for {age:.0f}s (alert after {threshold:g}s); are its workers running?")
    return found


def _threshold(kind: RuleKind, run: Run) -> float | None:
    rule = rule_for(kind, team=run.team, workflow_id=run.version.workflow_id)
    return rule.threshold if rule.enabled else None


def _deadline(run: Run, at) -> int:
    short, name = str(run.pk)[:8], run.version.workflow.name
    if run.deadline_at <= at:
        return _raise(RuleKind.DEADLINE_BREACHED, run, f"deadline.breached:{run.pk}",
                      f"Run {short} of {name} passed its deadline",
                      f"Its deadline was {run.deadline_at.isoformat()}.")
    share = _threshold(RuleKind.DEADLINE_AT_RISK, run)
    total = (run.deadline_at - run.started_at).total_seconds()
    used = (at - run.started_at).total_seconds()
    if share is None or total <= 0 or used < total * share:
        return 0
    return _raise(RuleKind.DEADLINE_AT_RISK, run, f"deadline.at_risk:{run.pk}",
                  f"Run {short} of {name} may miss its deadline",
                  f"{used / total:.0%} of its time is used; the deadline is "
                  f"{run.deadline_at.isoformat()} ({(run.deadline_at - at).total_seconds():.0f}s left).")
