"""The workflow call graph: which workflows a definition starts as sub-workflows, and whether
a chain of calls comes back to where it started.

Owns `workflow_calls` (the `sub_workflow` steps of one definition, with their paths) and
`call_cycle` (a breadth-first search over the calls of other workflows, which the caller
supplies by name). Both are iterative, so a long chain costs its length and never the stack.
It must not read the database; `services.workflows` says which versions of which workflows
count (the published and the latest saved one of each).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

from .problems import PathPart


def workflow_calls(definition: object) -> list[tuple[tuple[PathPart, ...], str]]:
    """(path of the step's `workflow` field, called workflow name) for every sub_workflow
    step of `definition`, loop bodies included."""
    found: list[tuple[tuple[PathPart, ...], str]] = []
    if not isinstance(definition, dict):
        return found
    stack: list[tuple[tuple[PathPart, ...], object]] = [(("steps",), definition.get("steps"))]
    while stack:
        at, steps = stack.pop()
        for index, step in enumerate(steps if isinstance(steps, list) else ()):
            if not isinstance(step, dict):
                continue
            if step.get("type") == "sub_workflow" and isinstance(step.get("workflow"), str):
                found.append(((*at, index, "workflow"), step["workflow"]))
            if isinstance(step.get("body"), list):
                stack.append(((*at, index, "body"), step["body"]))
    return sorted(found, key=lambda call: [str(part) for part in call[0]])


def call_cycle(
    name: str, calls: Iterable[str], callees: Callable[[str], Iterable[str]]
) -> list[str] | None:
    """The shortest chain `[name, ..., name]` by which workflow `name`, calling `calls`,
    would call itself again, given `callees(other)` (the workflows `other` calls); or None."""
    parent: dict[str, str] = {}
    queue: deque[str] = deque()
    for callee in calls:
        if callee == name:
            return [name, name]
        if callee not in parent:
            parent[callee] = name
            queue.append(callee)
    while queue:
        current = queue.popleft()
        for callee in callees(current):
            if callee == name:
                chain = [current]
                while chain[-1] != name:
                    chain.append(parent[chain[-1]])
                return [*reversed(chain), name]
            if callee not in parent:
                parent[callee] = current
                queue.append(callee)
    return None
