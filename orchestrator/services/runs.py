"""Starting, finishing, timing out and cancelling runs."""
from datetime import timedelta

from django.db import IntegrityError, transaction
from jsonschema import Draft202012Validator

from ..clock import now
from ..definitions.limits import run_input_problems
from ..dispatch import child_finished_on_commit, compensate_on_commit
from ..events import event_record
from ..models import RUN_LIVE, Run, RunState, StepRun, StepState, WorkflowVersion
from .advance import cancel_open_steps, lock_run, run_advance
from .errors import IdempotencyConflict, InputInvalid, NotAllowed
from .versions import definition_of
from .workflows import digest_of


def input_problems(schema: dict, value: object) -> list[dict]:
    """Every way `value` violates `schema`, as [{"path", "message"}] (path like input.a[0])."""
    problems = []
    for error in sorted(Draft202012Validator(schema).iter_errors(value), key=lambda e: list(e.absolute_path)):
        path = "input"
        for part in error.absolute_path:
            path += f"[{part}]" if isinstance(part, int) else f".{part}"
        problems.append({"path": path, "message": error.message})
    return problems


def run_start(*, version: WorkflowVersion, input: dict, user=None, idempotency_key: str | None = None,
              parent_step: StepRun | None = None, trigger: str = "api") -> Run:
    """Create a run pinned to `version`, start it, and schedule its first steps.

    With `idempotency_key`, the same key and input return the existing run; the same key with
    another input raises IdempotencyConflict. Raises InputInvalid (and creates nothing) when the
    input does not satisfy the workflow's input_schema. Check `run._created` to tell apart.
    """
    problems = run_input_problems(input) or input_problems(version.normalized["input_schema"], input)
    if problems:
        raise InputInvalid("run input is invalid", problems)
    team = version.workflow.team
    request_digest = digest_of(
        {"workflow": version.workflow.name, "version": version.number, "input": input})
    if idempotency_key:
        existing = _idempotent_replay(team.id, idempotency_key, request_digest)
        if existing:
            return existing
    try:
        with transaction.atomic():
            run = _create(version, input, user, idempotency_key, request_digest, parent_step, trigger)
    except IntegrityError:
        existing = idempotency_key and _idempotent_replay(team.id, idempotency_key, request_digest)
        if not existing:
            raise
        return existing
    run._created = True
    return run


def _idempotent_replay(team_id: int, key: str, request_digest: str) -> Run | None:
    run = Run.objects.filter(team_id=team_id, idempotency_key=key).first()
    if run is None:
        return None
    if run.request_digest != request_digest:
        raise IdempotencyConflict(
            f"Idempotency-Key '{key}' was already used with a different request (run {run.id})"
        )
    run._created = False
    return run


def _create(version, input, user, idempotency_key, request_digest, parent_step, trigger) -> Run:
    run = Run.objects.create(
        team=version.workflow.team, version=version, input=input, created_by=user,
        idempotency_key=idempotency_key or None, request_digest=request_digest,
        parent_step=parent_step, trigger=trigger,
    )
    StepRun.objects.bulk_create(
        StepRun(run=run, name=s["name"], kind=s["type"], position=i)
        for i, s in enumerate(version.normalized["steps"])
    )
    actor = f"user:{user.username}" if user else f"service:{trigger}"
    event_record(run=run, kind="run.created", actor=actor,
                 payload={"workflow": version.workflow.name, "version": version.number,
                          "trigger": trigger})
    run.start()
    max_duration = (version.normalized.get("budget") or {}).get("max_duration_s")
    if max_duration:
        run.deadline_at = run.started_at + timedelta(seconds=max_duration)
    run.save()
    event_record(run=run, kind="run.running", actor=actor)
    run = lock_run(run.id)
    run_advance(run)
    return run


def run_finish(run: Run, *, outcome: str, detail: dict, actor: str) -> None:
    """End a run as completed or failed (inside the caller's transaction).

    A run that fails after effects that declare a compensation goes to `compensating` first.
    """
    if outcome == "complete":
        run.complete(output=detail)
    else:
        cancel_open_steps(run, reason="run failed", actor=actor)
        if _has_compensations(run):
            run.compensate(error=detail)
            compensate_on_commit(run.id)
        else:
            run.fail(error=detail)
    run.save()
    event_record(run=run, kind=f"run.{run.state}", actor=actor, payload=detail)
    if run.parent_step_id and run.is_terminal:
        child_finished_on_commit(run.parent_step_id)


def _has_compensations(run: Run) -> bool:
    from .compensation import compensable_steps  # compensation imports this module (via steps)

    _, graph = definition_of(run)
    if not any(s.get("compensate") for s in graph.steps.values()):
        return False
    return bool(compensable_steps(run, graph))


def run_time_out(*, run_id, actor: str = "service:reaper") -> bool:
    """End a live run past its wall-clock budget. False if it is not live or not late."""
    with transaction.atomic():
        run = lock_run(run_id)
        if run.state not in RUN_LIVE or not run.deadline_at or run.deadline_at > now():
            return False
        cancel_open_steps(run, reason="run timed out", actor=actor)
        run.time_out(error={"class": "timeout", "message": "the run exceeded budget.max_duration_s"})
        run.save()
        event_record(run=run, kind="run.timed_out", actor=actor, payload=run.error)
        if run.parent_step_id:
            child_finished_on_commit(run.parent_step_id)
    return True


def run_cancel(*, run_id, actor: str) -> Run:
    """Cancel a run cooperatively: nothing new starts, running steps finish, then `cancelled`.

    Raises NotAllowed for a run that has already ended.
    """
    with transaction.atomic():
        run = lock_run(run_id)
        if run.is_terminal:
            raise NotAllowed(f"run {run.id} has already ended ({run.state})")
        if run.state == RunState.PENDING:
            run.cancel()
        elif run.state != RunState.CANCELLING:
            run.request_cancel()
        run.save()
        event_record(run=run, kind=f"run.{run.state}", actor=actor)
        _cancel_children(run, actor=actor)
        running = cancel_open_steps(run, reason="run cancelled", actor=actor)
        run_settle_cancel(run, running=running, actor=actor)
    return run


def _cancel_children(run: Run, *, actor: str) -> None:
    from approvals.services import approvals_cancel_for_run

    approvals_cancel_for_run(run=run, actor=actor)
    children = Run.objects.filter(parent_step__run=run).exclude(
        state__in=[RunState.CANCELLED, RunState.COMPLETED, RunState.FAILED, RunState.TIMED_OUT]
    )
    for child_id in children.values_list("id", flat=True):
        run_cancel(run_id=child_id, actor=actor)


def run_settle_cancel(run: Run, *, running: int | None = None, actor: str) -> None:
    """Finish cancelling once no step is running any more."""
    if run.state != RunState.CANCELLING:
        return
    if running is None:
        running = run.steps.filter(state=StepState.RUNNING).count()
    if running == 0:
        run.cancel()
        run.save()
        event_record(run=run, kind="run.cancelled", actor=actor)
        if run.parent_step_id:
            child_finished_on_commit(run.parent_step_id)

