"""Names never collide with container attributes: `steps.X`, `input.X` and `item.X` read the
data for every name the format allows, in templates and in CEL (issue 21, part 2)."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from orchestrator.engine.definitions import (
    evaluate_expression,
    render_template,
    validate_definition,
)
from orchestrator.engine.definitions.format import STEP_NAME_PATTERN

from .examples import MODELS, TOOLS

# Attributes and methods of the containers placed in a context (dict, list, str).
COLLISIONS = [
    "get", "items", "keys", "values", "update", "pop", "popitem", "copy", "clear",
    "setdefault", "fromkeys", "count", "index", "format", "join", "split", "upper", "title",
]  # fmt: skip


@pytest.mark.parametrize("name", COLLISIONS)
def test_a_colliding_name_reads_the_data_in_templates_and_expressions(name):
    assert re.fullmatch(STEP_NAME_PATTERN, name)
    context = {
        "input": {name: "from input"},
        "steps": {name: {"state": "completed", "output": {name: "from a step"}}},
        "item": {name: "from an item"},
        "index": 0,
    }

    rendered = render_template(
        f"{{{{ steps.{name}.output.{name} }}}}|{{{{ input.{name} }}}}|{{{{ item.{name} }}}}",
        context,
    )

    assert rendered == "from a step|from input|from an item"
    assert evaluate_expression(
        f"steps.{name}.output.{name} == 'from a step' && input.{name} == 'from input'"
        f" && item.{name} == 'from an item'",
        context,
    ) is True


def test_methods_of_a_mapping_stay_reachable_under_names_the_data_does_not_use():
    assert render_template("{{ input.items() | list | length }}", {"input": {"a": 1}}) == "1"


def test_the_sandbox_still_refuses_internals_and_mutation():
    from orchestrator.engine.definitions import TemplateError

    for text in ("{{ input.__class__ }}", "{{ input.x.append(1) }}", "{{ ''.__class__.__mro__ }}"):
        with pytest.raises(TemplateError):
            render_template(text, {"input": {"x": []}})


def test_a_definition_with_a_step_named_items_saves_and_its_templates_render(validate):
    doc = {
        "name": "collide",
        "input_schema": {"type": "object", "required": ["keys"], "properties": {"keys": {"type": "string"}}},
        "steps": [
            {"name": "items", "type": "tool", "tool": "http.get", "params": {"url": "{{ input.keys }}"},
             "output_schema": {"type": "object", "required": ["values"],
                               "properties": {"values": {"type": "string"}}}},
            {"name": "update", "type": "tool", "tool": "pager.page", "after": ["items"],
             "when": "steps.items.output.values != ''",
             "params": {"message": "{{ steps.items.output.values }} for {{ input.keys }}"}},
        ],
    }

    assert validate(doc) == []
    context = {"input": {"keys": "k"},
               "steps": {"items": {"state": "completed", "output": {"values": "v"}}}}
    assert render_template(doc["steps"][1]["params"]["message"], context) == "v for k"
    assert evaluate_expression(doc["steps"][1]["when"], context) is True


# --- the property: what saves, runs --------------------------------------------------------------

step_names = st.one_of(st.sampled_from(COLLISIONS), st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True))
field_names = st.one_of(st.sampled_from(COLLISIONS), st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True))
SCALARS = {
    "string": st.text(max_size=5),
    "integer": st.integers(-5, 5),
    "number": st.floats(-5, 5, allow_nan=False),
    "boolean": st.booleans(),
}


@st.composite
def shapes(draw, depth=0):
    """A JSON Schema of an object whose properties are scalars, string lists or objects."""
    names = draw(st.lists(field_names, min_size=1, max_size=4, unique=True))
    properties = {}
    for name in names:
        kind = draw(st.sampled_from([*SCALARS, "array", "object"] if depth < 2 else list(SCALARS)))
        if kind == "array":
            properties[name] = {"type": "array", "items": {"type": "string"}}
        elif kind == "object":
            properties[name] = draw(shapes(depth + 1))
        else:
            properties[name] = {"type": kind}
    required = draw(st.lists(st.sampled_from(names), unique=True))
    return {"type": "object", "required": required, "properties": properties}


@st.composite
def instances(draw, schema):
    """A value `schema` accepts: optional properties sometimes absent, extra keys sometimes."""
    value = {}
    for name, prop in schema["properties"].items():
        if name not in schema["required"] and draw(st.booleans()):
            continue
        if prop["type"] == "object":
            value[name] = draw(instances(prop))
        elif prop["type"] == "array":
            value[name] = draw(st.lists(st.text(max_size=3), max_size=2))
        else:
            value[name] = draw(SCALARS[prop["type"]])
    for extra in draw(st.lists(field_names, max_size=2)):
        value.setdefault(extra, "extra")
    return value


@st.composite
def reads(draw, schema, prefix):
    """A dotted path into `schema` (sometimes a property it does not declare)."""
    path = [prefix]
    node = schema
    while True:
        names = list(node["properties"])
        name = draw(st.sampled_from(names)) if draw(st.integers(0, 9)) else draw(field_names)
        path.append(name)
        node = node["properties"].get(name)
        if not node or node.get("type") != "object" or draw(st.booleans()):
            return ".".join(path)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_saved_definition_renders_and_evaluates_on_any_output_of_its_declared_shapes(data):
    producer = data.draw(step_names, label="producer")
    consumer = data.draw(step_names.filter(lambda n: n != producer), label="consumer")
    schema = data.draw(shapes(), label="output_schema")
    path = data.draw(reads(schema, f"steps.{producer}.output"), label="read")
    guard = data.draw(st.sampled_from(["", " | default('none')", " is defined"]), label="guard")
    template = f"{{{{ {path}{guard} }}}}"
    when = data.draw(st.sampled_from([None, f"has({path})", f"{path} == {path}"]), label="when")
    doc = {
        "name": "property",
        "input_schema": {"type": "object"},
        "steps": [
            {"name": producer, "type": "tool", "tool": "http.get", "params": {"url": "u"},
             "output_schema": schema},
            {"name": consumer, "type": "tool", "tool": "pager.page", "after": [producer],
             "params": {"message": template}, **({"when": when} if when else {})},
        ],
    }
    if validate_definition(doc, tools=TOOLS, models=MODELS):
        event("refused at save time")
        return  # refused at save time, with a path: never reaches a run
    event("saved")
    output = data.draw(instances(schema), label="output")
    context = {"input": {}, "steps": {producer: {"state": "completed", "output": output}}}
    # The scheduler evaluates `when` first, and renders params only if it holds.
    if when is None or evaluate_expression(when, context) is True:
        render_template(template, context)
