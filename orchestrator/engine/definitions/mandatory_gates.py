"""Mandatory approval gates: which gates a version may not drop, weaken or route around.

A human gate marked `mandatory: true` names the high-risk steps it `guards`; every run must
pass that gate, with its approvers and its number of approvals, before a guarded step can
run. An owner's gate policy (`GatePolicy`, services/gate_policies.py) names what it guards by
action instead: a tool or glob and optionally a target. Both guard the *action*, not a step's
name: a step that calls the same tool on a matching target is guarded as well. This module owns
the pure checks over definitions:

* `mandatory_gate_problems(definition)`: a definition's own marks make sense (`guards` names
  steps that surely wait for the gate);
* `weakened_gates(before, after)`: every way `after` drops or weakens a mandatory gate of
  `before`: the gate removed or renamed, no longer mandatory, a guarded step removed, renamed,
  no longer guarded or no longer waiting for the gate, a new step performing a guarded step's
  action without waiting for the gate, fewer approvals for some tier, other approvers (or
  escalation groups), more self-approval, or a `when` that could skip it;
* `unguarded_actions(definition, rules)`: every place a definition performs an action a rule
  guards without surely waiting for a gate that satisfies the rule.

What performs an action: a tool step, the tool of a map step's item, of a loop's body step and
of a step's `compensate` (each checked at its top-level step: a gate cannot sit inside a map
item or a loop body). Agent steps call no tools (a `proposal` is data a later tool step acts
on), and a sub_workflow step's child is checked as a workflow of its own.

Who may publish such a version anyway (an owner) is `orchestrator.engine.authz`'s business, and
`services.workflows` asks; nothing here reads the database or knows a person.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from urllib.parse import urlsplit

from .format import RISK_TIERS
from .graph import Graph, Node
from .problems import Problem, format_path
from .templates import contains_template

# Params whose value names where a call goes: a named connection, the recipients' domains.
# URL params are the tool's own (`url_params` in the registry), passed in by the caller.
CONNECTION_PARAM = "connection"
RECIPIENT_PARAMS = ("to", "cc", "bcc")


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


def weakened_gates(before: dict, after: dict, url_params: UrlParams | None = None) -> list[Problem]:
    """Every way `after` drops or weakens a mandatory gate of `before`, each with the path in
    `after` where it shows ("steps" when something was removed). `url_params(tool)` names a
    tool's URL params (default: a param named `url`)."""
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
        sure = sure if sure is not None else _sure_ancestors(after)
        problems += _routed_around(name, old, before, after, url_params or _urls_named_url, sure)
    return problems


# --- guarding actions ---------------------------------------------------------------------------

UrlParams = Callable[[str], Sequence[str]]


def _urls_named_url(tool: str) -> Sequence[str]:
    """Without the tool registry at hand: a param named `url` is a URL."""
    return ("url",)


@dataclass(frozen=True)
class Performed:
    """One tool call a definition makes: where, which tool, and where the call goes."""

    step: str  # the top-level step that makes it (or owns the map item, loop body, compensation)
    path: str  # the path of its `tool` field
    tool: str
    targets: frozenset[str]  # literal connection names, recipient domains, URL hosts
    unresolved: bool  # a target is a template: where it goes is known only at run time


@dataclass(frozen=True)
class ActionRule:
    """What a gate policy guards and what a gate must be to satisfy it."""

    tool: str  # a tool name or a glob (`payments.*`)
    target: str = ""  # a glob over a call's targets; empty: every call of the tool
    approvers: str = ""  # the group a satisfying gate names; empty: any group
    required_approvals: int = 1  # at least this many for every risk tier
    self_approval_up_to: str = ""  # the most self-approval a satisfying gate may allow
    label: str = ""  # how a problem names the rule

    def matches(self, call: Performed) -> bool:
        if not fnmatchcase(call.tool, self.tool):
            return False
        if not self.target or call.unresolved:
            return True
        return any(fnmatchcase(target, self.target.lower()) for target in call.targets)

    def satisfied_by(self, gate: dict) -> bool:
        """Whether human gate `gate` satisfies this rule: one that cannot be rescued when it is
        rejected (no `fallback`), decided by the rule's group with enough approvals, and no
        more self-approval than the rule allows."""
        if gate.get("type") != "human_gate" or gate.get("fallback"):
            return False
        if self.approvers and gate.get("approvers") != self.approvers:
            return False
        try:
            if min(_approvals(gate).values()) < self.required_approvals:
                return False
        except (TypeError, ValueError):
            return False
        allowed = RISK_TIERS.index(self.self_approval_up_to) if self.self_approval_up_to in RISK_TIERS else -1
        return _self_approval_rank(gate) <= allowed

    def describe(self) -> str:
        what = self.tool + (f" on {self.target}" if self.target else "")
        gate = [f"approvers {self.approvers}"] if self.approvers else []
        gate.append(f"at least {self.required_approvals} approval(s)")
        return f"{self.label or 'gate policy'} ({what}; a gate with {', '.join(gate)})"


def call_targets(tool: str, params: object, url_params: Iterable[str] = ("url",)
                 ) -> tuple[frozenset[str], bool]:
    """Where a call of `tool` with `params` goes, read from the literal params: the named
    connection, the recipients' domains and the URL params' hosts (lower case), and whether any
    of them is a template (then it could go anywhere)."""
    if not isinstance(params, dict):
        return frozenset(), contains_template(params)
    found, unresolved = set(), False

    def add(value: object, read: Callable[[str], str]) -> None:
        nonlocal unresolved
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str) and contains_template(item):
                unresolved = True
            elif isinstance(item, str) and read(item):
                found.add(read(item).lower())
            elif item is not None and not isinstance(item, str):
                unresolved = True

    if CONNECTION_PARAM in params:
        add(params[CONNECTION_PARAM], lambda v: v)
    for name in RECIPIENT_PARAMS:
        if name in params:
            add(params[name], lambda v: v.rsplit("@", 1)[-1] if "@" in v else v)
    for name in url_params:
        if name in params:
            add(params[name], lambda v: urlsplit(v).hostname or "")
    return frozenset(found), unresolved


def performed_actions(definition: dict, url_params: UrlParams = _urls_named_url) -> list[Performed]:
    """Every tool call `definition` makes, in document order."""
    found = []

    def add(step: str, at: tuple, spec: object) -> None:
        if isinstance(spec, dict) and isinstance(spec.get("tool"), str):
            targets, unresolved = call_targets(spec["tool"], spec.get("params", {}),
                                               url_params(spec["tool"]))
            found.append(Performed(step, format_path((*at, "tool")), spec["tool"], targets,
                                   unresolved))

    for index, step in enumerate(_steps(definition)):
        name = step.get("name")
        if not isinstance(name, str):
            continue
        at = ("steps", index)
        if step.get("type") == "tool":
            add(name, at, step)
        elif step.get("type") == "map" and isinstance(step.get("item"), dict):
            if step["item"].get("type") == "tool":
                add(name, (*at, "item"), step["item"])
                add(name, (*at, "item", "compensate"), step["item"].get("compensate"))
        elif step.get("type") == "loop" and isinstance(step.get("body"), list):
            for position, body_step in enumerate(step["body"]):
                if isinstance(body_step, dict) and body_step.get("type") == "tool":
                    add(name, (*at, "body", position), body_step)
                    add(name, (*at, "body", position, "compensate"), body_step.get("compensate"))
        add(name, (*at, "compensate"), step.get("compensate"))
    return found


def unguarded_actions(definition: dict, rules: Sequence[ActionRule],
                      url_params: UrlParams = _urls_named_url) -> list[Problem]:
    """One problem per tool call of `definition` that a rule guards and that does not surely
    wait for a gate satisfying that rule (every path to it passes such a gate, approved)."""
    if not rules:
        return []
    steps = {s.get("name"): s for s in _steps(definition) if isinstance(s.get("name"), str)}
    sure = None
    problems = []
    for call in performed_actions(definition, url_params):
        guarding = [rule for rule in rules if rule.matches(call)]
        if not guarding:
            continue
        sure = sure if sure is not None else _sure_ancestors(definition)
        before = [steps[name] for name in sure.get(call.step, frozenset()) if name in steps]
        missing = [rule for rule in guarding if not any(rule.satisfied_by(gate) for gate in before)]
        if missing:
            problems.append(Problem(call.path, (
                f"step {call.step!r} calls {call.tool}, which "
                f"{'; '.join(rule.describe() for rule in missing)} guards, without surely "
                "waiting for a gate that satisfies it: put such a gate on every path to it")))
    return problems


def _same_action(guarded: Performed, call: Performed) -> bool:
    return guarded.tool == call.tool and (guarded.unresolved or call.unresolved
                                          or bool(guarded.targets & call.targets))


def _routed_around(name: str, old: dict, before: dict, after: dict, url_params: UrlParams,
                   sure_after: dict[str, frozenset[str]]) -> list[Problem]:
    """Calls in `after` of an action a guarded step of mandatory gate `name` performs in
    `before`, that do not surely wait for the gate and did not already run so in `before`."""
    calls_before = performed_actions(before, url_params)
    guarded_names = set(old.get("guards") or [])
    guarded = [c for c in calls_before if c.step in guarded_names]
    if not guarded:
        return []
    sure_before = _sure_ancestors(before)
    # By step and tool, not path: moving a step in the list changes its path, not what it does.
    unguarded_before = {(c.step, c.tool) for c in calls_before
                        if name not in sure_before.get(c.step, frozenset())}
    problems = []
    for call in performed_actions(after, url_params):
        if call.step in guarded_names or name in sure_after.get(call.step, frozenset()):
            continue
        if (call.step, call.tool) in unguarded_before:
            continue
        like = next((g for g in guarded if _same_action(g, call)), None)
        if like is not None:
            problems.append(Problem(call.path, (
                f"step {call.step!r} calls {call.tool} like {like.step!r}, which mandatory gate "
                f"{name!r} guards, without surely waiting for the gate")))
    return problems
