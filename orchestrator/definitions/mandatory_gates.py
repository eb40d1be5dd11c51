"""Mandatory approval gates: which gates a new version may not drop or weaken.

A human gate marked `mandatory: true` names the high-risk steps it `guards`; every run must
pass that gate, with its approvers and its number of approvals, before a guarded step can
run. This module owns two pure checks over definitions:

* `mandatory_gate_problems(definition)`: a definition's own marks make sense (`guards` names
  steps that surely wait for the gate);
* `weakened_gates(before, after)`: every way `after` drops or weakens a mandatory gate of
  `before`: the gate removed or renamed, no longer mandatory, a guarded step removed, renamed,
  no longer guarded or no longer waiting for the gate, fewer approvals for some tier, other
  approvers (or escalation groups), more self-approval, or a `when` that could skip it.

Who may publish such a version anyway (an owner) is `orchestrator.authz`'s business, and
`services.workflows` asks; nothing here reads the database or knows a person.
"""
from __future__ import annotations

from .format import RISK_TIERS
from .graph import Graph, Node
from .problems import Problem, format_path


def _steps(definition: dict) -> list[dict]:
    steps = definition.get("steps") if isinstance(definition, dict) else None
    return [s for s in steps if isinstance(s, dict)] if isinstance(steps, list) else []


def _mandatory(definition: dict) -> dict[str, tuple[int, dict]]:
    """name -> (index, step) of every human gate marked mandatory."""
    return {step["name"]: (index, step) for index, step in enumerate(_steps(definition))
            if step.get("type") == "human_gate" and step.get("mandatory") is True
            and isinstance(step.get("name"), str)}


def _sure_ancestors(definition: dict) -> dict[str, frozenset[str]]:
    """step -> the steps that have surely completed whenever it runs."""
    steps = _steps(definition)
    names = {s.get("name") for s in steps if isinstance(s.get("name"), str)}
    nodes, seen = [], set()
    for step in steps:
        name = step.get("name")
        if not isinstance(name, str) or name in seen:
            continue
        seen.add(name)
        after = step.get("after") if isinstance(step.get("after"), list) else []
        when = step.get("when")
        nodes.append(Node(name=name, after=tuple(dict.fromkeys(d for d in after if d in names)),
                          join="any" if step.get("join") == "any" else "all",
                          always_false=isinstance(when, str) and when.strip() == "false"))
    return Graph(nodes).completed_ancestors()


def _at(index: int, *rest: str | int) -> str:
    return format_path(("steps", index, *rest))


def mandatory_gate_problems(definition: dict) -> list[Problem]:
    """Problems with the mandatory-gate marks of one definition (empty when it has none)."""
    problems = []
    index_of = {s.get("name"): i for i, s in enumerate(_steps(definition))}
    sure = None
    for index, step in enumerate(_steps(definition)):
        guards = step.get("guards")
        if guards is not None and step.get("mandatory") is not True:
            problems.append(Problem(_at(index, "guards"), "'guards' is only used with mandatory: true"))
        if step.get("mandatory") is not True:
            continue
        if not guards:
            problems.append(Problem(_at(index, "guards"),
                                    "a mandatory gate names the high-risk steps it guards"))
            continue
        sure = sure if sure is not None else _sure_ancestors(definition)
        for position, guarded in enumerate(guards if isinstance(guards, list) else []):
            if guarded not in index_of:
                problems.append(Problem(_at(index, "guards", position),
                                        f"unknown step {guarded!r} in guards"))
            elif step.get("name") not in sure.get(guarded, frozenset()):
                problems.append(Problem(
                    _at(index, "guards", position),
                    f"step {guarded!r} does not surely wait for this gate: list the gate (or a "
                    f"step after it) in its 'after', with join: all"))
    return problems


def _approvals(spec: dict) -> dict[str, int]:
    required = spec.get("required_approvals", 1)
    if isinstance(required, dict):
        return {tier: int(required.get(tier, 1)) for tier in RISK_TIERS}
    return dict.fromkeys(RISK_TIERS, int(required))


def _self_approval_rank(spec: dict) -> int:
    tier = spec.get("self_approval_up_to")
    return RISK_TIERS.index(tier) if tier in RISK_TIERS else -1


def _escalation_groups(spec: dict) -> list:
    return [tier.get("approvers") for tier in spec.get("escalation") or [] if isinstance(tier, dict)]


def weakened_gates(before: dict, after: dict) -> list[Problem]:
    """Every way `after` drops or weakens a mandatory gate of `before`, each with the path in
    `after` where it shows ("steps" when something was removed)."""
    problems = []
    new_index = {s.get("name"): i for i, s in enumerate(_steps(after))}
    new_steps = _steps(after)
    sure = None
    for name, (_, old) in _mandatory(before).items():
        if name not in new_index or new_steps[new_index[name]].get("type") != "human_gate":
            problems.append(Problem("steps", f"mandatory gate {name!r} was removed (or renamed)"))
            continue
        index = new_index[name]
        new = new_steps[index]
        if new.get("mandatory") is not True:
            problems.append(Problem(_at(index, "mandatory"),
                                    f"gate {name!r} is mandatory and must stay so"))
        if new.get("approvers") != old.get("approvers"):
            problems.append(Problem(_at(index, "approvers"),
                                    f"mandatory gate {name!r} changes its approvers from "
                                    f"{old.get('approvers')!r} to {new.get('approvers')!r}"))
        if _escalation_groups(new) != _escalation_groups(old):
            problems.append(Problem(_at(index, "escalation"),
                                    f"mandatory gate {name!r} changes its escalation groups"))
        old_n, new_n = _approvals(old), _approvals(new)
        fewer = [f"{tier} {old_n[tier]} -> {new_n[tier]}" for tier in RISK_TIERS
                 if new_n[tier] < old_n[tier]]
        if fewer:
            problems.append(Problem(_at(index, "required_approvals"),
                                    f"mandatory gate {name!r} requires fewer approvals ({', '.join(fewer)})"))
        if _self_approval_rank(new) > _self_approval_rank(old):
            problems.append(Problem(_at(index, "self_approval_up_to"),
                                    f"mandatory gate {name!r} allows more self-approval"))
        if new.get("when") != old.get("when"):
            problems.append(Problem(_at(index, "when"),
                                    f"mandatory gate {name!r} changes the condition it runs under"))
        new_guards = new.get("guards") if isinstance(new.get("guards"), list) else []
        for guarded in old.get("guards") or []:
            if guarded not in new_index:
                problems.append(Problem("steps", f"step {guarded!r}, guarded by mandatory gate "
                                                 f"{name!r}, was removed (or renamed)"))
                continue
            if guarded not in new_guards:
                problems.append(Problem(_at(index, "guards"),
                                        f"mandatory gate {name!r} no longer guards {guarded!r}"))
            sure = sure if sure is not None else _sure_ancestors(after)
            if name not in sure.get(guarded, frozenset()):
                problems.append(Problem(_at(new_index[guarded], "after"),
                                        f"step {guarded!r} no longer surely waits for mandatory "
                                        f"gate {name!r}"))
    return problems
