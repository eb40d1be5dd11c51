"""The scheduler: a pure function of (definition, persisted run state) -> next actions.

It reads no database, sends no message and knows no clock; its state names are those of
`orchestrator.engine.states`. `orchestrator.engine.services.scheduling` loads the state, calls
`plan`, and applies the result in one transaction. Keeping it pure is what lets the same persisted
state always select the same next transitions, and lets the tests walk every branch without a
worker.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .definitions import ExpressionError, TemplateError, evaluate_expression, render_value
from .states import STEP_ACTIVE as ACTIVE
from .states import STEP_BROKEN as BROKEN
from .states import STEP_TERMINAL as TERMINAL
from .states import StepState

BLOCKED, READY, QUEUED = StepState.BLOCKED, StepState.READY, StepState.QUEUED
WAITING, COMPLETED, FAILED = StepState.WAITING, StepState.COMPLETED, StepState.FAILED
SKIPPED, TIMED_OUT = StepState.SKIPPED, StepState.TIMED_OUT
# What a wait step that timed out gives the steps after it, when its timeout continues or routes.
TIMED_OUT_OUTPUT = {"timed_out": True}
PENDING = "pending"  # effective state of a broken step whose fallback has not finished


@dataclass(frozen=True)
class StepView:
    state: str
    output: object = None


@dataclass
class Plan:
    """What should happen next. Lists are in definition order."""

    ready: list[tuple[str, dict]] = field(default_factory=list)  # blocked -> ready, with input
    skip: list[tuple[str, str]] = field(default_factory=list)  # blocked -> skipped, with reason
    invalid: list[tuple[str, str]] = field(default_factory=list)  # condition could not be evaluated
    enqueue: list[str] = field(default_factory=list)  # ready -> queued (within max_parallel)
    outcome: str | None = None  # complete | fail | pause | wait | resume
    detail: dict = field(default_factory=dict)  # output for complete, error for fail/pause
    # (loop, verdict, detail) for each loop whose current iteration ended: "next" (detail:
    # {"iteration": n}), "complete" (detail: the loop's output) or "fail" (detail: the error).
    loops: list[tuple[str, str, dict]] = field(default_factory=list)


class StepSpecs(dict):
    """Step name -> normalized spec. A loop body step's run `draft[2]` (iteration 2 of body
    step `draft`) resolves to the spec of `draft`, so every `graph.steps[step.name]` in the
    engine finds the spec of an iteration's step as of any other."""

    def __missing__(self, key: str) -> dict:
        base, bracket, _ = key.partition("[")
        if bracket and base in self:
            return self[base]
        raise KeyError(key)


def iteration_name(step: str, number: int) -> str:
    """The step run of iteration `number` (1-based) of loop body step `step`."""
    return f"{step}[{number}]"


def current_iteration(body: Graph, views: Mapping[str, object]) -> int:
    """The newest iteration of a loop whose step runs exist (0: none yet). An iteration's step
    runs are created together, so its first body step tells."""
    first, number = body.order[0], 0
    while iteration_name(first, number + 1) in views:
        number += 1
    return number


@dataclass(frozen=True)
class Graph:
    order: tuple[str, ...]  # topological, stable w.r.t. the definition's order
    steps: Mapping[str, dict]
    ancestors: Mapping[str, frozenset[str]]
    fallback_of: Mapping[str, str]  # primary -> its fallback step
    fallback_for: Mapping[str, str]  # fallback step -> its primary
    sinks: tuple[str, ...]
    bodies: Mapping[str, Graph] = field(default_factory=dict)  # loop step -> its body's graph


def graph_of(definition: dict) -> Graph:
    """Derive the DAG structure of a normalized definition (and of each loop's body)."""
    steps = StepSpecs((s["name"], s) for s in definition["steps"])
    order: list[str] = []
    placed: set[str] = set()
    remaining = [s["name"] for s in definition["steps"]]
    while remaining:
        progressed = [n for n in remaining if set(steps[n]["after"]) <= placed]
        if not progressed:  # validation rejects cycles; refuse rather than loop forever
            raise ValueError(f"definition has a cycle among {remaining}")
        for n in progressed:
            order.append(n)
            placed.add(n)
        remaining = [n for n in remaining if n not in placed]
    ancestors: dict[str, frozenset[str]] = {}
    for n in order:
        acc: set[str] = set()
        for dep in steps[n]["after"]:
            acc.add(dep)
            acc |= ancestors[dep]
        ancestors[n] = frozenset(acc)
    fallback_of = {n: s["fallback"] for n, s in steps.items() if s.get("fallback")}
    fallback_for = {fb: n for n, fb in fallback_of.items()}
    depended = {d for s in steps.values() for d in s["after"]}
    sinks = tuple(n for n in order if n not in depended and n not in fallback_for)
    bodies = {n: graph_of({"steps": s["body"]}) for n, s in steps.items() if s["type"] == "loop"}
    for body in bodies.values():
        steps.update(body.steps)  # body step names are unique in the whole definition
    return Graph(tuple(order), steps, ancestors, fallback_of, fallback_for, sinks, bodies)


def step_input(graph: Graph, name: str, run_input: dict, views: Mapping[str, StepView],
               scope: dict | None = None) -> dict:
    """The input of a step: the run input plus every upstream step's output, by name (plus
    `scope`: a loop body step's `iteration`)."""
    upstream = {}
    for anc in sorted(graph.ancestors[name]):
        state, output = _effective(graph, anc, views)
        upstream[anc] = {"state": state, "output": output}
    return {"input": run_input, "steps": upstream, **(scope or {})}


def timeout_route(spec: dict) -> str | None:
    """The step a wait step routes its timeout to (its `on_timeout` names one), or None."""
    target = spec.get("on_timeout") if spec["type"] == "wait" else None
    return target if target not in (None, "fail", "continue") else None


def _effective(graph: Graph, name: str, views: Mapping[str, StepView]) -> tuple[str, object]:
    """A broken step rescued by its fallback counts as completed with the fallback's output; a
    wait step that timed out and routes its timeout, as completed with TIMED_OUT_OUTPUT."""
    view = views[name]
    if view.state == TIMED_OUT and timeout_route(graph.steps[name]):
        return COMPLETED, TIMED_OUT_OUTPUT
    fallback = graph.fallback_of.get(name)
    if view.state in BROKEN and fallback:
        fb = views[fallback]
        if fb.state == COMPLETED:
            return COMPLETED, fb.output
        return (view.state, None) if fb.state in TERMINAL else (PENDING, None)
    return view.state, view.output


def _route_skip_reason(graph: Graph, name: str, views: Mapping[str, StepView]) -> str | None:
    for dep in graph.steps[name]["after"]:
        router = graph.steps[dep]
        if target := timeout_route(router):
            # A wait step routes: its timeout to `target` alone, its signal to the others.
            timed_out = views[dep].state == TIMED_OUT
            if name == target and not timed_out:
                return f"'{dep}' received its signal"
            if name != target and timed_out:
                return f"'{dep}' timed out: routed to '{target}'"
            continue
        if router["type"] != "router" or views[dep].state != COMPLETED:
            continue
        routes = [*router["routes"], router["default"]]
        targeted = {t for r in routes for t in r["then"]}
        if name not in targeted:
            continue
        chosen = (views[dep].output or {}).get("route")
        chosen_then = next((r["then"] for r in routes if r["name"] == chosen), [])
        if name not in chosen_then:
            return f"not on route '{chosen}' chosen by '{dep}'"
    return None


def _readiness(graph: Graph, name: str, on_error: str, views: Mapping[str, StepView]):
    """Return ("wait"|"skip"|"go", reason) for a blocked step."""
    primary = graph.fallback_for.get(name)
    if primary is not None:
        p = views[primary].state
        if p == COMPLETED or p == SKIPPED:
            return "skip", f"primary step '{primary}' did not fail"
        if p not in BROKEN:
            return "wait", ""
    deps = graph.steps[name]["after"]
    effective = {d: _effective(graph, d, views)[0] for d in deps}
    if any(s not in TERMINAL for s in effective.values()):
        return "wait", ""
    broken = [d for d, s in effective.items() if s in BROKEN]
    if broken and on_error != "continue":
        return "wait", ""  # the run's error policy decides; nothing downstream starts
    completed = [d for d, s in effective.items() if s == COMPLETED]
    if graph.steps[name]["join"] == "any":
        if deps and not completed:
            return "skip", "no upstream step completed"
    elif len(completed) != len(deps):
        missing = next(d for d in deps if d not in completed)
        return "skip", f"upstream step '{missing}' did not complete"
    reason = _route_skip_reason(graph, name, views)
    if reason:
        return "skip", reason
    return "go", ""


def _decide_blocked(graph: Graph, name: str, on_error: str, run_input: dict,
                    working: dict[str, StepView], scope: dict | None, result: Plan) -> bool:
    """Skip, ready or invalidate the blocked step `name` if it can be decided now (recording the
    verdict in `result` and `working`). True when the step ended here (skipped or failed), which
    may decide a step looked at before it; a step made ready decides no other (readiness needs
    ended dependencies, a fallback an ended primary), and one that must wait changes nothing."""
    verdict, reason = _readiness(graph, name, on_error, working)
    if verdict == "wait":
        return False
    if verdict == "skip":
        result.skip.append((name, reason))
        working[name] = StepView(SKIPPED)
        return True
    inp = step_input(graph, name, run_input, working, scope)
    condition = graph.steps[name].get("when")
    if condition:
        try:
            holds = evaluate_expression(condition, inp)
        except ExpressionError as exc:
            result.invalid.append((name, f"condition could not be evaluated: {exc}"))
            working[name] = StepView(FAILED)
            return True
        if holds is not True:
            result.skip.append((name, f"condition is false: {condition}"))
            working[name] = StepView(SKIPPED)
            return True
    result.ready.append((name, inp))
    working[name] = StepView(READY)
    return False


def plan(definition: dict, run_input: dict, views: Mapping[str, StepView], *, graph: Graph | None = None,
         scope: dict | None = None) -> Plan:
    """Compute the next actions for a running (or waiting) run.

    `views` maps every step run's name to its persisted state and output (a loop's iterations
    as `draft[1]`, `draft[2]`, ...). Never raises for a `when` that cannot be evaluated: that
    step is reported in `Plan.invalid`.
    """
    graph = graph or graph_of(definition)
    on_error = definition["on_error"]
    working = dict(views)
    result = Plan()
    # Until no step ends: a step's verdict can follow from one that ended later in the order
    # (a fallback listed before its primary, skipped once that primary is; a step after a failed
    # primary, which waits for the fallback decided after it). Each pass ends at least one
    # blocked step or is the last, so there are at most as many passes as steps.
    ended = True
    while ended:
        ended = False
        for name in graph.order:
            if working[name].state == BLOCKED and _decide_blocked(
                    graph, name, on_error, run_input, working, scope, result):
                ended = True

    order: list[str] = []
    for name in graph.order:
        order.append(name)
        if name in graph.bodies and working[name].state == WAITING:
            order.extend(_plan_iteration(graph, name, run_input, working, result))

    active = sum(1 for v in working.values() if v.state in ACTIVE)
    room = max(definition["max_parallel"] - active, 0)
    result.enqueue = [n for n in order if working[n].state == READY][:room]
    for n in result.enqueue:
        working[n] = StepView(QUEUED)

    _decide_outcome(graph, on_error, working, result)
    return result


def _plan_iteration(graph: Graph, loop: str, run_input: dict, working: dict[str, StepView],
                    result: Plan) -> list[str]:
    """Plan the current iteration of a waiting loop like a small workflow of its own (its body
    fails on the first broken step), and decide the loop's verdict once the iteration ended.

    Returns the iteration's step run names, in body order.
    """
    spec, body = graph.steps[loop], graph.bodies[loop]
    number = current_iteration(body, working)
    if number == 0:
        return []
    names = {b: iteration_name(b, number) for b in body.order}
    try:
        context = iteration_context(graph, loop, run_input, working, number)
    except TemplateError as exc:
        result.loops.append((loop, "fail", {"class": "validation", "message": f"loop input: {exc}"}))
        return list(names.values())
    local = {b: working[n] for b, n in names.items()}
    inner = plan({"on_error": "fail", "max_parallel": len(names)}, run_input, local, graph=body,
                 scope={"iteration": context})
    for b, reason in inner.skip:
        result.skip.append((names[b], reason))
        working[names[b]] = StepView(SKIPPED)
    for b, message in inner.invalid:
        result.invalid.append((names[b], message))
        working[names[b]] = StepView(FAILED)
    for b, inp in inner.ready:
        result.ready.append((names[b], inp))
        working[names[b]] = StepView(READY)
    if inner.outcome == "fail":
        error = {**inner.detail, "class": "iteration_failed", "iteration": number,
                 "message": f"iteration {number}: {inner.detail['message']}"}
        if "step" in error:
            error["step"] = names[error["step"]]
        result.loops.append((loop, "fail", error))
    elif inner.outcome == "complete":
        steps = {b: {"state": working[n].state, "output": working[n].output} for b, n in names.items()}
        result.loops.append((loop, *_loop_verdict(spec, run_input, steps, context)))
    return list(names.values())


def iteration_context(graph: Graph, loop: str, run_input: dict, views: Mapping[str, StepView],
                      number: int) -> dict:
    """`iteration` as a loop's body and `until` read it: its number (from 1), the loop's
    `input` rendered from the loop's upstream steps, and the previous iteration's body steps
    ({} in the first). Raises TemplateError for an input that cannot be rendered."""
    body = graph.bodies[loop]
    previous = {}
    if number > 1:
        for b in body.order:
            view = views[iteration_name(b, number - 1)]
            previous[b] = {"state": view.state, "output": view.output}
    loop_input = render_value(graph.steps[loop]["input"], step_input(graph, loop, run_input, views))
    return {"number": number, "input": loop_input, "previous": previous}


def _loop_verdict(spec: dict, run_input: dict, steps: dict, context: dict) -> tuple[str, dict]:
    number = context["number"]
    try:
        holds = evaluate_expression(spec["until"], {"input": run_input, "steps": steps, "iteration": context})
    except ExpressionError as exc:
        return "fail", {"class": "validation", "message": f"until could not be evaluated: {exc}",
                        "iteration": number}
    if holds is True:
        last = {b: s["output"] for b, s in steps.items() if s["state"] == COMPLETED}
        return "complete", {"iterations": number, "last": last}
    if number >= spec["max_iterations"]:
        return "fail", {"class": "loop_exhausted", "iterations": number,
                        "message": f"until did not hold after {number} iterations (max_iterations)"}
    return "next", {"iteration": number + 1}


def _decide_outcome(graph: Graph, on_error: str, working: Mapping[str, StepView], result: Plan) -> None:
    broken = [
        n for n in graph.order
        if working[n].state in BROKEN and _effective(graph, n, working)[0] in BROKEN
        and n not in graph.fallback_for  # a failed fallback is reported through its primary
    ]
    if broken and on_error == "fail":
        first = broken[0]
        result.outcome = "fail"
        result.detail = {
            "class": "step_failed",
            "message": f"step '{first}' ended {working[first].state}",
            "step": first,
        }
        return
    if broken and on_error == "pause":
        first = broken[0]
        result.outcome = "pause"
        result.detail = {"class": "step_failed", "message": f"step '{first}' ended {working[first].state}; run paused for an operator", "step": first}
        return
    states = {v.state for v in working.values()}
    if states <= TERMINAL:
        result.outcome = "complete"
        result.detail = {n: working[n].output for n in graph.sinks if working[n].state == COMPLETED}
        return
    if states & (ACTIVE | {READY}):
        result.outcome = "resume"
        return
    if WAITING in states:
        result.outcome = "wait"
        return
    result.outcome = "fail"
    result.detail = {"class": "deadlock", "message": "no step can make progress"}
