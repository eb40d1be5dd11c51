"""Applying the scheduler's plan to a run: the one place where a run moves forward.

`run_advance` runs inside the caller's transaction, with the run row locked (`lock_run`), so
the plan is computed from, and applied to, one consistent snapshot. Dispatch happens on
commit. Called by run_start and by every service that finishes a step.
"""
from budgets.services import budget_denial

from ..clock import now
from ..definitions import ExpressionError, evaluate_expression, render_value
from ..dispatch import map_dispatch_on_commit, queue_for, step_dispatch_on_commit
from ..events import event_record, events_record
from ..models import Event, MapItem, Run, RunState, StepRun, StepState
from ..scheduler import StepView, plan
from .versions import definition_of, runs_with_version

# Kinds the orchestrator starts itself, without a worker: they wait for an event.
CONTROL_KINDS = {"human_gate", "sub_workflow", "map"}


def lock_run(run_id) -> Run:
    """Fetch a run with its row locked for the rest of the transaction (PostgreSQL).

    SQLite has no row locks; there IMMEDIATE transactions serialize writers instead.
    """
    return runs_with_version().select_for_update(of=("self",), no_key=True).get(id=run_id)


def run_advance(run: Run, *, actor: str = "service:scheduler") -> None:
    """Compute and apply the next transitions of `run`. Must run inside transaction.atomic()."""
    if run.state not in (RunState.RUNNING, RunState.WAITING):
        return
    definition, graph = definition_of(run)
    steps = {s.name: s for s in run.steps.all()}
    views = {n: StepView(s.state, s.output) for n, s in steps.items()}
    decided = plan(definition, run.input, views, graph=graph)
    events: list[Event] = []
    dirty: dict[str, StepRun] = {}

    def record(step: StepRun, kind: str, payload: dict | None = None) -> None:
        dirty[step.name] = step
        events.append(Event(run=run, step=step, kind=kind, actor=actor, payload=payload or {}))

    for name, reason in decided.skip:
        steps[name].skip(reason=reason)
        record(steps[name], "step.skipped", {"reason": reason})
    for name, step_input in decided.ready:
        steps[name].make_ready(step_input=step_input)
        record(steps[name], "step.ready")
    for name, message in decided.invalid:
        step = steps[name]
        step.make_ready(step_input={})
        step.fail(error={"class": "validation", "message": message})
        record(step, "step.failed", step.error)

    outcome, detail = decided.outcome, decided.detail
    for name in decided.enqueue:
        step, spec = steps[name], graph.steps[name]
        denial = budget_denial(run=run, definition=definition, spec=spec)
        if denial:
            outcome, detail = "pause", denial
            break
        _start(run, step, spec, record)

    for step in dirty.values():
        step.save()
    events_record(events)
    started_control = any(graph.steps[n]["type"] in CONTROL_KINDS for n in decided.enqueue)
    if started_control and outcome != "pause":
        # A control step is now waiting, or finished as it started (an empty map, a bad child
        # input): the outcome computed before it started is stale, so plan again.
        run_advance(run, actor=actor)
        return
    _apply_outcome(run, outcome, detail, actor=actor)


def _start(run: Run, step: StepRun, spec: dict, record) -> None:
    if spec["type"] not in CONTROL_KINDS:
        queue = queue_for(spec)
        step.enqueue(queue=queue)
        record(step, "step.queued", {"queue": queue})
        step_dispatch_on_commit(step.id, queue)
        return
    if spec["type"] == "human_gate":
        from approvals.services import approval_open

        step.await_event(timeout_s=spec["timeout_s"])
        record(step, "step.waiting", {"for": "approval"})
        step.save()
        approval_open(run=run, step=step, spec=spec)
    elif spec["type"] == "sub_workflow":
        step.await_event(timeout_s=spec["timeout_s"])
        record(step, "step.waiting", {"for": "sub_workflow"})
        step.save()
        _start_child(run, step, spec, record)
    else:
        _start_map(run, step, spec, record)


def _start_child(run: Run, step: StepRun, spec: dict, record) -> None:
    from .errors import InputInvalid
    from .runs import run_start
    from .workflows import latest_version

    version = latest_version(team=run.team, name=spec["workflow"])
    try:
        child_input = render_value(spec["input"], step.input)
        if version is None:
            raise InputInvalid(f"workflow '{spec['workflow']}' does not exist")
        child = run_start(version=version, input=child_input, parent_step=step,
                          trigger="sub_workflow", user=run.created_by)
    except Exception as exc:  # a bad child input is this step's classified failure
        step.fail(error={"class": "validation", "message": str(exc)})
        record(step, "step.failed", step.error)
        return
    record(step, "step.child_started", {"child_run": str(child.id)})


def _start_map(run: Run, step: StepRun, spec: dict, record) -> None:
    try:
        items = evaluate_expression(spec["over"], step.input)
        if not isinstance(items, list):
            raise ExpressionError(f"'over' must produce a list, got {type(items).__name__}")
    except ExpressionError as exc:
        step.await_event(timeout_s=spec["timeout_s"])
        step.fail(error={"class": "validation", "message": str(exc)})
        record(step, "step.failed", step.error)
        return
    step.await_event(timeout_s=spec["timeout_s"])
    if not items:
        step.complete(output=[] if spec["merge"] == "list" else {})
        record(step, "step.completed", {"items": 0})
        return
    step.save()
    at = now()
    MapItem.objects.bulk_create(MapItem(step=step, index=i, item=it, due_at=at, sent_at=at)
                                for i, it in enumerate(items))
    record(step, "step.waiting", {"for": "map", "items": len(items)})
    map_dispatch_on_commit(step.id, list(range(len(items))), queue_for(spec["item"]))


def _apply_outcome(run: Run, outcome: str | None, detail: dict, *, actor: str) -> None:
    from .runs import run_finish

    if outcome == "resume" and run.state == RunState.WAITING:
        run.resume()
    elif outcome == "wait" and run.state == RunState.RUNNING:
        run.wait()
    elif outcome == "pause":
        run.pause(reason=detail)
    elif outcome in ("complete", "fail"):
        run_finish(run, outcome=outcome, detail=detail, actor=actor)
        return
    else:
        run.progressed_at = now()
        run.save(update_fields=["progressed_at"])
        return
    run.save()
    event_record(run=run, kind=f"run.{run.state}", actor=actor, payload=detail or {})


def cancel_open_steps(run: Run, *, reason: str, actor: str) -> int:
    """Cancel every step that has not started running; running steps stop at a safe point.

    Returns how many steps are still running.
    """
    events = []
    still_running = 0
    for step in run.steps.filter(state__in=[StepState.BLOCKED, StepState.READY, StepState.QUEUED,
                                            StepState.RETRYING, StepState.WAITING]):
        step.cancel(reason=reason)
        step.save()
        events.append(Event(run=run, step=step, kind="step.cancelled", actor=actor,
                            payload={"reason": reason}))
    still_running = run.steps.filter(state=StepState.RUNNING).count()
    events_record(events)
    return still_running
