"""What a gate's approval binds: the canonical action, its hash, and what it will do.

* `gate_action` — when a gate starts waiting: the action its approval will authorize
  (`orchestrator.engine.definitions.gates` says which), hashed with `orchestrator.engine.hashing`;
  for a typed proposal the hash is the proposal's own (`proposal_hash`).
* `gate_output` — what the gate step outputs once approved; `undecided_output` is the same
  without the decision's own fields (the note, who decided), which are not part of the action.
* `action_edited` — a reviewer's changed parameters, re-validated against the action's schema,
  re-hashed (and a proposal's risk re-assessed).
* `action_drift` — right before a guarded step runs: is the action it is about to perform still
  the one that was approved?
* `effect_previews` — the guarded steps rendered as they will run, for the decision page.

A plain gate's action is the guarded tool step's call rendered with the gate *undecided*: the
reviewer's note may appear where the definition's template puts it (the support example adds it
to the e-mail as a P.S.), so the hash covers everything but the decision's own words.

Reads the run's pinned definition and persisted step state and renders templates; changes
nothing and imports no service.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation

from jsonschema import Draft202012Validator

from orchestrator.engine.definitions import (
    ExpressionError,
    TemplateError,
    evaluate_expression,
    render_value,
)
from orchestrator.engine.definitions.format import DEFAULT_GATE_TIER
from orchestrator.engine.definitions.gates import CONTEXT, PROPOSAL, STEP, gate_binding
from orchestrator.engine.definitions.proposals import (
    normalize_proposal,
    proposal_hash,
    proposal_problems,
)
from orchestrator.engine.hashing import digest_of
from orchestrator.engine.risk import assess
from orchestrator.engine.scheduler import StepView, step_input
from orchestrator.engine.selectors import definition_of
from orchestrator.integrations.tools.registry import get_tool
from orchestrator.models import Run, StepAttempt, StepRun

from .models import ApprovalRequest

# Keys a message-like call uses for its recipient, subject and body (the preview of an e-mail,
# a chat message, an SMS...).
RECIPIENT_KEYS = ("to", "recipient", "email", "channel", "phone")
SUBJECT_KEYS = ("subject", "title")
BODY_KEYS = ("body", "text", "message", "content")


@dataclass(frozen=True)
class GateAction:
    kind: str
    action: dict
    hash: str
    source: str
    guarded: tuple[str, ...]
    explanation: dict = field(default_factory=dict)
    risk_tier: str = DEFAULT_GATE_TIER
    risk_reasons: tuple[str, ...] = ()
    amount: Decimal | None = None


@dataclass(frozen=True)
class EditedAction:
    action: dict
    hash: str
    edits: dict
    changes: dict  # name -> {"from", "to"}
    risk_tier: str
    risk_reasons: tuple[str, ...]
    amount: Decimal | None


@dataclass(frozen=True)
class EffectPreview:
    step: str
    kind: str  # tool | agent | router
    tool: str = ""
    params: dict | None = None
    message: dict | None = None  # {"to", "subject", "body"} for a message-like call
    will_run: bool = True
    note: str = ""  # why it will not run, or why it could not be rendered


class ActionInvalid(Exception):
    """Edited parameters the action's schema rejects; `problems` is [{"path", "message"}]."""

    def __init__(self, problems: list[dict]):
        super().__init__("; ".join(f"{p['path']}: {p['message']}" for p in problems))
        self.problems = problems


# --- opening ----------------------------------------------------------------------------------


def gate_action(*, run: Run, gate: StepRun, spec: dict) -> GateAction:
    """The action the approval of `gate` (which has just started waiting) will authorize."""
    _, graph = definition_of(run)
    binding = gate_binding(gate.name, graph.steps, graph.ancestors)
    context = (gate.input or {}).get("steps", {})
    if binding.kind == PROPOSAL:
        output = (context.get(binding.source) or {}).get("output") or {}
        proposal = output["proposal"]
        declaration = graph.steps[binding.source]["proposal"]
        risk = output.get("risk") or {}
        return GateAction(
            PROPOSAL, _proposal_action(proposal), proposal_hash(proposal), binding.source,
            binding.guarded, explanation=_explanation(proposal),
            risk_tier=risk.get("tier", DEFAULT_GATE_TIER),
            risk_reasons=tuple(risk.get("reasons") or ()),
            amount=_amount(declaration, proposal))
    tier = spec.get("risk_tier") or DEFAULT_GATE_TIER
    reasons = ((f"the gate declares {tier} risk",) if spec.get("risk_tier") else
               (f"a gate that approves no typed proposal is {tier} risk unless it declares one",))
    if binding.kind == STEP:
        target = graph.steps[binding.source]
        would_be = _input_with_gate(run, graph, binding.source, gate.name,
                                    undecided_output(kind=STEP))
        action = _step_action(target, would_be, edits={})
        return GateAction(STEP, action, digest_of(action), binding.source, binding.guarded,
                          risk_tier=tier, risk_reasons=reasons)
    return GateAction(CONTEXT, context, digest_of(context), "", binding.guarded,
                      risk_tier=tier, risk_reasons=reasons)


def _proposal_action(proposal: dict) -> dict:
    return {"action_type": proposal["action_type"], "params": proposal["params"]}


def _explanation(proposal: dict) -> dict:
    return {key: proposal[key] for key in ("evidence", "rationale", "confidence") if key in proposal}


def _amount(declaration: dict, proposal: dict) -> Decimal | None:
    """The value of the action's declared amount param (risk.amount.param), if it is a number."""
    action = next((a for a in declaration.get("actions", []) if a["type"] == proposal["action_type"]), {})
    name = ((action.get("risk") or {}).get("amount") or {}).get("param")
    value = proposal["params"].get(name) if name else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return Decimal(str(value)).quantize(Decimal("0.01"))
    except InvalidOperation:
        return None


def _input_with_gate(run: Run, graph, name: str, gate: str, gate_output: dict) -> dict:
    """The input step `name` will get, with the gate completed with `gate_output`."""
    views = {s.name: StepView(s.state, s.output) for s in run.steps.all()}
    views[gate] = StepView("completed", gate_output)
    return step_input(graph, name, run.input, views)


def _step_action(target: dict, step_input_: dict, *, edits: dict) -> dict:
    """The canonical call of tool step `target` on `step_input_`, with reviewers' edits."""
    action = {"step": target["name"], "tool": target["tool"]}
    try:
        params = render_value(target.get("params") or {}, step_input_)
    except TemplateError as exc:
        return {**action, "params": None, "problem": f"params could not be rendered: {exc}"}
    return {**action, "params": {**params, **edits} if isinstance(params, dict) else params}


# --- the gate's output ------------------------------------------------------------------------


def gate_output(approval: ApprovalRequest, *, note: str, decided_by: str,
                approved_by: list[str]) -> dict:
    """What the gate step outputs when `approval` is approved (the guarded steps read it)."""
    output = {"approved": True, "note": note, "decided_by": decided_by, "approved_by": approved_by,
              "proposal_hash": approval.proposal_hash}
    if approval.action_kind == PROPOSAL:
        output["proposal"] = {**approval.action, **approval.explanation}
    return output


def undecided_output(*, kind: str, approval: ApprovalRequest | None = None) -> dict:
    """The gate's output without the decision's own fields: what the hash is computed over.

    A plain gate's hash covers the call rendered with this output, so it cannot contain the hash
    itself; a proposal gate's covers the proposal, which the guarded steps read from here.
    """
    output = {"approved": True, "note": "", "decided_by": "", "approved_by": [],
              "proposal_hash": ""}
    if approval is not None and kind == PROPOSAL:
        output.update(proposal_hash=approval.proposal_hash,
                      proposal={**approval.action, **approval.explanation})
    return output


# --- editing ----------------------------------------------------------------------------------


def action_edited(approval: ApprovalRequest, changes: dict) -> EditedAction:
    """`approval`'s action with `changes` to its parameters, validated and re-hashed.

    Raises ActionInvalid naming each problem by path (`params.<name>...`).
    """
    if not isinstance(changes, dict) or not changes:
        raise ActionInvalid([{"path": "params", "message": "no parameter was changed"}])
    refused = [{"path": f"params.{name}", "message": "this parameter may not be edited "
                f"(editable: {', '.join(approval.editable) or 'none'})"}
               for name in changes if name not in approval.editable]
    if refused:
        raise ActionInvalid(refused)
    if approval.action_kind == PROPOSAL:
        return _proposal_edited(approval, changes)
    if approval.action_kind == STEP:
        return _step_edited(approval, changes)
    raise ActionInvalid([{"path": "params", "message": "this gate approves no action with parameters"}])


def _diff(before: dict, after: dict, names) -> dict:
    return {name: {"from": before.get(name), "to": after.get(name)} for name in names
            if before.get(name) != after.get(name)}


def _step_edited(approval: ApprovalRequest, changes: dict) -> EditedAction:
    before = approval.action.get("params")
    if not isinstance(before, dict):
        raise ActionInvalid([{"path": "params", "message": approval.action.get("problem")
                              or "the call's params could not be rendered"}])
    params = {**before, **changes}
    schema = get_tool(approval.action["tool"]).params_schema
    problems = [{"path": _path("params", e.absolute_path), "message": e.message}
                for e in sorted(Draft202012Validator(schema).iter_errors(params), key=str)]
    if problems:
        raise ActionInvalid(problems)
    action = {**approval.action, "params": params}
    diff = _diff(before, params, changes)
    if not diff:
        raise ActionInvalid([{"path": "params", "message": "the values are the ones already approved"}])
    return EditedAction(action, digest_of(action), {**approval.edits, **changes}, diff,
                        approval.risk_tier, tuple(approval.risk_reasons), approval.amount)


def _proposal_edited(approval: ApprovalRequest, changes: dict) -> EditedAction:
    run = approval.run
    _, graph = definition_of(run)
    declaration = graph.steps[approval.action_source]["proposal"]
    source = StepRun.objects.get(run=run, name=approval.action_source)
    before = approval.action["params"]
    try:
        proposal = normalize_proposal(declaration, {
            **approval.action, **approval.explanation, "params": {**before, **changes}})
    except ValueError as exc:
        raise ActionInvalid([{"path": "params", "message": str(exc)}]) from None
    problems = proposal_problems(declaration, proposal)
    if problems:
        raise ActionInvalid([{"path": _proposal_path(p), "message": p.split(": ", 1)[-1]}
                             for p in problems])
    diff = _diff(before, proposal["params"], changes)
    if not diff:
        raise ActionInvalid([{"path": "params", "message": "the values are the ones already approved"}])
    repairs = (StepAttempt.objects.filter(step=source, outcome="succeeded")
               .order_by("-number").values_list("repair_count", flat=True).first() or 0)
    risk = assess(declaration=declaration, proposal=proposal, step_input=source.input or {},
                  repairs=repairs)
    edits = {name: proposal["params"][name] for name in {*approval.edits, *changes}
             if name in proposal["params"]}
    return EditedAction(_proposal_action(proposal), proposal_hash(proposal), edits, diff,
                        risk.tier, risk.reasons, _amount(declaration, proposal))


def _path(prefix: str, parts) -> str:
    return ".".join([prefix, *map(str, parts)])


def _proposal_path(problem: str) -> str:
    where = problem.split(": ", 1)[0]
    return where.replace("/", ".") if where.startswith("params") else "params"


# --- right before a guarded step runs ------------------------------------------------------------


def action_drift(approval: ApprovalRequest, guarded: StepRun, gate_name: str) -> str | None:
    """Why the action `guarded` is about to perform is not the one `approval` authorized, or
    None when it is. `guarded.input` is the step's persisted input."""
    if approval.action_kind == PROPOSAL:
        approved = proposal_hash(approval.action)
    else:
        approved = digest_of(approval.action)
    if approved != approval.proposal_hash:
        return "the approved action no longer matches its hash"
    steps = (guarded.input or {}).get("steps") or {}
    gate_out = (steps.get(gate_name) or {}).get("output") or {}
    if approval.action_kind == PROPOSAL:
        source = (steps.get(approval.action_source) or {}).get("output") or {}
        proposal = source.get("proposal")
        if not isinstance(proposal, dict) or not isinstance(gate_out.get("proposal"), dict):
            return "the proposal the approval binds is not in the step's input"
        proposed = {**_proposal_action(proposal),
                    "params": {**proposal.get("params", {}), **approval.edits}}
        if proposal_hash(proposed) != approval.proposal_hash:
            return "the proposal changed after it was approved"
        if (gate_out.get("proposal_hash") != approval.proposal_hash
                or proposal_hash(gate_out["proposal"]) != approval.proposal_hash):
            return "the gate's output does not carry the approved proposal"
        return None
    if approval.action_kind == STEP:
        _, graph = definition_of(approval.run)
        target = graph.steps[guarded.name]
        as_approved = {**(guarded.input or {}), "steps": {
            **steps, gate_name: {"state": "completed",
                                 "output": undecided_output(kind=STEP, approval=approval)}}}
        if digest_of(_step_action(target, as_approved, edits=approval.edits)) != approval.proposal_hash:
            return "the call the step would make is not the one that was approved"
        return None
    seen = {name: steps.get(name) for name in approval.action}
    if digest_of(seen) != approval.proposal_hash:
        return "the data the approval was given changed"
    return None


# --- the decision page ------------------------------------------------------------------------


def effect_previews(approval: ApprovalRequest) -> list[EffectPreview]:
    """Each guarded step as it will run if approved now (with no note)."""
    run = approval.run
    _, graph = definition_of(run)
    gate_name = approval.step.name
    output = undecided_output(kind=approval.action_kind, approval=approval)
    previews = []
    for name in approval.guarded_steps:
        spec = graph.steps[name]
        would_be = _input_with_gate(run, graph, name, gate_name, output)
        if spec.get("when"):
            try:
                holds = evaluate_expression(spec["when"], would_be)
            except ExpressionError as exc:
                previews.append(EffectPreview(name, spec["type"], will_run=False,
                                              note=f"its condition cannot be evaluated: {exc}"))
                continue
            if holds is not True:
                previews.append(EffectPreview(name, spec["type"], spec.get("tool", ""),
                                              will_run=False,
                                              note=f"its condition is false ({spec['when']})"))
                continue
        if spec["type"] != "tool":
            previews.append(EffectPreview(name, spec["type"]))
            continue
        edits = approval.edits if approval.action_kind == STEP else {}
        call = _step_action(spec, would_be, edits=edits)
        params = call.get("params")
        previews.append(EffectPreview(name, "tool", spec["tool"],
                                      params if isinstance(params, dict) else None,
                                      message_of(params), note=call.get("problem", "")))
    return previews


def message_of(params: object) -> dict | None:
    """{"to", "subject", "body"} when `params` look like a message (a recipient and a body)."""
    if not isinstance(params, dict):
        return None
    to = next((params[k] for k in RECIPIENT_KEYS if isinstance(params.get(k), str | list)), None)
    body = next((params[k] for k in BODY_KEYS if isinstance(params.get(k), str)), None)
    if to is None or body is None:
        return None
    subject = next((params[k] for k in SUBJECT_KEYS if isinstance(params.get(k), str)), "")
    return {"to": ", ".join(to) if isinstance(to, list) else to, "subject": subject, "body": body}


def action_summary(approval: ApprovalRequest, *, limit: int = 140) -> str:
    """One line saying what the approval authorizes, for lists, notifications and the ledger."""
    action = approval.action or {}
    if approval.action_kind == PROPOSAL:
        text = f"{action.get('action_type')} " + _params_line(action.get("params"))
    elif approval.action_kind == STEP:
        message = message_of(action.get("params"))
        if message:
            text = f"{action.get('tool')} to {message['to']}"
            if message["subject"]:
                text += f": {message['subject']}"
        else:
            text = f"{action.get('tool')} " + _params_line(action.get("params"))
    else:
        text = "continue after " + ", ".join(sorted(action)) if action else "continue the run"
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _params_line(params: object) -> str:
    if not isinstance(params, dict):
        return ""
    return ", ".join(f"{key}={value}" for key, value in params.items())
