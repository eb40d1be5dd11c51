"""Text is valid Unicode: the one check every entry uses, and the repair every page uses.

Python strings can hold lone surrogates (U+D800..U+DFFF), which no UTF-8 database column,
JSON document or HTTP response can carry: JSON's `\\ud800` escapes and YAML's are the way in.
`text_problem` finds the first such string in a value (keys included) with its path, so an
entry refuses it before anything is stored; `replaced` gives a copy with each lone surrogate
shown as U+FFFD, for rendering data stored before the check. Iterative: safe on any depth.
It must not decide what an entry does with a refusal (400, a classified step failure).
"""
from __future__ import annotations

import re

# What a path is made of: mapping keys and list indexes, as in definitions/problems.py.
PathPart = str | int

_SURROGATE = re.compile("[\ud800-\udfff]")
REPLACEMENT = "\ufffd"


def invalid_char(text: str) -> str | None:
    """The first lone surrogate in `text`, or None when it is valid Unicode."""
    if text.isascii():
        return None
    found = _SURROGATE.search(text)
    return found.group() if found else None


def text_problem(value: object) -> tuple[tuple[PathPart, ...], str] | None:
    """(path, message) for the first string in `value` (a key or a value of its dicts and
    lists) that is not valid Unicode, or None."""
    stack: list[tuple[object, tuple[PathPart, ...]]] = [(value, ())]
    while stack:
        node, parts = stack.pop()
        if isinstance(node, str):
            char = invalid_char(node)
            if char is not None:
                return parts, _message(char)
        elif isinstance(node, dict):
            for key, item in node.items():
                char = invalid_char(key) if isinstance(key, str) else None
                if char is not None:
                    return parts, _message(char, key=True)
                stack.append((item, (*parts, key)))
        elif isinstance(node, list | tuple):
            stack.extend((item, (*parts, index)) for index, item in enumerate(node))
    return None


def _message(char: str, *, key: bool = False) -> str:
    what = "a key here" if key else "the text"
    return (f"{what} is not valid Unicode: it holds a lone surrogate (U+{ord(char):04X}), "
            "which no UTF-8 text can carry")


def replaced(value: object) -> object:
    """`value` with every lone surrogate in its strings (and keys) replaced by U+FFFD; the
    value itself when there is none."""
    if text_problem(value) is None:
        return value
    return _replace(value)


def _replace(value: object) -> object:
    if isinstance(value, str):
        return _SURROGATE.sub(REPLACEMENT, value)
    if isinstance(value, dict):
        return {_replace(key): _replace(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_replace(item) for item in value]
    return value
