"""Forking a run: a new run of the same or another version of its workflow, started again from
a named step, with the steps before that carried over from the source run.

`run_fork` decides what the fork is and hands it to `run_start`, the one way a run starts (its
permission, admission, budgets, provenance, idempotency and version refusals apply unchanged):

- the fork step and every step downstream of it run again; so does a human gate right before a
  step that runs again (an approval binds to the run it was given in: the fork asks anew), with
  the steps downstream of that gate;
- every other step the source completed is carried into the fork completed, with its input and
  output, when each of its upstream steps is carried too: no model call, no cost, a
  `step.carried` event naming the source;
- an effect the source performed is never performed again: a step that runs again uses the
  source's idempotency key (`selectors.effect_key_of`), so the effect ledger returns the
  recorded outcome. Only a step named in `repeat_effects` acts again, audited with who and why,
  and never one behind a mandatory gate or a gate policy's gate that the fork does not ask
  again.

It must not run anything itself nor write a row: `run_start` creates the fork and its events.
"""
from collections.abc import Collection

from jsonschema import Draft202012Validator

from orchestrator.integrations.tools.registry import all_tools
from orchestrator.models import Run, RunSecret, StepRun, WorkflowVersion

from ..attestation import attestation_problem
from ..authz import Action, Actor, is_person, label, may, require
from ..definitions import TemplateError, render_value
from ..definitions.limits import run_input_problems
from ..definitions.mandatory_gates import performed_actions
from ..errors import InputInvalid, NotAllowed
from ..provenance import merged, person_entry
from ..scheduler import Graph, graph_of
from ..selectors import runs_with_version
from ..states import RunCapacity, StepState
from .gate_policies import gate_rules, url_params
from .runs import ForkOrigin, input_problems, run_start

FORKED = "forked it"  # the forker's role in the fork's provenance


def run_fork(*, run_id, step: str, actor: Actor, version: WorkflowVersion | int | None = None,
             input: dict | None = None, step_input: dict | None = None,
             repeat_effects: Collection[str] = (), reason: str = "",
             idempotency_key: str | None = None) -> Run:
    """Start a fork of run `run_id` from its step `step` (module docstring), on the source's
    version or `version` (a version, or its number, of the same workflow).

    `input` replaces the run's input (checked against the version's input_schema); `step_input`
    ({upstream step: output}) replaces what the fork step reads of those steps (checked against
    the step's `input_schema`, and a tool step's params against its tool's schema);
    `repeat_effects` names the steps whose effects are performed again, `reason` says why.
    With `idempotency_key`, the same fork asked again returns the first one (`run_start`).

    Raises Run.DoesNotExist for a run the actor may not see, Forbidden without run.start in its
    team (or for a version only an owner may start), InputInvalid (each problem by path,
    nothing created) for a bad step, version, input, step input or repeat_effects, NotAllowed
    for an effect to repeat behind a gate the fork does not ask again or for a sandboxed run
    (an evaluation's: its effects were the sandbox's answers), and whatever `run_start` raises.
    """
    source = runs_with_version().select_related("team").filter(id=run_id).first()
    if source is None or not may(actor, Action.VIEW, team=source.team):
        raise Run.DoesNotExist(f"run {run_id} not found")
    require(actor, Action.RUN_START, team=source.team)
    if source.sandbox is not None or source.capacity != RunCapacity.INTERACTIVE:
        # Its effects were a sandbox's answers: a live fork would take them as performed.
        raise NotAllowed(f"run {source.id} is an evaluation's sandboxed run: evaluate again "
                         "instead of forking it", [{"path": "run", "message": "sandboxed"}])
    target = _target_version(source, version)
    definition = target.normalized
    graph = graph_of(definition)
    if step not in graph.order:
        raise InputInvalid("no such step to fork from", [{"path": "step", "message": (
            f"version {target.number} of '{target.workflow.name}' has no step '{step}'")}])
    rerun = steps_run_again(graph, step)
    steps = {s.name: s for s in StepRun.objects.filter(run=source)}
    carried = _carried(graph, rerun, steps)
    if unattested := _unattested(steps, carried):
        # The fork signs each carried output anew: one whose record does not hold would come
        # out of it looking produced.
        raise NotAllowed("a step the fork would carry has an output that fails its attestation: "
                         "investigate the run first", unattested)
    run_input = source.input if input is None else input
    problems = _input_problems(source, input)
    problems += _step_input_problems(graph, step, step_input, run_input, carried)
    repeat = list(dict.fromkeys(repeat_effects))
    problems += _repeat_problems(graph, rerun, repeat)
    if problems:
        raise InputInvalid("the fork is invalid", problems)
    if refused := _gated_repeats(definition, graph, rerun, repeat, target):
        raise NotAllowed("a step whose effect is to be repeated sits behind a gate the fork "
                         "does not ask again: fork from that gate or before it", refused)
    edits = {"step_input": step_input or {}, "repeat_effects": repeat}
    events = [("run.forked", {"from_run": str(source.id), "step": step,
                              "version": target.number, "input_edited": input is not None,
                              "step_input_edited": sorted(step_input or {}),
                              "carried": sorted(carried)})]
    events += [("fork.effect_repeat", {"step": name, "by": label(actor), "reason": reason,
                                       "from_run": str(source.id)}) for name in repeat]
    fork = run_start(version=target, input=run_input, actor=actor,
                     idempotency_key=idempotency_key, trigger="fork",
                     provenance=_provenance(source, actor, step),
                     fork=ForkOrigin(source=source, step=step, edits=edits, events=events,
                                     carried={n: (steps[n].input, steps[n].output) for n in carried}))
    return fork


def steps_run_again(graph: Graph, step: str) -> frozenset[str]:
    """The steps a fork from `step` runs again: it and every step downstream of it, the human
    gates right before any of those (with the steps downstream of them), and the fallbacks of
    any of them."""
    again = {step}
    while True:
        grown = set(again)
        for name in graph.order:
            spec = graph.steps[name]
            if graph.ancestors[name] & again:
                grown.add(name)
            if name in again:
                grown.update(d for d in spec["after"] if graph.steps[d]["type"] == "human_gate")
                if graph.fallback_of.get(name):
                    grown.add(graph.fallback_of[name])
        if grown == again:
            return frozenset(again)
        again = grown


def _carried(graph: Graph, rerun: frozenset[str], steps: dict[str, StepRun]) -> list[str]:
    """The steps carried over: completed in the source, not run again, and every step upstream
    of them carried too (a step whose upstream runs again runs again)."""
    carried: list[str] = []
    for name in graph.order:
        source = steps.get(name)
        if (name not in rerun and source is not None and source.state == StepState.COMPLETED
                and source.kind == graph.steps[name]["type"]
                and all(a in carried for a in graph.ancestors[name])):
            carried.append(name)
    return carried


def _unattested(steps: dict[str, StepRun], carried: list[str]) -> list[dict]:
    """A problem per carried step whose output's record does not hold (engine/attestation.py)."""
    problems = []
    for name in carried:
        problem = attestation_problem(step_id=steps[name].id, output=steps[name].output,
                                      attestation=steps[name].attestation)
        if problem:
            problems.append({"path": f"steps.{name}", "message": problem})
    return problems


def _target_version(source: Run, version: WorkflowVersion | int | None) -> WorkflowVersion:
    workflow = source.version.workflow
    if version is None:
        return WorkflowVersion.objects.select_related("workflow__team").get(id=source.version_id)
    number = version.number if isinstance(version, WorkflowVersion) else version
    found = (WorkflowVersion.objects.select_related("workflow__team")
             .filter(workflow=workflow, number=number).first())
    if found is None or (isinstance(version, WorkflowVersion) and found.id != version.id):
        raise InputInvalid("no such version", [{"path": "version", "message": (
            f"workflow '{workflow.name}' has no version {number}")}])
    return found


def _input_problems(source: Run, input: dict | None) -> list[dict]:
    if input is not None:
        return []  # run_start checks it against the version's input_schema
    if RunSecret.objects.filter(run=source).exists():
        return [{"path": "input", "message": "the run's input holds secret values, which a fork "
                 "does not copy: give the whole input"}]
    return []


def _step_input_problems(graph: Graph, step: str, edits: dict | None, run_input: object,
                         carried: list[str]) -> list[dict]:
    if edits is None:
        return []
    if not isinstance(edits, dict):
        return [{"path": "step_input", "message": "an object of upstream step names to outputs"}]
    problems = [{"path": f"step_input.{name}", "message": f"not a step before '{step}'"}
                for name in edits if name not in graph.ancestors[step]]
    problems += [{"path": f"step_input{p['path'][len('input'):]}", "message": p["message"]}
                 for p in run_input_problems(edits)]
    if problems:
        return problems
    spec = graph.steps[step]
    if isinstance(spec.get("input_schema"), dict):
        # Its properties name upstream steps, each with what it requires of that step's output.
        wanted = spec["input_schema"].get("properties") or {}
        seen = {name: edits[name] for name in wanted if name in edits}
        problems += [{"path": f"step_input{p['path'][len('input'):]}", "message": p["message"]}
                     for p in input_problems(spec["input_schema"], seen)
                     if p["path"] != "input"]  # upstream outputs it does not edit are checked as they come
    tool = all_tools().get(spec.get("tool", "")) if spec["type"] == "tool" else None
    if tool is not None and isinstance(run_input, dict):
        upstream = {name: {"state": StepState.COMPLETED, "output": None} for name in carried}
        upstream |= {name: {"state": StepState.COMPLETED, "output": out} for name, out in edits.items()}
        try:
            params = render_value(spec.get("params") or {}, {"input": run_input, "steps": upstream})
        except TemplateError as exc:
            return problems + [{"path": "step_input", "message": f"the step's params cannot be "
                                f"rendered from it: {exc}"}]
        for error in Draft202012Validator(tool.params_schema).iter_errors(params):
            where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
            problems.append({"path": "step_input", "message": f"the step's params{where}: {error.message}"})
    return problems


def _repeat_problems(graph: Graph, rerun: frozenset[str], repeat: list[str]) -> list[dict]:
    problems = []
    for index, name in enumerate(repeat):
        at = f"repeat_effects[{index}]"
        if name not in graph.order:
            problems.append({"path": at, "message": f"no step '{name}'"})
        elif name not in rerun:
            problems.append({"path": at, "message": f"'{name}' does not run again in this fork: "
                             "it is carried over, nothing of it is performed"})
        elif not _has_effect(graph.steps[name]):
            problems.append({"path": at, "message": f"'{name}' performs no side effect"})
    return problems


def _has_effect(spec: dict) -> bool:
    item = spec.get("item") if spec["type"] == "map" else None
    return bool(spec.get("side_effect") or (isinstance(item, dict) and item.get("side_effect")))


def _gated_repeats(definition: dict, graph: Graph, rerun: frozenset[str], repeat: list[str],
                   version: WorkflowVersion) -> list[dict]:
    """One problem per step to repeat that a mandatory gate guards, or whose call a gate policy
    guards, when no such gate before it runs again in the fork (so nobody would approve the
    repeated effect)."""
    if not repeat:
        return []
    workflow = version.workflow
    rules = gate_rules(team_id=workflow.team_id, workflow_id=workflow.id)
    calls = performed_actions(definition, url_params)
    problems = []
    for index, name in enumerate(repeat):
        before = [g for g in graph.ancestors[name] if graph.steps[g]["type"] == "human_gate"]
        needed = [g for g in before if graph.steps[g].get("mandatory") is True
                  and name in (graph.steps[g].get("guards") or [])]
        for call in (c for c in calls if c.step == name):
            for rule in (r for r in rules if r.matches(call)):
                satisfying = [g for g in before if rule.satisfied_by(graph.steps[g])]
                if satisfying and not any(g in rerun for g in satisfying):
                    needed.append(sorted(satisfying)[0])
        missed = sorted({g for g in needed if g not in rerun})
        if missed:
            problems.append({"path": f"repeat_effects[{index}]", "message": (
                f"'{name}' sits behind gate {', '.join(repr(g) for g in missed)}, which this fork "
                "carries over instead of asking again")})
    return problems


def _provenance(source: Run, actor: Actor, step: str) -> dict:
    """The source's people (its input and its earlier steps are theirs) and the forker: none of
    them approves the fork's gates (separation of duties)."""
    people = list((source.provenance or {}).get("people") or [])
    if is_person(actor):
        people.append(person_entry(actor, FORKED))
    return {"path": "fork", "people": merged(people), "forked_from": str(source.id),
            "fork_step": step}
