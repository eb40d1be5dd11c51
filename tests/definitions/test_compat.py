"""schema_accepts: the conservative producer -> consumer schema check."""

from __future__ import annotations

import pytest

from orchestrator.engine.definitions import schema_accepts

OBJ = {"type": "object"}

COMPATIBLE = [
    ("identical", {"type": "string", "pattern": "^a"}, {"type": "string", "pattern": "^a"}),
    ("unconstrained-consumer", {}, {"type": "integer"}),
    ("true-consumer", True, {"type": "array"}),
    ("false-producer", {"type": "string"}, False),
    ("integer-into-number", {"type": "number"}, {"type": "integer"}),
    ("type-subset", {"type": ["string", "null"]}, {"type": "string"}),
    ("enum-subset", {"enum": ["a", "b", "c"]}, {"type": "string", "enum": ["a", "b"]}),
    ("const-into-enum", {"type": "string", "enum": ["a", "b"]}, {"const": "a"}),
    ("enum-values-fit-type", {"type": "integer", "minimum": 0}, {"enum": [0, 3]}),
    ("required-subset", {**OBJ, "required": ["a"]}, {**OBJ, "required": ["a", "b"]}),
    (
        "nested-properties",
        {**OBJ, "properties": {"a": {"type": "number"}}},
        {**OBJ, "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}},
    ),
    (
        "undeclared-property-of-closed-producer",
        {**OBJ, "properties": {"x": {"type": "string"}}},
        {**OBJ, "properties": {"a": {"type": "string"}}, "additionalProperties": False},
    ),
    (
        "closed-consumer-closed-producer",
        {**OBJ, "properties": {"a": {}, "b": {}}, "additionalProperties": False},
        {**OBJ, "properties": {"a": {"type": "string"}}, "additionalProperties": False},
    ),
    (
        "items",
        {"type": "array", "items": {"type": "number"}},
        {"type": "array", "items": {"type": "integer"}},
    ),
    (
        "range-inside",
        {"type": "number", "minimum": 0, "maximum": 10},
        {"type": "integer", "minimum": 1, "maximum": 5},
    ),
    (
        "exclusive-inside-inclusive",
        {"type": "number", "minimum": 0},
        {"type": "number", "exclusiveMinimum": 0},
    ),
    (
        "lengths-inside",
        {"type": "string", "minLength": 1, "maxLength": 10},
        {"type": "string", "minLength": 2, "maxLength": 3},
    ),
    ("consumer-anyOf", {"anyOf": [{"type": "string"}, {"type": "integer"}]}, {"type": "integer"}),
    (
        "producer-anyOf",
        {"type": ["string", "integer"]},
        {"anyOf": [{"type": "string"}, {"type": "integer"}]},
    ),
    (
        "annotations-ignored",
        {"type": "string", "description": "x", "title": "y"},
        {"type": "string", "format": "email"},
    ),
]

INCOMPATIBLE = [
    (
        "type-mismatch",
        {"type": "string"},
        {"type": "integer"},
        "the producer may output integer, the consumer expects string",
    ),
    ("number-into-integer", {"type": "integer"}, {"type": "number"}, "may output number"),
    ("producer-without-type", {"type": "string"}, {"minLength": 1}, "does not declare a type"),
    ("unconstrained-producer", {"type": "string"}, {}, "does not constrain its output"),
    ("false-consumer", False, {"type": "string"}, "accepts nothing"),
    ("enum-not-subset", {"enum": ["a", "b"]}, {"enum": ["a", "z"]}, "may output 'z'"),
    (
        "producer-without-enum",
        {"type": "string", "enum": ["a"]},
        {"type": "string"},
        "only accepts ['a']",
    ),
    (
        "required-not-guaranteed",
        {**OBJ, "required": ["a", "b"]},
        {**OBJ, "required": ["a"]},
        "requires 'b'",
    ),
    (
        "nested-type",
        {**OBJ, "properties": {"a": {"type": "string"}}},
        {**OBJ, "properties": {"a": {"type": "number"}}},
        "output.a: the producer may output number",
    ),
    (
        "undeclared-open-property",
        {**OBJ, "properties": {"a": {"type": "string"}}},
        OBJ,
        "output.a: the producer does not declare this property",
    ),
    (
        "closed-consumer-open-producer",
        {**OBJ, "additionalProperties": False},
        OBJ,
        "allows no extra properties",
    ),
    (
        "closed-consumer-extra-property",
        {**OBJ, "properties": {"a": {}}, "additionalProperties": False},
        {**OBJ, "properties": {"a": {}, "b": {}}, "additionalProperties": False},
        "does not allow property 'b'",
    ),
    (
        "items-mismatch",
        {"type": "array", "items": {"type": "string"}},
        {"type": "array", "items": {"type": "integer"}},
        "output[]: the producer may output integer",
    ),
    (
        "items-unconstrained",
        {"type": "array", "items": {"type": "string"}},
        {"type": "array"},
        "output[]: the producer does not constrain",
    ),
    (
        "minimum-missing",
        {"type": "number", "minimum": 0},
        {"type": "number"},
        "requires a minimum of 0",
    ),
    (
        "minimum-lower",
        {"type": "number", "minimum": 0},
        {"type": "number", "minimum": -1},
        "minimum -1 is outside the consumer's 0",
    ),
    (
        "maximum-higher",
        {"type": "number", "maximum": 1},
        {"type": "number", "maximum": 2},
        "maximum 2 is outside",
    ),
    (
        "inclusive-into-exclusive",
        {"type": "number", "exclusiveMaximum": 1},
        {"type": "number", "maximum": 1},
        "maximum 1 is outside the consumer's 1 (exclusive)",
    ),
    ("max-length-missing", {"type": "string", "maxLength": 5}, {"type": "string"}, "maxLength 5"),
    ("min-items", {"type": "array", "minItems": 2}, {"type": "array", "minItems": 1}, "minItems 2"),
    (
        "pattern-not-repeated",
        {"type": "string", "pattern": "^a"},
        {"type": "string"},
        "pattern '^a'",
    ),
    ("unique-items", {"type": "array", "uniqueItems": True}, {"type": "array"}, "unique items"),
    (
        "unsupported-consumer-keyword",
        {"type": "object", "patternProperties": {"^x": {}}},
        OBJ,
        "'patternProperties'",
    ),
    (
        "consumer-anyOf-no-branch",
        {"anyOf": [{"type": "string"}, {"type": "null"}]},
        {"type": "integer"},
        "may output integer",
    ),
    (
        "producer-anyOf-branch",
        {"type": "string"},
        {"anyOf": [{"type": "string"}, {"type": "integer"}]},
        "may output integer",
    ),
    ("malformed", {"type": "string", "minLength": "x"}, {"type": "string"}, "cannot be compared"),
]


@pytest.mark.parametrize(
    ("consumer", "producer"), [pytest.param(c, p, id=i) for i, c, p in COMPATIBLE]
)
def test_compatible_pairs_are_accepted(consumer, producer):
    assert schema_accepts(consumer, producer) is None


@pytest.mark.parametrize(
    ("consumer", "producer", "reason"),
    [pytest.param(c, p, r, id=i) for i, c, p, r in INCOMPATIBLE],
)
def test_incompatible_pairs_are_rejected_with_a_reason(consumer, producer, reason):
    found = schema_accepts(consumer, producer)
    assert found is not None and reason in found, found
