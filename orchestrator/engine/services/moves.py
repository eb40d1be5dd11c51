"""Moving unfinished runs to another version of their workflow: the dry run (`runs_move_plan`)
and the move itself (`runs_move`).

A run is pinned to the version it started on, and every worker interprets it under that
version. A move repoints the pin explicitly, audited, for runs whose persisted state means the
same under the target: each step of the run is mapped to the target's by name, and a run is
refused when the target would reinterpret something that has already happened or is
happening — a step the run completed or waits at that is missing or of another kind there, a
completed step's output the target's output schema rejects, a started step the target puts
after a step that has not run, a step in flight on a worker, an input the target's input
schema rejects. The target must also pass the refusal that starting a run of it passes
(`runs.version_start_refusal`: mandatory gates, gate policies, release policy), so a move is no
way around authority. A waiting human gate whose bound action (or whose own definition)
changes under the target has its request cancelled and asks a new decision.

The move writes rows (the run's pin, the steps' rows) and its event under the run's lock, then
lets the scheduler go on under the new version. It decides nothing the scheduler decides.
"""
import copy
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import timedelta

from django.core.exceptions import ValidationError
from django.db import transaction
from jsonschema import Draft202012Validator

from approvals.actions import gate_action
from approvals.models import ApprovalRequest, ApprovalState
from approvals.services import approval_request_close, approval_request_open
from orchestrator.integrations.tools.registry import get_tool
from orchestrator.models import Run, StepRun, WorkflowVersion
from orchestrator.store import insert_rows, save_row

from ..authz import Action, Actor, label, require, visible
from ..clock import now
from ..definitions.gates import gate_binding
from ..errors import InputInvalid
from ..events import event_record
from ..output_schemas import strict
from ..scheduler import Graph, StepView, graph_of, step_input
from ..secret_inputs import MARKER_KEY
from ..selectors import definition_of, lock_run, runs_with_version, steps_of
from ..states import RUN_LIVE, RUN_TERMINAL, STEP_ACTIVE, STEP_TERMINAL, StepKind, StepState
from .runs import input_problems, version_start_refusal
from .scheduling import run_advance

#: The most runs one request may move (or plan to move).
MAX_RUNS = 500
MAX_REASON = 2000

KEPT, ADDED, REMOVED = "kept", "added", "removed"


@dataclass
class StepMapping:
    """How one step of the run maps to the target version, by name."""

    name: str
    change: str  # kept | added | removed
    state: str = ""  # the run's step's state ("" for a step the target adds)
    kind_from: str = ""
    kind_to: str = ""
    definition: str = ""  # same | changed ("" when one side has no such step)
    output_schema: str = ""  # same | changed | "" (neither side declares one)
    input_schema: str = ""  # same | changed | ""
    outcome: str = ""  # what the move does to it, in words


@dataclass
class MovePlan:
    """One run's dry run: whether it moves, how its steps map, and why not."""

    run: str
    workflow: str
    from_version: int
    to_version: int
    state: str
    movable: bool = False
    refusals: list[dict] = field(default_factory=list)  # [{"code", "message", "path"}]
    steps: list[StepMapping] = field(default_factory=list)
    gates_asked_again: list[str] = field(default_factory=list)
    # Not part of the answer: what applying needs.
    _drop: list[int] = field(default_factory=list, repr=False)
    _regate: dict = field(default_factory=dict, repr=False)  # gate name -> its input under the target

    def refuse(self, code: str, message: str, path: str = "") -> None:
        self.refusals.append({"code": code, "message": message, "path": path})

    def as_dict(self) -> dict:
        answer = {k: v for k, v in asdict(self).items() if not k.startswith("_")}
        answer["steps"] = [asdict(s) for s in self.steps]
        return answer


def runs_move_plan(*, run_ids: Iterable, version: WorkflowVersion, actor: Actor) -> list[MovePlan]:
    """The dry run of moving `run_ids` to `version`: a `MovePlan` per run, in the order given.
    Changes nothing.

    Raises Run.DoesNotExist naming the runs `actor` cannot see (another team's, or none),
    Forbidden without run.move in a run's team, InputInvalid for no runs or too many.
    """
    runs = _runs(run_ids, actor)
    version = _with_definition(version)
    return [_plan(run, version, actor, steps_of(run)) for run in runs]


def runs_move(*, run_ids: Iterable, version: WorkflowVersion, actor: Actor, reason: str) -> list[MovePlan]:
    """Move the runs of `run_ids` that can move to `version`, each in a transaction of its own
    under its lock, planned again there from what is persisted then; the others are refused
    with their reasons (their plans, `movable` false). Returns a `MovePlan` per run: what was
    done or refused.

    A moved run is pinned to `version`; its steps' rows follow the target (a step the target
    adds is a new blocked row, a removed one that never started is dropped, a kept one takes
    its new position — and kind, if it never started); a waiting gate whose bound action
    changed has its request cancelled and a new one opened; a `run.moved` event (in the audit
    ledger) says from, to, the mapping, who and why; then the scheduler moves the run on.

    Raises what `runs_move_plan` raises, and InputInvalid without a reason.
    """
    reason = (reason or "").strip()
    if not reason:
        raise InputInvalid("say why the runs are moved", [{"path": "reason", "message": "required"}])
    if len(reason) > MAX_REASON:
        raise InputInvalid("the reason is too long", [{"path": "reason", "message": f"at most {MAX_REASON} characters"}])
    runs = _runs(run_ids, actor)
    version = _with_definition(version)
    return [_move_one(run.id, version, actor, reason) for run in runs]


def _runs(run_ids: Iterable, actor: Actor) -> list[Run]:
    ids = list(dict.fromkeys(str(i) for i in run_ids))
    if not ids:
        raise InputInvalid("name at least one run", [{"path": "runs", "message": "empty"}])
    if len(ids) > MAX_RUNS:
        raise InputInvalid(f"at most {MAX_RUNS} runs at once", [{"path": "runs", "message": f"at most {MAX_RUNS}"}])
    try:
        found = {str(r.id): r for r in visible(runs_with_version().select_related("team")
                                               .filter(id__in=ids), actor)}
    except ValidationError as exc:  # a malformed id: no such run
        raise Run.DoesNotExist(f"no such run among {', '.join(ids)}") from exc
    missing = [i for i in ids if i not in found]
    if missing:
        raise Run.DoesNotExist(f"no such run: {', '.join(missing)}")
    for run in found.values():
        require(actor, Action.RUN_MOVE, team=run.team)
    return [found[i] for i in ids]


def _with_definition(version: WorkflowVersion) -> WorkflowVersion:
    return WorkflowVersion.objects.select_related("workflow", "workflow__team").get(id=version.id)


def _move_one(run_id, version: WorkflowVersion, actor: Actor, reason: str) -> MovePlan:
    with transaction.atomic():
        run = lock_run(run_id)
        steps = steps_of(run)
        plan = _plan(run, version, actor, steps)
        if not plan.movable:
            return plan
        _apply(run, version, plan, steps, actor=actor, reason=reason)
    return plan


# --- planning -------------------------------------------------------------------------------


def _plan(run: Run, target: WorkflowVersion, actor: Actor, steps: list[StepRun]) -> MovePlan:
    source = run.version
    plan = MovePlan(run=str(run.id), workflow=source.workflow.name, from_version=source.number,
                    to_version=target.number, state=run.state)
    if target.workflow_id != source.workflow_id:
        plan.refuse("other_workflow", f"version {target.number} is of workflow "
                    f"'{target.workflow.name}', not of the run's '{source.workflow.name}'", "version")
        return plan
    if target.id == source.id:
        plan.refuse("same_version", f"the run is on version {target.number} already", "version")
        return plan
    if run.state in RUN_TERMINAL:
        plan.refuse("finished", f"the run has ended ({run.state}): only an unfinished run moves")
        return plan
    if run.state not in RUN_LIVE:
        plan.refuse("not_live", f"the run is {run.state}: it ends by itself, nothing moves it")
        return plan
    if run.sandbox is not None:
        plan.refuse("sandboxed", "the run is part of an evaluation, which measures the version it "
                    "started on: it is not moved")
        return plan
    refusal = version_start_refusal(target, actor)
    if refusal is not None:
        plan.refuse("version_refused", str(refusal), "version")
        for problem in refusal.problems:
            plan.refuse("version_refused", problem["message"], problem["path"])
    for problem in _input_problems(target.normalized["input_schema"], run.input):
        plan.refuse("input_invalid", f"the run's input fails version {target.number}'s "
                    f"input_schema: {problem['message']}", problem["path"])

    _, old_graph = definition_of(run)
    new_graph = graph_of(target.normalized)
    rows = {s.name: s for s in steps}
    views = {s.name: StepView(s.state, s.output) for s in steps}
    for step in steps:
        if step.state in STEP_ACTIVE:
            plan.refuse("in_flight", f"step '{step.name}' is {step.state} on a worker: move the run "
                        "once it has ended", f"steps.{step.name}")
        elif step.state == StepState.WAITING and step.kind == StepKind.MAP:
            plan.refuse("in_flight", f"map step '{step.name}' has items on workers: move the run "
                        "once it has ended", f"steps.{step.name}")

    listed = set()
    for spec in target.normalized["steps"]:
        name = spec["name"]
        listed.add(name)
        row = rows.get(name)
        if row is None:
            plan.steps.append(StepMapping(name, ADDED, kind_to=spec["type"],
                                          output_schema="changed" if spec.get("output_schema") else "",
                                          input_schema="changed" if spec.get("input_schema") else "",
                                          outcome="added: runs when the steps before it have"))
            continue
        plan.steps.append(_kept(plan, run, row, old_graph, new_graph, views, target))
    for step in steps:
        if step.name in listed:
            continue
        base = step.name.partition("[")[0]
        if base != step.name and base in new_graph.steps:  # an iteration of a loop's body step
            plan.steps.append(_kept(plan, run, step, old_graph, new_graph, views, target))
            continue
        mapping = StepMapping(step.name, REMOVED, state=step.state, kind_from=step.kind)
        if step.state == StepState.BLOCKED:
            mapping.outcome = "dropped: it had not started"
            plan._drop.append(step.id)
        else:
            mapping.outcome = "refused: the run has reached it"
            plan.refuse("step_missing", f"step '{step.name}' is {step.state} and version "
                        f"{target.number} has no such step", f"steps.{step.name}")
        plan.steps.append(mapping)
    _check_order(plan, rows, new_graph, target)
    plan.movable = not plan.refusals
    return plan


def _kept(plan: MovePlan, run: Run, row: StepRun, old_graph: Graph, new_graph: Graph,
          views: dict, target: WorkflowVersion) -> StepMapping:
    old, new = old_graph.steps[row.name], new_graph.steps[row.name]
    mapping = StepMapping(row.name, KEPT, state=row.state, kind_from=row.kind, kind_to=new["type"],
                          definition=_compare(old, new),
                          output_schema=_compare_key(old, new, "output_schema"),
                          input_schema=_compare_key(old, new, "input_schema"))
    where = f"steps.{row.name}"
    started = row.state != StepState.BLOCKED
    if row.kind != new["type"]:
        if started:
            mapping.outcome = "refused: its kind changed after it started"
            plan.refuse("kind_changed", f"step '{row.name}' is {row.state} as a {row.kind} step; "
                        f"in version {target.number} it is a {new['type']} step", where)
            return mapping
        mapping.outcome = f"becomes a {new['type']} step"
        return mapping
    if row.state == StepState.COMPLETED:
        problems = _output_problems(new, row.output)
        if problems:
            mapping.outcome = "refused: its output fails the new output schema"
            for problem in problems:
                plan.refuse("output_invalid", f"the output of completed step '{row.name}' fails "
                            f"version {target.number}'s schema: {problem}", where)
            return mapping
        mapping.outcome = "kept: its output stands"
        if row.kind == StepKind.HUMAN_GATE:
            _approved_gate(plan, row, new_graph, views, target)
    elif row.state == StepState.WAITING and row.kind == StepKind.HUMAN_GATE:
        mapping.outcome = _gate(plan, run, row, new, new_graph, views, target,
                                changed=mapping.definition == "changed")
    elif row.state == StepState.WAITING and mapping.definition == "changed":
        mapping.outcome = "refused: it waits, and its definition changed"
        plan.refuse("waiting_changed", f"step '{row.name}' waits ({row.kind}) and version "
                    f"{target.number} defines it differently: move the run once it has ended", where)
    elif row.state in STEP_TERMINAL:
        mapping.outcome = f"kept: {row.state}"
    elif row.state == StepState.WAITING:
        mapping.outcome = "kept: waits on"
    else:
        mapping.outcome = "kept: runs under the new definition when it is reached"
    return mapping


def _gate(plan: MovePlan, run: Run, row: StepRun, spec: dict, graph: Graph, views: dict,
          target: WorkflowVersion, *, changed: bool) -> str:
    """A waiting gate: the action its approval binds under the target, against its request's."""
    approval = (ApprovalRequest.objects.filter(step=row, state=ApprovalState.PENDING)
                .order_by("-id").first())
    if approval is None:
        return "kept: waits on"
    moved = copy.copy(run)
    moved.version = target
    if not graph.ancestors[row.name] <= set(views):
        return "refused: the target adds steps before it"  # the order check says which
    gate = copy.copy(row)
    gate.input = step_input(graph, row.name, run.input, views)
    try:
        bound = gate_action(run=moved, gate=gate, spec=spec)
    except Exception as exc:  # a proposal the target cannot bind: nothing to approve
        plan.refuse("gate_unbound", f"gate '{row.name}' cannot bind its action under version "
                    f"{target.number}: {exc}", f"steps.{row.name}")
        return "refused: its action cannot be bound"
    if bound.hash == approval.proposal_hash and tuple(approval.guarded_steps) == bound.guarded \
            and not changed:
        return "kept: its request stands (same action)"
    plan.gates_asked_again.append(row.name)
    plan._regate[row.name] = gate.input
    return "asks a new decision: the action it approves changed"


def _approved_gate(plan: MovePlan, row: StepRun, graph: Graph, views: dict,
                   target: WorkflowVersion) -> None:
    """An approved gate guards, under the target, only the steps its approval named: a step the
    target puts behind it that has not run would run on an approval nobody gave for it."""
    approval = (ApprovalRequest.objects.filter(step=row, state=ApprovalState.APPROVED)
                .order_by("-id").first())
    if approval is None:
        return
    guarded = gate_binding(row.name, graph.steps, graph.ancestors).guarded
    unapproved = [name for name in guarded if name not in approval.guarded_steps
                  and views.get(name, StepView(StepState.BLOCKED)).state == StepState.BLOCKED]
    if unapproved:
        plan.refuse("approval_scope", f"gate '{row.name}' was approved for "
                    f"{', '.join(approval.guarded_steps) or 'no step'}; version {target.number} "
                    f"puts {', '.join(unapproved)} behind it too, which nobody approved",
                    f"steps.{row.name}")


def _check_order(plan: MovePlan, rows: dict, graph: Graph, target: WorkflowVersion) -> None:
    """A step that has started must come, in the target, only after steps that have ended: a
    step added (or moved) before it would run after it."""
    for name, row in rows.items():
        if row.state == StepState.BLOCKED or name not in graph.ancestors:
            continue
        for before in sorted(graph.ancestors[name]):
            earlier = rows.get(before)
            if earlier is None:
                plan.refuse("order", f"version {target.number} adds step '{before}' before step "
                            f"'{name}', which is {row.state} already", f"steps.{before}")
            elif earlier.state not in STEP_TERMINAL:
                plan.refuse("order", f"version {target.number} puts step '{name}' ({row.state}) "
                            f"after step '{before}', which has not run ({earlier.state})",
                            f"steps.{name}")


def _compare(old: dict, new: dict) -> str:
    return "same" if old == new else "changed"


def _compare_key(old: dict, new: dict, key: str) -> str:
    if not old.get(key) and not new.get(key):
        return ""
    return "same" if old.get(key) == new.get(key) else "changed"


def _output_problems(spec: dict, output: object) -> list[str]:
    """How a completed step's output fails what the target declares of it: its output_schema
    (checked strictly, as the executors check it), or its tool's."""
    schemas = [strict(spec["output_schema"])] if spec.get("output_schema") else []
    if spec["type"] == StepKind.TOOL:
        try:
            tool_schema = get_tool(spec["tool"]).output_schema
        except KeyError:
            tool_schema = None
        if tool_schema:
            schemas.append(tool_schema)
    problems = []
    for schema in schemas:
        for error in Draft202012Validator(schema).iter_errors(output):
            where = "/".join(map(str, error.absolute_path)) or "(root)"
            problems.append(f"{where}: {error.message}")
    return problems


def _input_problems(schema: dict, value: dict) -> list[dict]:
    """`input_problems`, leaving out the secret values (stored sealed, a marker in their
    place), which the schema cannot see."""
    hidden = []

    def walk(node, path):
        if isinstance(node, dict):
            if set(node) == {MARKER_KEY}:
                hidden.append(path)
                return
            for key, item in node.items():
                walk(item, f"{path}.{key}")
        elif isinstance(node, list):
            for i, item in enumerate(node):
                walk(item, f"{path}[{i}]")

    walk(value, "input")
    return [p for p in input_problems(schema, value)
            if not any(p["path"] == h or p["path"].startswith((h + ".", h + "[")) for h in hidden)]


# --- applying -------------------------------------------------------------------------------


def _apply(run: Run, target: WorkflowVersion, plan: MovePlan, steps: list[StepRun], *,
           actor: Actor, reason: str) -> None:
    """Under the run's lock, with `plan` made there: repoint the pin, follow the steps, record
    the move, ask again what changed, and let the scheduler go on."""
    who = label(actor)
    source = run.version
    if plan._drop:
        StepRun.objects.filter(id__in=plan._drop).delete()
    positions = {spec["name"]: i for i, spec in enumerate(target.normalized["steps"])}
    kept = {s.name: s for s in steps if s.id not in plan._drop}
    for step in kept.values():
        base = step.name.partition("[")[0]
        position = positions.get(step.name, positions.get(_loop_of(target, base), step.position))
        kind = target.normalized["steps"][positions[step.name]]["type"] if step.name in positions else step.kind
        if (position, kind) != (step.position, step.kind):
            step.position, step.kind = position, kind
            save_row(step, ["position", "kind"])
    insert_rows([StepRun(run=run, name=spec["name"], kind=spec["type"], position=positions[spec["name"]])
                 for spec in target.normalized["steps"] if spec["name"] not in kept])
    run.version = target
    save_row(run, ["version"])
    event_record(run=run, kind="run.moved", actor=who, payload={
        "from": {"version": source.number, "digest": source.digest},
        "to": {"version": target.number, "digest": target.digest},
        "reason": reason,
        "steps": [{"name": s.name, "change": s.change, "outcome": s.outcome} for s in plan.steps],
        "gates_asked_again": plan.gates_asked_again,
    })
    _, graph = definition_of(run)
    for name in plan.gates_asked_again:
        _ask_again(run, kept[name], graph.steps[name], plan._regate[name], actor=actor)
    run_advance(run, actor=actor)


def _loop_of(target: WorkflowVersion, body_step: str) -> str:
    """The top-level loop whose body holds `body_step` ("" when none)."""
    for spec in target.normalized["steps"]:
        if spec["type"] == StepKind.LOOP and any(b["name"] == body_step for b in spec.get("body") or []):
            return spec["name"]
    return ""


def _ask_again(run: Run, step: StepRun, spec: dict, step_input_: dict, *, actor: Actor) -> None:
    """Cancel the gate's request and open one bound to the action the new version approves,
    with a full deadline of its own."""
    approval_request_close(run=run, step=step, actor=actor)
    step.input = step_input_
    step.deadline_at = now() + timedelta(seconds=spec["timeout_s"])
    save_row(step, ["input", "deadline_at"])

    who = label(actor)

    def record(step: StepRun, kind: str, payload: dict | None = None, actor: str | None = None) -> None:
        event_record(run=run, step=step, kind=kind, actor=actor or who, payload=payload or {})

    approval_request_open(run=run, step=step, spec=spec, record=record)

