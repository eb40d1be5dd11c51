"""Applying the scheduler's plan to a run: the one place where a run moves forward or ends.

`run_advance` runs inside the caller's transaction, with the run row locked (`lock_run`; or
inserted by that transaction, which no other sees before it commits: `run_start`), so
the plan is computed from, and applied to, one consistent snapshot; dispatch happens on commit.
It starts each step through its kind (`services.kinds`), and ends the run when the plan says
so (`run_finish`). A run that is cancelling ends here too, once nothing runs any more
(`run_settle_cancel`). Every service that ends a step reaches these through `step_end`.
"""
from collections.abc import Sequence
from datetime import timedelta

from budgets.services import budget_release, model_calls
from orchestrator.models import Event, Run, StepRun
from orchestrator.operations import tracing
from orchestrator.store import build_row, save_row

from ..attestation import attestation_problem, producer_of
from ..authz import SCHEDULER, Actor, label
from ..clock import now
from ..definitions import ExpressionError, evaluate_expression
from ..dispatch import child_finished_on_commit, compensate_on_commit, held_runs_release_on_commit
from ..events import event_record, events_record, run_ended_on_commit
from ..scheduler import StepView, current_iteration, iteration_name, plan
from ..selectors import compensable_steps, definition_of, steps_of
from ..states import (
    CONTROL_KINDS,
    RUN_ADVANCING,
    STEP_CANCELLABLE_NOW,
    STOPPED_BY_RUN_END,
    RunState,
    StepState,
)
from .attestations import output_attest
from .budget_gate import dispatch_reserve
from .kinds import Eager, handler_for


def run_advance(run: Run, *, actor: Actor = SCHEDULER, pending: Sequence[Event] = (),
                steps: Sequence[StepRun] | None = None, eager: Eager | None = None) -> object | None:
    """Compute and apply the next transitions of `run`. Must run inside transaction.atomic().

    `pending`: events of the change that led here (the step that just completed), not yet
    written: they are written first, in the same INSERT as the scheduler's batch.
    `steps`: every step of the run as this transaction holds it (`selectors.lock_run_with_steps`),
    when nothing changed a step behind these instances since: spares reading them again.
    `eager`: the worker whose transaction this is, offering to run one of the steps started
    here itself (eager dispatch). Returns what it took (at most one step's claim), else None.
    """
    if run.state not in RUN_ADVANCING:
        events_record(list(pending))
        return None
    with tracing.span("scheduler.advance", run=run.id):
        return _advance(run, actor=actor, pending=pending, steps=steps, eager=eager)


def _advance(run: Run, *, actor: Actor, pending: Sequence[Event] = (),
             steps: Sequence[StepRun] | None = None, eager: Eager | None = None) -> object | None:
    definition, graph = definition_of(run)
    steps = {s.name: s for s in (steps_of(run) if steps is None else steps)}
    views = {n: StepView(s.state, s.output) for n, s in steps.items()}
    decided = plan(definition, run.input, views, graph=graph)
    unattested = _unattested(graph, decided, steps)
    if unattested:
        run_pause_for_attestation(run, steps, unattested, actor=actor, pending=pending)
        return None
    events: list[Event] = list(pending)
    if pending and any(handler_for(graph.steps[n]["type"]).records_outside_the_batch
                       for n in decided.enqueue):
        # A step that records events of its own as it starts (a child run created): what led
        # here goes into the ledger before them.
        events_record(events)
        events = []
    dirty: dict[str, StepRun] = {}
    who = label(actor)

    def record(step: StepRun, kind: str, payload: dict | None = None, actor: str | None = None) -> None:
        dirty[step.name] = step
        events.append(build_row(Event, run=run, step=step, kind=kind, actor=actor or who, payload=payload or {}))

    for name, reason in decided.skip:
        steps[name].skip(reason=reason)
        record(steps[name], "step.skipped", {"reason": reason})
    for name, step_input in decided.ready:
        if name == run.fork_step and run.fork_edits.get("step_input"):
            step_input = fork_step_input(step_input, run.fork_edits["step_input"])
        steps[name].make_ready(step_input=step_input)
        record(steps[name], "step.ready")
    for name, message in decided.invalid:
        step = steps[name]
        step.make_ready(step_input={})
        step.fail(error={"class": "validation", "message": message})
        record(step, "step.failed", step.error)

    outcome, detail = decided.outcome, decided.detail
    taken = None
    for name in decided.enqueue:
        spec = graph.steps[name]
        step = steps[name]
        # Reserved before it is dispatched: a map one call per item, any other its next attempt.
        denial = (dispatch_reserve(run, step, spec, definition, attempt=1, items=_item_indexes(spec, step))
                  if spec["type"] == "map"
                  else dispatch_reserve(run, step, spec, definition, attempt=step.attempts + 1))
        if denial:
            outcome, detail = "pause", denial
            break
        handler = handler_for(spec["type"])
        if eager is not None and taken is None:
            taken = handler.start_offered(run, steps[name], spec, record, eager)
        else:
            handler.start(run, steps[name], spec, record)

    for step in dirty.values():
        if step.state == StepState.COMPLETED and step.attestation is None:
            # A step that completed as it started (a sleep already due, a buffered signal, an
            # empty map): this process produced its output.
            output_attest(run, step, producer=who, record=record)
        save_row(step)
    if decided.loops:
        events_record(events)  # before what the loops' next iterations record
        events = []
    for name, verdict, loop_detail in decided.loops:
        # A loop's iteration ended: it starts the next one, or ends (and stops what is left).
        handler_for(graph.steps[name]["type"]).progress(run, steps[name], verdict, loop_detail, actor=actor)
    started_control = any(graph.steps[n]["type"] in CONTROL_KINDS for n in decided.enqueue)
    if (started_control or decided.loops) and outcome != "pause":
        # A control step is now waiting, or finished as it started (an empty map, a bad child
        # input), or a loop moved on: the outcome computed before is stale, so plan again. This
        # batch's events are written with that plan's, in one INSERT.
        again = run_advance(run, actor=actor, pending=events, eager=None if taken else eager)
        return taken or again
    _apply_outcome(run, outcome, detail, actor=actor, pending=events)
    return taken


def _outputs_read(graph, decided, steps: dict[str, StepRun]) -> set[str]:
    """The completed steps whose outputs the plan reads to take its decisions: every upstream
    step of a step it makes ready (its input) or skips (its `when` condition reads any of them,
    its routers choose), the iterations a loop's `until` verdict reads (the one that ended and
    the one before it), and the sinks a completing run takes its output from; each with the
    fallback that stands in for it."""
    names: set[str] = set()
    for name, _ in [*decided.ready, *decided.skip]:
        names.update(_upstream(graph, name))
    for loop, _, _ in decided.loops:
        names.update(_iterations_read(graph, loop, steps))
    if decided.outcome == "complete":
        names.update(graph.sinks)
    names.update([graph.fallback_of[n] for n in names if n in graph.fallback_of])
    return {n for n in names if n in steps and steps[n].state == StepState.COMPLETED}


def _upstream(graph, name: str) -> set[str]:
    """The steps whose outputs the input of `name` holds; for a loop's iteration of a body step
    (`draft[2]`), the body steps before it in that iteration, the previous iteration's body
    steps (`iteration.previous`) and the loop's own upstream."""
    if name in graph.ancestors:
        return set(graph.ancestors[name])
    base, _, number = name.partition("[")
    for loop, body in graph.bodies.items():
        if base in body.ancestors:
            previous = int(number.rstrip("]")) - 1
            return ({f"{a}[{number}" for a in body.ancestors[base]} | set(graph.ancestors[loop])
                    | {iteration_name(b, previous) for b in body.order if previous > 0})
    return set()


def _iterations_read(graph, loop: str, steps: dict[str, StepRun]) -> set[str]:
    """The body steps of the iteration of `loop` that just ended and of the one before it: what
    its `until` verdict and its output read."""
    body = graph.bodies[loop]
    number = current_iteration(body, steps)
    return {iteration_name(b, n) for b in body.order for n in (number, number - 1) if n > 0}


def _unattested(graph, decided, steps: dict[str, StepRun]) -> dict[str, str]:
    """Step name -> why its output may not be read, for each output the plan reads whose
    attestation does not hold (engine/attestation.py)."""
    problems = {}
    for name in sorted(_outputs_read(graph, decided, steps)):
        step = steps[name]
        problem = attestation_problem(step_id=step.id, output=step.output,
                                      attestation=step.attestation)
        if problem:
            problems[name] = problem
    return problems


def run_pause_for_attestation(run: Run, steps: dict[str, StepRun], problems: dict[str, str], *,
                              actor: Actor, pending: Sequence[Event] = ()) -> None:
    """Nothing of the plan (or of a map's join) is applied: each step whose output failed its
    check is flagged (`step.attestation_invalid`, which raises an alert) and the run pauses for
    an operator."""
    who = label(actor)
    flags = []
    for name, problem in problems.items():
        producer, key = producer_of(steps[name].attestation)
        flags.append(build_row(Event, run=run, step=steps[name], kind="step.attestation_invalid",
                               actor=who, payload={"problem": problem, "producer": producer,
                                                   "key": key}))
    detail = {"class": "attestation",
              "message": "; ".join(f"step '{n}': {p}" for n, p in problems.items()),
              "steps": problems}
    _apply_outcome(run, "pause", detail, actor=actor, pending=[*pending, *flags])


def fork_step_input(step_input: dict, edits: dict) -> dict:
    """The input of a fork's fork step with the fork's edits: each upstream step it names is
    read as completed with the output the fork gave it (services/forks.py)."""
    upstream = dict(step_input.get("steps") or {})
    for name, output in edits.items():
        upstream[name] = {"state": StepState.COMPLETED, "output": output}
    return {**step_input, "steps": upstream}


def _item_indexes(spec: dict, step: StepRun) -> list[int]:
    """The items a map step is about to fan out (none when its `over` does not make a list:
    the map fails as it starts, and nothing is dispatched)."""
    if model_calls(spec) is None:
        return []
    try:
        items = evaluate_expression(spec["over"], step.input)
    except ExpressionError:
        return []
    return list(range(len(items))) if isinstance(items, list) else []


def _apply_outcome(run: Run, outcome: str | None, detail: dict, *, actor: Actor,
                   pending: list[Event]) -> None:
    """Apply the plan's outcome to the run; `pending`, the plan's events, are written first
    (with the run's own event, when it changes state, in the same INSERT)."""
    if outcome == "resume" and run.state == RunState.WAITING:
        run.resume()
    elif outcome == "wait" and run.state == RunState.RUNNING:
        run.wait()
    elif outcome == "pause":
        run.pause(reason=detail)
    else:
        events_record(pending)
        if outcome in ("complete", "fail"):
            run_finish(run, outcome=outcome, detail=detail, actor=actor)
        else:
            _note_progress(run)
        return
    save_row(run)
    events_record([*pending, build_row(Event, run=run, kind=f"run.{run.state}", actor=label(actor),
                                   payload=detail or {})])


# A run's progress time serves the stuck sweep (minutes: `reaper.STUCK_AFTER`) and the order of
# the operators' lists. Kept to the second, a chain's steps a few milliseconds apart write the
# run's row once a second instead of once a step.
PROGRESS_RESOLUTION = timedelta(seconds=1)


def _note_progress(run: Run) -> None:
    at = now()
    if at - run.progressed_at < PROGRESS_RESOLUTION:
        return
    run.progressed_at = at
    save_row(run, ["progressed_at"])


def run_finish(run: Run, *, outcome: str, detail: dict, actor: Actor) -> None:
    """End a run as completed or failed (inside the caller's transaction).

    A run that fails after effects that declare a compensation goes to `compensating` first.
    """
    if outcome == "complete":
        run.complete(output=detail)
    else:
        steps_stop(run, reason=STOPPED_BY_RUN_END[RunState.FAILED], actor=actor)
        if _has_compensations(run):
            run.compensate(error=detail)
            compensate_on_commit(run.id, capacity=run.capacity)
        else:
            run.fail(error=detail)
    save_row(run)
    event_record(run=run, kind=f"run.{run.state}", actor=label(actor), payload=detail)
    run_ended_notify(run)


def _has_compensations(run: Run) -> bool:
    _, graph = definition_of(run)
    if not any(s.get("compensate") for s in graph.steps.values()):
        return False
    return bool(compensable_steps(run, graph))


def run_ended_notify(run: Run) -> None:
    """A run that ended tells, after commit, whoever waits for its end: a child run the parent
    step waiting for it, a keyed run the runs held behind its key, an evaluation run
    `events.run_ended`'s receivers. Every path that ends a run calls this."""
    if not run.is_terminal:
        return
    if run.parent_step_id:
        child_finished_on_commit(run.parent_step_id)
    if run.concurrency_key:
        held_runs_release_on_commit(run.version.workflow_id, run.concurrency_key)
    run_ended_on_commit(run)


def steps_stop(run: Run, *, reason: str, actor: Actor) -> int:
    """Cancel every step of `run` that is not running, releasing what each owned (an open
    approval, a child run, map items); a running step stops at its next safe point.

    Returns how many steps are still running.
    """
    who = label(actor)
    # Locked as read: a worker moves a step under the step's row lock alone (not the run's), so
    # the cancel waits for such a move and reads the step as it left it, not as it was before.
    # Owners last: a loop's release stops the steps of its iteration, which must not be
    # cancelled a second time from this (then stale) list.
    stoppable = sorted(run.steps.filter(state__in=STEP_CANCELLABLE_NOW).order_by("id")
                       .select_for_update(of=("self",), no_key=True),
                       key=lambda s: s.kind in CONTROL_KINDS)
    for step in stoppable:
        step.cancel(reason=reason)
        save_row(step)
        event_record(run=run, step=step, kind="step.cancelled", actor=who, payload={"reason": reason})
        handler_for(step.kind).release(run, step, actor=actor)
        budget_release(step_id=step.id)
    return run.steps.filter(state=StepState.RUNNING).count()


def run_settle_cancel(run: Run, *, running: int | None = None, actor: Actor) -> None:
    """Finish cancelling once no step is running any more."""
    if run.state != RunState.CANCELLING:
        return
    if running is None:
        running = run.steps.filter(state=StepState.RUNNING).count()
    if running == 0:
        run.cancel()
        save_row(run)
        event_record(run=run, kind="run.cancelled", actor=label(actor))
        run_ended_notify(run)
