"""Problems found in a workflow definition, and the exception that carries them.

Owns the `Problem` value, the `DefinitionInvalid` exception and the rendering of a
location inside a document as a path string (``steps[2].after[0]``). It must not decide
what is a problem; the validators do that.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

PathPart = str | int


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a definition.

    `path` locates it: ``"steps[2].after[0]"``, ``"input_schema"``, or ``""`` for the
    document root.
    """

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path or '<root>'}: {self.message}"


class DefinitionInvalid(Exception):
    """A definition was rejected; `problems` lists every reason, in document order."""

    def __init__(self, problems: Sequence[Problem]):
        self.problems: list[Problem] = list(problems)
        super().__init__("; ".join(str(problem) for problem in self.problems))


def format_path(parts: Iterable[PathPart]) -> str:
    """Render ``("steps", 2, "after", 0)`` as ``"steps[2].after[0]"``."""
    rendered = ""
    for part in parts:
        if isinstance(part, int):
            rendered += f"[{part}]"
        elif rendered:
            rendered += f".{part}"
        else:
            rendered = str(part)
    return rendered


def problem_at(parts: Iterable[PathPart], message: str) -> Problem:
    return Problem(format_path(parts), message)


class ProblemLog:
    """Collects problems as (path parts, message) and returns them in document order.

    Validators add problems in whatever order they discover them; `in_document_order`
    sorts by where each path lies in the document (key order of mappings, index order of
    lists), so the caller sees them top to bottom, and drops exact duplicates.
    """

    def __init__(self) -> None:
        self._entries: list[tuple[tuple[PathPart, ...], str]] = []

    def add(self, parts: Iterable[PathPart], message: str) -> None:
        self._entries.append((tuple(parts), message))

    def __len__(self) -> int:
        return len(self._entries)

    def in_document_order(self, doc: object) -> list[Problem]:
        seen: set[tuple[tuple[PathPart, ...], str]] = set()
        unique = []
        for entry in self._entries:
            if entry not in seen:
                seen.add(entry)
                unique.append(entry)
        unique.sort(key=lambda entry: _document_position(doc, entry[0]))
        return [problem_at(parts, message) for parts, message in unique]


def _document_position(doc: object, parts: tuple[PathPart, ...]) -> tuple[int, ...]:
    # A path that leaves the document (a missing field) sorts after its existing siblings.
    position: list[int] = []
    node = doc
    for part in parts:
        if isinstance(node, dict) and part in node:
            position.append(list(node).index(part))
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            position.append(part)
            node = node[part]
        else:
            position.append(1 << 30)
            node = None
    return tuple(position)
