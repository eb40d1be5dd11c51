"""The step dependency graph of a definition: ancestry, cycles and steps that can never run.

Owns the graph reasoning the validator needs, over plain names: which steps are ancestors
of which, every elementary cycle, which steps can never run (a `when` that is the
literal false, a dependency on a cycle or on a step that never runs, or a `join: all` over
mutually exclusive router routes), and which fallbacks the scheduler could never run (a
cycle of fallbacks, or a fallback that waits for its own primary). It must not read raw
documents or build messages about fields; `validation.py` turns its findings into problems.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

# Enumerating elementary cycles is exponential in the worst case; a definition with more
# than this many is reported by its first ones.
MAX_CYCLES = 20
_MAX_SEARCH_STEPS = 100_000


@dataclass(frozen=True)
class Node:
    name: str
    after: tuple[str, ...]  # known step names only, each once
    join: str = "all"
    always_false: bool = False
    fallback: str | None = None  # a known step name other than this one's


@dataclass
class Graph:
    nodes: Sequence[Node]
    # router name -> route name -> names of the steps its `then` lists
    routes: Mapping[str, Mapping[str, frozenset[str]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.by_name = {node.name: node for node in self.nodes}
        self.order = {node.name: index for index, node in enumerate(self.nodes)}
        self.dependents: dict[str, list[str]] = {node.name: [] for node in self.nodes}
        for node in self.nodes:
            for dep in node.after:
                self.dependents[dep].append(node.name)
        # Fallback step -> the first step in document order that names it as its fallback.
        self.primary_of: dict[str, str] = {}
        for node in self.nodes:
            if node.fallback is not None:
                self.primary_of.setdefault(node.fallback, node.name)

    def ancestors(self) -> dict[str, frozenset[str]]:
        """Every step -> the steps it transitively waits for (itself only via a cycle)."""
        found: dict[str, frozenset[str]] = {}
        for node in self.nodes:
            seen: set[str] = set()
            stack = list(node.after)
            while stack:
                current = stack.pop()
                if current not in seen:
                    seen.add(current)
                    stack.extend(self.by_name[current].after)
            found[node.name] = frozenset(seen)
        return found

    def completed_ancestors(self) -> dict[str, frozenset[str]]:
        """Every step -> the ancestors that have surely completed whenever it runs.

        With `join: all` a step runs only if each dependency completed, so those and what
        they surely had; with `join: any` only what all its dependencies surely had.
        Steps on or after a cycle get none.
        """
        sure: dict[str, frozenset[str]] = {}
        for name in self._topological_order():
            node = self.by_name[name]
            each = [frozenset({dep}) | sure.get(dep, frozenset()) for dep in node.after]
            if not each:
                sure[name] = frozenset()
            elif node.join == "all":
                sure[name] = frozenset().union(*each)
            else:
                sure[name] = frozenset.intersection(*each)
        return sure

    def cycles(self) -> list[list[str]]:
        """Elementary cycles in run order (each step runs after the one before it).

        Each cycle is listed once, starting at its earliest step in document order.
        """
        found: list[list[str]] = []
        budget = _MAX_SEARCH_STEPS
        # A depth-first search with an explicit stack: a long chain of steps must not
        # recurse once per step.
        for node in self.nodes:
            start = node.name
            path, on_path = [start], {start}
            pending = [iter(self.dependents[start])]
            while pending:
                nxt = next(pending[-1], None)
                if nxt is None:
                    pending.pop()
                    on_path.discard(path.pop())
                    continue
                budget -= 1
                if len(found) >= MAX_CYCLES or budget <= 0:
                    return found
                if nxt == start:
                    found.append([*path, start])
                elif nxt not in on_path and self.order[nxt] > self.order[start]:
                    on_path.add(nxt)
                    path.append(nxt)
                    pending.append(iter(self.dependents[nxt]))
        return found

    def fallback_cycles(self) -> list[list[str]]:
        """Cycles of fallbacks (`a`'s fallback is `b`, `b`'s is `a`), each listed once from its
        earliest step in document order and closed by that step again."""
        found: list[list[str]] = []
        settled: set[str] = set()
        for node in self.nodes:
            walk: list[str] = []
            current: str | None = node.name
            while current is not None and current not in settled and current not in walk:
                walk.append(current)
                following = self.by_name.get(current)
                current = following.fallback if following is not None else None
            if current is not None and current in walk:
                cycle = walk[walk.index(current):]
                first = min(range(len(cycle)), key=lambda i: self.order[cycle[i]])
                cycle = cycle[first:] + cycle[:first]
                found.append([*cycle, cycle[0]])
            settled.update(walk)
        found.sort(key=lambda cycle: self.order[cycle[0]])
        return found

    def fallback_waits_for(self, primary: str) -> tuple[list[str], list[str]] | None:
        """How the fallback of `primary` would wait for `primary` itself, or None if it never does.

        The scheduler counts a failed step as pending until its fallback has ended, and starts
        a fallback only once its primary has failed. So the fallback of `primary` could never
        run if it waits for `primary`: through `after`, through a fallback (which waits for its
        own primary to end), or through a failed step (which waits for its fallback).

        Returns the steps on the way, the fallback first and `primary` last, and the steps that
        must fail too for it to wait (empty when `primary` failing is enough; such a way is
        preferred). A cycle of fallbacks is reported by `fallback_cycles` instead.
        """
        fallback = self.by_name[primary].fallback
        if fallback is None or fallback not in self.by_name:
            return None
        for through_failures in (False, True):
            way = self._waiting_way(fallback, primary, through_failures)
            if way is not None:
                return way
        return None

    def _waiting_way(
        self, fallback: str, primary: str, through_failures: bool
    ) -> tuple[list[str], list[str]] | None:
        # Breadth first over two kinds of vertex: ("run", s), s starting or ending its own
        # attempt, and ("done", s), s counting as ended for the steps after it (which waits
        # for its fallback once s has failed). The fallback's own wait for its primary is
        # not followed: that one is what it is for.
        start = ("run", fallback)
        target = ("done", primary)
        came_from: dict[tuple[str, str], tuple[str, str] | None] = {start: None}
        frontier = [("done", dep) for dep in self.by_name[fallback].after]
        for vertex in frontier:
            came_from.setdefault(vertex, start)
        while frontier and target not in came_from:
            following = []
            for vertex in frontier:
                for nxt in self._waits(vertex, through_failures):
                    if nxt not in came_from:
                        came_from[nxt] = vertex
                        following.append(nxt)
            frontier = following
        if target not in came_from:
            return None
        vertices: list[tuple[str, str]] = []
        vertex: tuple[str, str] | None = target
        while vertex is not None:
            vertices.append(vertex)
            vertex = came_from[vertex]
        vertices.reverse()
        names: list[str] = []
        failing: list[str] = []
        for before, after in pairwise(vertices):
            if before[0] == "done" and after == ("run", self.by_name[before[1]].fallback):
                failing.append(before[1])
        for _, name in vertices:
            if not names or names[-1] != name:
                names.append(name)
        return names, failing

    def _waits(self, vertex: tuple[str, str], through_failures: bool):
        kind, name = vertex
        node = self.by_name[name]
        if kind == "run":
            for dep in node.after:
                yield ("done", dep)
            if name in self.primary_of:
                yield ("run", self.primary_of[name])
        else:
            yield ("run", name)
            if through_failures and node.fallback is not None and node.fallback in self.by_name:
                yield ("run", node.fallback)

    def never_runs(self, cycles: list[list[str]]) -> dict[str, tuple[str, str]]:
        """Steps outside cycles that can never run -> (field that causes it, reason)."""
        in_cycle = {name for cycle in cycles for name in cycle}
        never: dict[str, tuple[str, str] | None] = {name: None for name in in_cycle}
        allowed: dict[str, dict[str, frozenset[str]]] = {}

        for name in self._topological_order():
            node = self.by_name[name]
            if name in never:
                continue
            if node.always_false:
                never[name] = ("when", "unreachable: its `when` is always false")
                continue
            reason = self._blocked_by(node, never, in_cycle)
            if reason is None:
                allowed[name], reason = self._route_requirements(node, allowed)
            if reason is not None:
                never[name] = ("after", reason)

        # Steps downstream of a cycle never get a topological position; settle them here.
        changed = True
        while changed:
            changed = False
            for node in self.nodes:
                if node.name in never or node.name in allowed:
                    continue
                reason = self._blocked_by(node, never, in_cycle)
                if reason is not None:
                    never[node.name] = ("after", reason)
                    changed = True
        return {name: cause for name, cause in never.items() if cause is not None}

    def _topological_order(self) -> list[str]:
        waiting = {node.name: len(node.after) for node in self.nodes}
        ready = [node.name for node in self.nodes if not node.after]
        order = []
        while ready:
            name = ready.pop(0)
            order.append(name)
            for dependent in self.dependents[name]:
                waiting[dependent] -= 1
                if waiting[dependent] == 0:
                    ready.append(dependent)
        return order

    def _blocked_by(self, node: Node, never: Mapping, in_cycle: set[str]) -> str | None:
        def why(dep: str) -> str:
            return "is part of a cycle" if dep in in_cycle else "never runs"

        blocked = [dep for dep in node.after if dep in never]
        if not blocked:
            return None
        if node.join == "all":
            return f"unreachable: depends on {blocked[0]!r}, which {why(blocked[0])}"
        if len(blocked) == len(node.after):
            names = ", ".join(repr(dep) for dep in blocked)
            return f"unreachable: none of its dependencies ({names}) can run"
        return None

    def _route_requirements(
        self, node: Node, allowed: Mapping[str, Mapping[str, frozenset[str]]]
    ) -> tuple[dict[str, frozenset[str]], str | None]:
        """Which routes of which routers this step needs taken, or why that is impossible.

        A step listed in a route's `then` runs only if the router takes that route; with
        `join: all` it inherits every dependency's requirement, with `join: any` only the
        requirements all dependencies share.
        """
        own = {}
        for router, routes in self.routes.items():
            taken = frozenset(route for route, steps in routes.items() if node.name in steps)
            if taken:
                own[router] = taken
        sources: list[tuple[str | None, Mapping[str, frozenset[str]]]] = [(None, own)]
        if node.join == "all":
            sources += [(dep, allowed.get(dep, {})) for dep in node.after]
        elif node.after:
            shared = set.intersection(*(set(allowed.get(dep, {})) for dep in node.after))
            inherited = {
                router: frozenset().union(*(allowed[dep][router] for dep in node.after))
                for router in shared
            }
            sources.append((None, inherited))

        combined: dict[str, frozenset[str]] = {}
        for _, requirement in sources:
            for router, routes in requirement.items():
                combined[router] = combined.get(router, routes) & routes
                if not combined[router]:
                    return combined, self._conflict(router, sources)
        return combined, None

    @staticmethod
    def _conflict(router: str, sources) -> str:
        wanting = [(who, req[router]) for who, req in sources if router in req]
        for i, (first, first_routes) in enumerate(wanting):
            for second, second_routes in wanting[i + 1 :]:
                if first_routes & second_routes:
                    continue
                if first is None:
                    return (
                        f"unreachable: it runs only on route {_routes(first_routes)} of router "
                        f"{router!r} but depends on {second!r}, which runs only on route "
                        f"{_routes(second_routes)}"
                    )
                return (
                    f"unreachable: with join: all it needs both {first!r} (route "
                    f"{_routes(first_routes)} of router {router!r}) and {second!r} (route "
                    f"{_routes(second_routes)}), which can never both complete"
                )
        return (
            f"unreachable: its dependencies need routes of router {router!r} "
            "that are never taken together"
        )


def _routes(routes: frozenset[str]) -> str:
    return " or ".join(repr(route) for route in sorted(routes))
