"""An operator's actions on runs: redrive a dead letter, retry or skip a failed step, resume,
raise a run's budget.

The API, the admin and any later entry point call these; each checks the actor's permission
in the run's team (`authz`), re-checks the run's and step's state under the run's lock, and is
recorded as events (and so in the audit ledger). A redriven or retried side effect is not
repeated: the effect ledger returns what it did the first time.
"""
from datetime import timedelta
from decimal import Decimal

from django.db import transaction

from budgets.services import override_record
from orchestrator.models import DeadLetter, Run, StepRun

from ..authz import Action, Actor, label, person, require
from ..clock import now
from ..errors import NotAllowed
from ..events import event_record
from ..selectors import lock_run, lock_run_of_step
from ..states import STEP_RECOVERABLE, RunState
from .kinds.worker import step_requeue
from .scheduling import run_advance


def dead_letter_redrive(*, dead_letter_id: int, actor: Actor) -> DeadLetter:
    """Run a dead-lettered step again. Raises Forbidden without the dead_letter.redrive
    permission in the run's team, NotAllowed if it was redriven already or cannot run again."""
    with transaction.atomic():
        run = lock_run(DeadLetter.objects.values_list("run_id", flat=True).get(id=dead_letter_id))
        require(actor, Action.DEAD_LETTER_REDRIVE, team=run.team)
        letter = DeadLetter.objects.select_related("step").get(id=dead_letter_id)
        if letter.status != DeadLetter.Status.OPEN:
            raise NotAllowed(f"dead letter {letter.id} was already redriven")
        step_requeue(run, letter.step, actor=actor, reason=f"redrive of dead letter {letter.id}")
        letter.status, letter.redriven_at = DeadLetter.Status.REDRIVEN, now()
        letter.redriven_by = person(actor)
        letter.save()
        event_record(run=run, step=letter.step, kind="dead_letter.redriven", actor=label(actor),
                     payload={"dead_letter": letter.id})
    return letter


def step_retry(*, step_id: int, actor: Actor) -> StepRun:
    """Run a failed step of a paused (or failed) run again; its open dead letters are closed.
    Raises Forbidden or NotAllowed."""
    with transaction.atomic():
        run, step = lock_run_of_step(step_id)
        require(actor, Action.STEP_RETRY, team=run.team)
        step_requeue(run, step, actor=actor, reason="operator retry")
        step.dead_letters.filter(status=DeadLetter.Status.OPEN).update(status=DeadLetter.Status.REDRIVEN)
    return step


def step_skip(*, step_id: int, actor: Actor) -> StepRun:
    """Let a paused run go on without its failed step. Raises Forbidden or NotAllowed."""
    with transaction.atomic():
        run, step = lock_run_of_step(step_id)
        require(actor, Action.STEP_SKIP, team=run.team)
        if run.state != RunState.PAUSED or step.state not in STEP_RECOVERABLE:
            raise NotAllowed("only a failed step of a paused run can be skipped")
        who = label(actor)
        step.skip_failed(reason=f"skipped by {who}")
        step.save()
        event_record(run=run, step=step, kind="step.skipped", actor=who)
        run.resume()
        run.save()
        event_record(run=run, kind="run.running", actor=who)
        run_advance(run, actor=actor)
    return step


def run_resume(*, run_id, actor: Actor) -> Run:
    """Resume a paused run (after raising a budget, fixing a dependency...). Raises Forbidden,
    or NotAllowed if it is not paused or still has failed steps (retry or skip them first)."""
    with transaction.atomic():
        run = lock_run(run_id)
        require(actor, Action.RUN_RESUME, team=run.team)
        if run.state != RunState.PAUSED:
            raise NotAllowed(f"run {run.id} is {run.state}, not paused")
        if run.steps.filter(state__in=STEP_RECOVERABLE).exists():
            raise NotAllowed("the run has failed steps: retry or skip them")
        run.resume()
        run.save()
        event_record(run=run, kind="run.running", actor=label(actor))
        run_advance(run, actor=actor)
    return run


def run_budget_raise(*, run_id, reason: str, actor: Actor, max_cost_usd: Decimal | None = None,
                     max_duration_s: int | None = None, resume: bool = True) -> Run:
    """Raise one run's cost limit, its duration limit (seconds from its start), or both — an
    override stored on the run; its definition is unchanged — and, with `resume`, resume it if
    it is paused. A raised duration moves the run's deadline, so the reaper leaves it running.
    Raises Forbidden without budget.raise in the run's team, NotAllowed for an ended run, an
    empty reason or nothing to raise, ValidationError for a negative amount."""
    with transaction.atomic():
        run = lock_run(run_id)
        require(actor, Action.BUDGET_RAISE, team=run.team)
        if run.is_terminal:
            raise NotAllowed(f"run {run.id} is {run.state}; its budget can no longer change")
        if not reason.strip():
            raise NotAllowed("say why the budget is raised")
        if max_cost_usd is None and max_duration_s is None:
            raise NotAllowed("say what to raise: max_cost_usd, max_duration_s or both")
        override = override_record(
            run=run, reason=reason, actor=actor, max_duration_s=max_duration_s,
            max_cost_usd=None if max_cost_usd is None else Decimal(str(max_cost_usd)))
        raised = {"reason": reason}
        if override.max_cost_usd is not None:
            raised["max_cost_usd"] = str(override.max_cost_usd)
        if override.max_duration_s is not None:
            raised["max_duration_s"] = override.max_duration_s
            if run.started_at:
                run.deadline_at = run.started_at + timedelta(seconds=override.max_duration_s)
                run.save(update_fields=["deadline_at"])
        event_record(run=run, kind="budget.overridden", actor=label(actor), payload=raised)
        if resume and run.state == RunState.PAUSED and not run.steps.filter(state__in=STEP_RECOVERABLE).exists():
            run.resume()
            run.save()
            event_record(run=run, kind="run.running", actor=label(actor))
            run_advance(run, actor=actor)
    return run
