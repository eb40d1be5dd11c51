"""definition_format_schema: a complete, self-contained draft 2020-12 schema."""

from __future__ import annotations

import json

from jsonschema import Draft202012Validator

from orchestrator.engine.definitions import definition_format_schema, normalize_definition


def walk(node, path=()):
    yield path, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from walk(value, (*path, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from walk(value, (*path, index))


def test_schema_is_a_valid_draft_2020_12_schema():
    schema = definition_format_schema()
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    json.dumps(schema)  # serializable as served by the API


def test_schema_is_self_contained():
    refs = [
        node["$ref"]
        for _, node in walk(definition_format_schema())
        if isinstance(node, dict) and "$ref" in node
    ]
    assert refs and all(ref.startswith("#/$defs/") for ref in refs)
    defs = definition_format_schema()["$defs"]
    assert all(ref.removeprefix("#/$defs/") in defs for ref in refs)


def test_every_field_is_described():
    undocumented = []
    for path, node in walk(definition_format_schema()):
        conditional = {"if", "then", "else"} & set(path)  # refinements of described fields
        if (
            len(path) >= 2
            and path[-2] == "properties"
            and isinstance(node, dict)
            and not conditional
        ):
            if "description" not in node and "$ref" not in node:
                undocumented.append(path)
    assert undocumented == []


def test_plain_jsonschema_accepts_the_examples_and_their_normalized_form(
    support_workflow, routing_workflow
):
    validator = Draft202012Validator(definition_format_schema())
    for doc in (support_workflow, routing_workflow):
        assert list(validator.iter_errors(doc)) == []
        assert list(validator.iter_errors(normalize_definition(doc))) == []


def test_plain_jsonschema_rejects_a_field_of_another_step_type(support_workflow):
    support_workflow["steps"][2]["prompt"] = "hi"  # a tool step
    assert not Draft202012Validator(definition_format_schema()).is_valid(support_workflow)


def test_callers_get_their_own_copy():
    definition_format_schema()["properties"].clear()
    assert "steps" in definition_format_schema()["properties"]
