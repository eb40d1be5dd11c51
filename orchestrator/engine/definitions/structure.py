"""Structural validation: a document against the format schema, in human words.

Owns turning `jsonschema` errors into `Problem`-ready (path, message) pairs that a person
can act on ("unknown field 'foo'", "missing required field 'model'"), and checking that a
user-supplied JSON Schema is itself valid. It must not know the meaning of any field;
that is `format.py` (what is allowed) and `validation.py` (what fits together).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import cache, lru_cache

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from .format import STEP_TYPES, shared_format_schema
from .problems import PathPart

Found = tuple[tuple[PathPart, ...], str]

_TYPE_NAMES = {
    "object": "a mapping",
    "array": "a list",
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "a boolean",
    "null": "null",
}


def structure_problems(doc: object) -> Iterator[Found]:
    """Yield every way `doc` departs from the definition format schema."""
    for error in _format_validator().iter_errors(doc):
        yield from _humanize(error)


def schema_problems(schema: object, prefix: tuple[PathPart, ...]) -> Iterator[Found]:
    """Yield every reason `schema` is not a valid draft 2020-12 JSON Schema."""
    if is_valid_schema(schema):
        return
    for error in _metaschema_validator().iter_errors(schema):
        parts = prefix + tuple(error.absolute_path)
        if error.validator == "anyOf" and error.absolute_path and error.absolute_path[-1] == "type":
            allowed = ", ".join(sorted(_TYPE_NAMES))
            yield parts, f"unknown JSON Schema type {error.instance!r}; allowed: {allowed}"
        elif error.validator == "format" and error.validator_value == "regex":
            yield parts, f"invalid regular expression {error.instance!r}"
        else:
            yield parts, f"not a valid JSON Schema: {error.message}"


def is_valid_schema(schema: object) -> bool:
    if not isinstance(schema, dict | bool):
        return False
    try:
        key = json.dumps(schema, sort_keys=True)
    except (TypeError, ValueError):
        return _metaschema_validator().is_valid(schema)
    return _is_valid_schema_text(key)


@lru_cache(maxsize=1024)
def _is_valid_schema_text(text: str) -> bool:
    # Checking against the metaschema dominates validation time, and the same schemas
    # (tool params, step outputs) are checked on every save; memoize by content.
    return _metaschema_validator().is_valid(json.loads(text))


def describe_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


@cache
def _format_validator() -> Draft202012Validator:
    return Draft202012Validator(shared_format_schema())


@cache
def _metaschema_validator() -> Draft202012Validator:
    return Draft202012Validator(
        Draft202012Validator.META_SCHEMA, format_checker=Draft202012Validator.FORMAT_CHECKER
    )


def _humanize(error: ValidationError) -> Iterator[Found]:
    path = tuple(error.absolute_path)
    kind = error.validator
    value = error.instance
    title = error.schema.get("title") if isinstance(error.schema, dict) else None
    where = f" in {'an' if title[:1] in 'aeiou' else 'a'} {title}" if title else ""

    if kind == "required":
        for field in error.validator_value:
            if isinstance(value, dict) and field not in value:
                yield path, f"missing required field {field!r}"
    elif kind == "additionalProperties":
        allowed = error.schema.get("properties", {})
        for field in value:
            if field not in allowed:
                yield path + (field,), f"unknown field {field!r}{where}"
    elif kind == "type":
        expected = error.validator_value
        expected = [expected] if isinstance(expected, str) else expected
        wanted = " or ".join(_TYPE_NAMES.get(name, name) for name in expected)
        yield path, f"must be {wanted}, not {describe_type(value)}"
    elif kind == "enum":
        choices = error.validator_value
        if _is_step_type_field(path):
            yield path, f"unknown step type {value!r}; allowed types: {', '.join(STEP_TYPES)}"
        else:
            yield path, f"must be one of {', '.join(map(str, choices))}, not {value!r}"
    elif kind == "pattern":
        yield path, f"{value!r} is not a valid name: must match {error.validator_value}"
    elif kind == "minItems" and error.validator_value == 1:
        yield path, "must not be empty"
    elif kind == "minLength" and error.validator_value == 1:
        yield path, "must not be empty"
    elif kind == "minimum":
        yield path, f"must be >= {error.validator_value}, not {value!r}"
    elif kind == "exclusiveMinimum":
        yield path, f"must be > {error.validator_value}, not {value!r}"
    elif kind == "maximum":
        yield path, f"must be <= {error.validator_value:,}, not {value!r}"
    elif kind == "maxItems":
        yield path, f"must have at most {error.validator_value:,} items, not {len(value):,}"
    elif kind == "maxLength":
        yield path, f"must be at most {error.validator_value:,} characters long, not {len(value):,}"
    elif kind == "uniqueItems":
        yield path, "must not contain duplicates"
    elif kind == "not" and isinstance(error.schema, dict) and "description" in error.schema:
        yield path, f"field not allowed here: {error.schema['description']}"
    else:
        yield path, error.message


def _is_step_type_field(path: tuple[PathPart, ...]) -> bool:
    return len(path) == 3 and path[0] == "steps" and path[2] == "type"
