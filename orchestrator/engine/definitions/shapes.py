"""Sample data of the declared shapes, so templates and expressions can be tried at save time.

Owns `sample`, which turns a JSON Schema into a value of that shape, in two variants:

* **full** - every declared property present, every nullable value non-null: whatever the
  shapes allow to exist, exists. A template that fails here reads something that cannot
  exist (a typo, an undeclared property).
* **minimal** - only required properties, nullable values null, arrays as short as allowed:
  only what the shapes guarantee exists. A template that fails here reads something
  optional without guarding it (`is defined`, `| default(...)`, `has(...)`).

Where a schema says nothing (no schema, `{}`, a `$ref`, combinators, an object without
`properties`) the value is `Unknown`: every read of it is allowed and nothing about it is
reported. It must not render or evaluate anything itself; `validation.py` does that.
"""

from __future__ import annotations

from collections.abc import Iterator


class Unknown:
    """A value whose shape is not declared: any attribute, item or call gives another
    Unknown, it iterates as empty and prints as nothing, and arithmetic keeps it unknown."""

    def __getattr__(self, name: str) -> Unknown:
        if name.startswith("__"):
            raise AttributeError(name)
        return self

    def __getitem__(self, key: object) -> Unknown:
        return self

    def __call__(self, *args: object, **kwargs: object) -> Unknown:
        return self

    def __iter__(self) -> Iterator:
        return iter(())

    def __len__(self) -> int:
        return 0

    def __bool__(self) -> bool:
        return True

    def __str__(self) -> str:
        return ""

    def __repr__(self) -> str:
        return "<unknown>"

    def __int__(self) -> int:
        return 0

    def __float__(self) -> float:
        return 0.0

    def _same(self, *other: object) -> Unknown:
        return self

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _same
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = _same
    __mod__ = __rmod__ = __pow__ = __rpow__ = __neg__ = __pos__ = _same

    def __lt__(self, other: object) -> bool:
        return False

    __le__ = __gt__ = __ge__ = __lt__

    __hash__ = object.__hash__


UNKNOWN = Unknown()

_SCALARS = {"string": "text", "integer": 1, "number": 1.5, "boolean": True, "null": None}
_MAX_DEPTH = 32


def sample(schema: object, *, full: bool, depth: int = 0) -> object:
    """A value of the shape `schema` describes (see the module docstring for the variants)."""
    if depth > _MAX_DEPTH or not isinstance(schema, dict) or not schema:
        return UNKNOWN
    if "const" in schema:
        return schema["const"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        if not full and None in enum:
            return None
        return next((value for value in enum if value is not None), enum[0])
    if any(key in schema for key in ("$ref", "anyOf", "oneOf", "allOf", "not", "if")):
        return UNKNOWN
    types = schema.get("type")
    types = [types] if isinstance(types, str) else types
    if not isinstance(types, list) or not types:
        return UNKNOWN
    if not full and "null" in types:
        return None
    kind = next((t for t in types if t != "null"), "null")
    if kind == "object":
        return _sample_object(schema, full=full, depth=depth)
    if kind == "array":
        items = schema.get("items")
        count = 1 if full else min(_int(schema.get("minItems")), 1)
        return [sample(items, full=full, depth=depth + 1) for _ in range(count)]
    if kind == "string":
        length = _int(schema.get("minLength"))
        return "text" if length <= 4 else "t" * min(length, 1000)
    if kind in ("integer", "number"):
        return _sample_number(schema, kind)
    return _SCALARS.get(kind, UNKNOWN)


def _sample_object(schema: dict, *, full: bool, depth: int) -> object:
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        return UNKNOWN  # an object without declared properties may hold anything
    required = schema.get("required")
    required = set(required) if isinstance(required, list) else set()
    return {
        key: sample(value, full=full, depth=depth + 1)
        for key, value in properties.items()
        if isinstance(key, str) and (full or key in required)
    }


def _sample_number(schema: dict, kind: str) -> int | float:
    low = _number(schema.get("minimum", schema.get("exclusiveMinimum")))
    high = _number(schema.get("maximum", schema.get("exclusiveMaximum")))
    if low is not None and high is not None:
        value = (low + high) / 2
    elif low is not None:
        value = low + 1
    elif high is not None:
        value = high - 1
    else:
        value = 1
    return round(value) if kind == "integer" else float(value)


def _number(value: object) -> int | float | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
