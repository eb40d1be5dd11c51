"""Loading definition text (YAML or JSON) into a plain document.

Owns `parse_definition_text`: text in, a dict of plain JSON data out, or
`DefinitionInvalid` with a located message. YAML is read with a safe loader that keeps
dates as strings (so YAML and JSON give the same document) and rejects duplicate keys
instead of silently keeping the last one (in JSON
too). It must not validate the format; that is
`validate_definition`'s job.
"""

from __future__ import annotations

import json

import yaml

from .problems import DefinitionInvalid, Problem

_JSON_CONTENT_TYPES = ("application/json", "text/json")


class _DefinitionLoader(yaml.SafeLoader):
    """SafeLoader without implicit timestamps, refusing duplicate mapping keys."""

    yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

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
    if _is_json(content_type):
        try:
            doc = json.loads(text, object_pairs_hook=_unique_keys)
        except (json.JSONDecodeError, _DuplicateKey) as error:
            raise DefinitionInvalid([Problem("", f"invalid JSON: {error}")]) from None
    else:
        try:
            doc = yaml.load(text, Loader=_DefinitionLoader)  # a SafeLoader subclass
        except yaml.YAMLError as error:
            raise DefinitionInvalid([Problem("", f"invalid YAML: {error}")]) from None
    if not isinstance(doc, dict):
        kind = "empty" if doc is None else f"a {type(doc).__name__}"
        raise DefinitionInvalid(
            [Problem("", f"a definition must be a mapping at the top level, not {kind}")]
        )
    return doc


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
