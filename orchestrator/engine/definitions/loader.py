"""Loading definition text (YAML or JSON) into a plain document.

Owns `parse_definition_text`: text in, a dict of plain JSON data out, or
`DefinitionInvalid` with a located message. YAML is read with a safe loader that keeps
dates as strings (so YAML and JSON give the same document) and rejects duplicate keys
instead of silently keeping the last one (in JSON too). Nothing small can expand into
something big or deep: text over MAX_DEFINITION_BYTES is refused unread, YAML aliases
(`*name`, and so `<<` merges) are refused while composing, so a few hundred bytes cannot
expand into millions of nodes, and nesting past MAX_DEPTH is refused before the
recursive composer or JSON decoder can overflow the stack. JSON's non-standard NaN and
Infinity (and numbers too large for a float) are refused. It must not validate the format;
that is `validate_definition`'s job.
"""

from __future__ import annotations

import json
import math

import yaml

from ..text import text_problem
from .limits import MAX_DEFINITION_BYTES, MAX_DEPTH
from .problems import DefinitionInvalid, Problem, format_path

_JSON_CONTENT_TYPES = ("application/json", "text/json")


class _DefinitionLoader(yaml.SafeLoader):
    """SafeLoader without implicit timestamps or aliases, refusing duplicate mapping keys
    and nesting deeper than MAX_DEPTH."""

    yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def __init__(self, stream) -> None:
        super().__init__(stream)
        self.depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.get_event()
            raise yaml.composer.ComposerError(
                None,
                None,
                f"found alias *{event.anchor}: YAML aliases (and << merges) are not allowed "
                "in a definition; write the value out",
                event.start_mark,
            )
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(
                    None, None, f"nesting deeper than {MAX_DEPTH} levels", self.peek_event().start_mark
                )
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_mapping(self, node, deep=False):
        keys = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in keys
            except TypeError:  # an unhashable key; the base class reports it
                break
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {key!r}",
                    key_node.start_mark,
                )
            keys.add(key)
        return super().construct_mapping(node, deep=deep)


def parse_definition_text(text: str, *, content_type: str | None = None) -> dict:
    """Parse YAML or JSON `text` into a dict.

    A JSON content type (``application/json``) is parsed as strict JSON; anything else
    as YAML, which also accepts JSON. Raises DefinitionInvalid with a single root
    problem for unparsable text or a top level that is not a mapping.
    """
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as error:
            raise DefinitionInvalid(
                [Problem("", f"definition is not UTF-8 text: {error}")]
            ) from None
    if not isinstance(text, str):
        raise DefinitionInvalid(
            [Problem("", f"definition text must be a string, not {type(text).__name__}")]
        )
    if len(text) > MAX_DEFINITION_BYTES or len(text.encode("utf-8")) > MAX_DEFINITION_BYTES:
        raise DefinitionInvalid(
            [Problem("", f"definition text is larger than {MAX_DEFINITION_BYTES:,} bytes")]
        )
    if _is_json(content_type):
        doc = parse_json_text(text, what="JSON")
    else:
        try:
            _refuse_deep_nesting(text)
            doc = yaml.load(text, Loader=_DefinitionLoader)  # a SafeLoader subclass
        except yaml.YAMLError as error:
            raise DefinitionInvalid([Problem("", f"invalid YAML: {error}")]) from None
        except (ValueError, RecursionError) as error:  # e.g. an integer of 5,000 digits
            raise DefinitionInvalid([Problem("", f"invalid YAML: {_brief(error)}")]) from None
        _refuse_invalid_text(doc, "YAML")
    if not isinstance(doc, dict):
        kind = "empty" if doc is None else f"a {type(doc).__name__}"
        raise DefinitionInvalid(
            [Problem("", f"a definition must be a mapping at the top level, not {kind}")]
        )
    return doc


def _refuse_deep_nesting(text: str) -> None:
    """Refuse nesting past MAX_DEPTH from libyaml's events, before the pure-Python scanner
    reads the text: for each unclosed `[` or `{` on a line that scanner looks up to 1,024
    characters ahead, so deep flow text costs it a second of CPU before its composer can
    refuse it. Without libyaml the composer's own check stands."""
    if not yaml.__with_libyaml__:
        return
    depth = 0
    for event in yaml.parse(text, Loader=yaml.CSafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(
                    None, None, f"nesting deeper than {MAX_DEPTH} levels", event.start_mark)
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def parse_json_text(text: str | bytes, *, what: str) -> object:
    """Strict JSON: duplicate keys, NaN, Infinity and non-finite numbers refused, and
    nesting past MAX_DEPTH a located error instead of a RecursionError.

    Raises DefinitionInvalid with one root problem, its message starting with "invalid
    {what}".
    """
    try:
        doc = json.loads(
            text,
            object_pairs_hook=_unique_keys,
            parse_constant=_no_constant,
            parse_float=_finite_float,
        )
        _refuse_invalid_text(doc, what)
        return doc
    except RecursionError:
        message = f"invalid {what}: nesting deeper than {MAX_DEPTH} levels"
    except (ValueError, _DuplicateKey) as error:  # JSONDecodeError is a ValueError
        message = f"invalid {what}: {_brief(error)}"
    raise DefinitionInvalid([Problem("", message)])


def _refuse_invalid_text(doc: object, what: str) -> None:
    """Refuse text that JSON's or YAML's escapes made invalid Unicode (`"\\ud800"`), at its path:
    every body, definition, webhook and queue event is parsed here, so none is stored."""
    problem = text_problem(doc)
    if problem is not None:
        parts, message = problem
        path = format_path(parts)
        raise DefinitionInvalid([Problem(path, f"invalid {what}: {f'at {path}, ' if path else ''}"
                                               f"{message}")])


def _brief(error: Exception) -> str:
    return str(error).split("\n", 1)[0][:300]


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is too large")
    return value


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    doc = {}
    for key, value in pairs:
        if key in doc:
            raise _DuplicateKey(f"found duplicate key {key!r}")
        doc[key] = value
    return doc


def _is_json(content_type: str | None) -> bool:
    if not content_type:
        return False
    media_type = content_type.split(";", 1)[0].strip().lower()
    return media_type in _JSON_CONTENT_TYPES or media_type.endswith("+json")
