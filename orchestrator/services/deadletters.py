"""Dead letters and the operator's ways back: redrive, retry, skip, resume.

Work that exhausts its retries lands in `DeadLetter` (with run, step, error class, attempts,
payload reference and trace id). Nothing leaves it by itself: redrive is an explicit,
permission-checked operation that re-checks the run's and step's state, relies on the effect
ledger so a redriven side effect is not repeated, and is recorded as an event (and so in the
audit ledger).
"""
from django.db import transaction

from ..clock import now
from ..dispatch import step_dispatch_on_commit
from ..events import event_record
from ..models import DeadLetter, Run, RunState, StepRun, StepState
from ..retry import StepError
from .advance import lock_run, run_advance
from .errors import NotAllowed

REDRIVABLE_KINDS = {"agent", "tool", "router"}


def dead_letter_open(*, run: Run, step: StepRun, error: StepError, actor: str) -> DeadLetter:
    """Record a step that failed for good (inside the failing transaction)."""
    letter = DeadLetter.objects.create(
        run=run, step=step, error_class=error.error_class, error_message=error.message[:2000],
        attempts=step.attempts, payload_ref=f"steprun:{step.id}/input", trace_id=str(run.id),
    )
    event_record(run=run, step=step, kind="step.dead_lettered", actor=actor,
                 payload={"dead_letter": letter.id, "class": error.error_class,
                          "attempts": step.attempts})
    return letter


def user_may_redrive(user) -> bool:
    return bool(user and user.is_authenticated and
                (user.is_superuser or user.has_perm("orchestrator.redrive_deadletter")))


def _requeue(run: Run, step: StepRun, *, actor: str, reason: str) -> None:
    """Put a failed step back on its queue and bring its run back to life (caller's txn)."""
    if step.kind not in REDRIVABLE_KINDS or not step.queue:
        raise NotAllowed(f"a {step.kind} step cannot be run again; its run must be restarted")
    if step.state not in (StepState.FAILED, StepState.TIMED_OUT):
        raise NotAllowed(f"step '{step.name}' is {step.state}, not failed")
    if run.state in (RunState.FAILED, RunState.TIMED_OUT):
        run.reopen()
        for cancelled in run.steps.filter(state=StepState.CANCELLED, skip_reason="run failed"):
            cancelled.reopen()
            cancelled.save()
            event_record(run=run, step=cancelled, kind="step.blocked", actor=actor)
    elif run.state == RunState.PAUSED:
        run.resume()
    elif run.state not in (RunState.RUNNING, RunState.WAITING):
        raise NotAllowed(f"run {run.id} is {run.state}; its steps cannot be redriven")
    run.save()
    event_record(run=run, kind=f"run.{run.state}", actor=actor, payload={"reason": reason})
    step.redrive(queue=step.queue)
    step.save()
    event_record(run=run, step=step, kind="step.queued", actor=actor, payload={"reason": reason})
    step_dispatch_on_commit(step.id, step.queue)


def dead_letter_redrive(*, dead_letter_id: int, user) -> DeadLetter:
    """Run a dead-lettered step again. Raises PermissionError or NotAllowed."""
    if not user_may_redrive(user):
        raise PermissionError("redrive needs the orchestrator.redrive_deadletter permission")
    with transaction.atomic():
        run_id = DeadLetter.objects.values_list("run_id", flat=True).get(id=dead_letter_id)
        run = lock_run(run_id)
        letter = DeadLetter.objects.select_related("step").get(id=dead_letter_id)
        if letter.status != DeadLetter.Status.OPEN:
            raise NotAllowed(f"dead letter {letter.id} was already redriven")
        actor = f"user:{user.username}"
        _requeue(run, letter.step, actor=actor, reason=f"redrive of dead letter {letter.id}")
        letter.status, letter.redriven_at, letter.redriven_by = DeadLetter.Status.REDRIVEN, now(), user
        letter.save()
        event_record(run=run, step=letter.step, kind="dead_letter.redriven", actor=actor,
                     payload={"dead_letter": letter.id})
    return letter


def step_skip(*, step_id: int, actor: str) -> StepRun:
    """An operator lets a paused run go on without its failed step."""
    with transaction.atomic():
        run = lock_run(StepRun.objects.values_list("run_id", flat=True).get(id=step_id))
        step = StepRun.objects.get(id=step_id)
        if run.state != RunState.PAUSED or step.state not in (StepState.FAILED, StepState.TIMED_OUT):
            raise NotAllowed("only a failed step of a paused run can be skipped")
        step.skip_failed(reason=f"skipped by {actor}")
        step.save()
        event_record(run=run, step=step, kind="step.skipped", actor=actor)
        run.resume()
        run.save()
        event_record(run=run, kind="run.running", actor=actor)
        run_advance(run, actor=actor)
    return step


def run_resume(*, run_id, actor: str) -> Run:
    """An operator resumes a paused run (e.g. after raising a budget or fixing a dependency)."""
    with transaction.atomic():
        run = lock_run(run_id)
        if run.state != RunState.PAUSED:
            raise NotAllowed(f"run {run.id} is {run.state}, not paused")
        failed = run.steps.filter(state__in=[StepState.FAILED, StepState.TIMED_OUT]).exists()
        if failed:
            raise NotAllowed("the run has failed steps: retry or skip them")
        run.resume()
        run.save()
        event_record(run=run, kind="run.running", actor=actor)
        run_advance(run, actor=actor)
    return run


def step_retry(*, step_id: int, actor: str) -> StepRun:
    """An operator retries a failed step of a paused (or failed) run."""
    with transaction.atomic():
        run = lock_run(StepRun.objects.values_list("run_id", flat=True).get(id=step_id))
        step = StepRun.objects.get(id=step_id)
        _requeue(run, step, actor=actor, reason="operator retry")
        step.dead_letters.filter(status=DeadLetter.Status.OPEN).update(status=DeadLetter.Status.REDRIVEN)
    return step
