"""What a human gate approves, read from the definition: the one place that decides it.

A gate's approval binds exactly one thing, which is hashed and re-checked right before it runs:

* `proposal` — the typed proposal of an upstream agent step (its `{action_type, params}`);
* `step` — the call a tool step after the gate will make (its tool and rendered params);
* `context` — neither applies: the outputs of the steps upstream of the gate.

`approves:` names the step; without it the binding is inferred: the nearest upstream step with
a `proposal`, else the one tool step that runs after the gate and reads nothing the gate has not
seen. The steps a gate *guards* (whose execution is refused unless its approval still holds) are
the worker steps that list the gate in `after` — for a `step` binding, that one tool step.

Pure: no database, no rendering. Validation and, at run time, `approvals.actions` call it.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

PROPOSAL, STEP, CONTEXT = "proposal", "step", "context"
WORKER_TYPES = ("agent", "tool", "router")


@dataclass(frozen=True)
class GateBinding:
    kind: str  # proposal | step | context
    source: str | None  # the proposing step, or the tool step that performs the action
    guarded: tuple[str, ...]  # steps whose execution the approval authorizes


def proposal_sources(gate: str, steps: Mapping[str, dict],
                     ancestors: Mapping[str, frozenset[str]]) -> list[str]:
    """Upstream agent steps with a `proposal` that no other such step comes after."""
    found = [n for n in ancestors.get(gate, ()) if _proposes(steps.get(n))]
    return sorted(n for n in found if not any(n in ancestors.get(m, ()) for m in found if m != n))


def performer_candidates(gate: str, steps: Mapping[str, dict],
                         ancestors: Mapping[str, frozenset[str]]) -> list[str]:
    """Tool steps after the gate whose every ancestor the gate has seen (or is the gate)."""
    seen = set(ancestors.get(gate, ())) | {gate}
    return sorted(n for n in dependents(gate, steps)
                  if steps[n].get("type") == "tool" and set(ancestors.get(n, ())) <= seen)


def dependents(gate: str, steps: Mapping[str, dict]) -> list[str]:
    """Steps that list `gate` in their `after`."""
    return [n for n, s in steps.items() if isinstance(s.get("after"), list) and gate in s["after"]]


def gate_binding(gate: str, steps: Mapping[str, dict],
                 ancestors: Mapping[str, frozenset[str]]) -> GateBinding:
    """The binding of gate `gate` (a definition that passed validation)."""
    spec = steps[gate]
    named = spec.get("approves")
    workers = tuple(sorted(n for n in dependents(gate, steps)
                           if steps[n].get("type") in WORKER_TYPES))
    if named:
        if _proposes(steps.get(named)):
            return GateBinding(PROPOSAL, named, workers)
        return GateBinding(STEP, named, (named,))
    sources = proposal_sources(gate, steps, ancestors)
    if len(sources) == 1:
        return GateBinding(PROPOSAL, sources[0], workers)
    performers = performer_candidates(gate, steps, ancestors)
    if len(performers) == 1:
        return GateBinding(STEP, performers[0], (performers[0],))
    return GateBinding(CONTEXT, None, workers)


def approves_problem(gate: str, named: str, steps: Mapping[str, dict],
                     ancestors: Mapping[str, frozenset[str]]) -> str | None:
    """Why `approves: named` cannot be bound by `gate`, or None."""
    target = steps.get(named)
    if target is None:
        return f"unknown step {named!r} in approves"
    if _proposes(target):
        if named not in ancestors.get(gate, ()):
            return f"{named!r} proposes an action but does not run before {gate!r}"
        return None
    if target.get("type") != "tool":
        return (f"{named!r} is a step of type {target.get('type')}; a gate approves an upstream "
                "proposal or a tool step that runs after it")
    if named not in dependents(gate, {named: target}):
        return f"tool step {named!r} must list {gate!r} in its after"
    unseen = sorted(set(ancestors.get(named, ())) - set(ancestors.get(gate, ())) - {gate})
    if unseen:
        return (f"{named!r} also reads {', '.join(unseen)}, which {gate!r} has not seen; the "
                "reviewer would approve a call that is not known yet")
    return None


def _proposes(spec: dict | None) -> bool:
    return bool(spec) and spec.get("type") == "agent" and isinstance(spec.get("proposal"), dict)
