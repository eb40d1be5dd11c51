"""A wait step at save (docs/definitions.md, "wait"): a signal name, a payload schema that is a
schema, a correlation key template checked like every other, a timeout within its bound, an
`on_timeout` that is `fail`, `continue` or a step after it, `early_signals` buffer or refuse;
none of the fields of a step that runs something. What saves is normalized with its defaults."""

from __future__ import annotations

import pytest

from orchestrator.engine.definitions import normalize_definition
from orchestrator.engine.definitions.limits import MAX_WAIT_S


def definition(**wait) -> dict:
    return {
        "name": "order",
        "input_schema": {
            "type": "object",
            "required": ["order_id"],
            "properties": {"order_id": {"type": "string"}},
        },
        "steps": [
            {"name": "place", "type": "tool", "tool": "pager.page", "params": {"message": "hi"}},
            {"name": "payment", "type": "wait", "after": ["place"], **wait},
            {"name": "ship", "type": "tool", "tool": "pager.page", "after": ["payment"],
             "params": {"message": "ship"}},
            {"name": "cancel", "type": "tool", "tool": "pager.page", "after": ["payment"],
             "params": {"message": "cancel"}},
        ],
    }


@pytest.mark.parametrize(
    "wait",
    [
        {"signal": "paid"},
        {"signal": "paid", "schema": {"type": "object", "required": ["amount"]}},
        {"signal": "paid", "correlation_key": "{{ input.order_id }}"},
        {"signal": "paid", "correlation_key": "order-{{ input.order_id }}", "timeout_s": MAX_WAIT_S},
        {"signal": "paid", "on_timeout": "continue", "early_signals": "refuse"},
        {"signal": "paid", "on_timeout": "cancel"},
    ],
)
def test_a_wait_that_saves(validate, wait):
    assert validate(definition(**wait)) == []


@pytest.mark.parametrize(
    ("wait", "path", "message"),
    [
        ({}, "steps[1]", "signal"),
        ({"signal": "Paid!"}, "steps[1].signal", "'Paid!' is not a valid name"),
        ({"signal": "paid", "schema": {"type": "nonsense"}}, "steps[1].schema.type",
         "unknown JSON Schema type 'nonsense'"),
        ({"signal": "paid", "schema": 3}, "steps[1].schema", ""),
        ({"signal": "paid", "correlation_key": "{{ nothing }}"}, "steps[1].correlation_key",
         "unknown template variable 'nothing'"),
        ({"signal": "paid", "correlation_key": "{{ steps.ship.output }}"},
         "steps[1].correlation_key", "ship"),
        ({"signal": "paid", "correlation_key": ""}, "steps[1].correlation_key", "must not be empty"),
        ({"signal": "paid", "timeout_s": 0}, "steps[1].timeout_s", "must be > 0"),
        ({"signal": "paid", "timeout_s": MAX_WAIT_S + 1}, "steps[1].timeout_s",
         "must be <= 7,776,000"),
        ({"signal": "paid", "on_timeout": "nowhere"}, "steps[1].on_timeout",
         "'nowhere' is neither fail, continue nor a step of this workflow"),
        ({"signal": "paid", "on_timeout": "payment"}, "steps[1].on_timeout",
         "cannot route its timeout to itself"),
        ({"signal": "paid", "on_timeout": "place"}, "steps[1].on_timeout",
         "step 'place' must list 'payment' in its after"),
        ({"signal": "paid", "on_timeout": "cancel", "fallback": "ship"}, "steps[1].fallback",
         "has no fallback"),
        ({"signal": "paid", "early_signals": "keep"}, "steps[1].early_signals", "buffer"),
        ({"signal": "paid", "retry": {"max_attempts": 3}}, "steps[1].retry", "unknown field"),
        ({"signal": "paid", "output_schema": {}}, "steps[1].output_schema", "unknown field"),
    ],
)
def test_a_wait_that_is_refused_says_where_and_why(validate, wait, path, message):
    problems = validate(definition(**wait))
    assert any(p.path == path and message in p.message for p in problems), problems


def test_a_wait_may_not_be_a_step_of_a_loop_s_body(validate):
    doc = definition(signal="paid")
    doc["steps"][1] = {
        "name": "again", "type": "loop", "max_iterations": 2, "until": "true",
        "body": [{"name": "payment", "type": "wait", "signal": "paid"}],
    }
    doc["steps"] = doc["steps"][:2]
    problems = validate(doc)
    assert any(p.path == "steps[1].body[0].type" for p in problems), problems


def test_a_wait_is_normalized_with_its_defaults_and_nothing_of_a_step_that_runs(validate):
    step = normalize_definition(definition(signal="paid"))["steps"][1]

    assert (step["timeout_s"], step["on_timeout"], step["early_signals"]) == (86400, "fail", "buffer")
    assert "retry" not in step
    doc = definition()
    doc["steps"][1] = step
    assert validate(doc) == []


def test_a_wait_written_in_python_is_the_step_its_yaml_is(validate):
    from stepwise_client.builder import Workflow

    doc = definition()
    wf = Workflow("order", input_schema=doc["input_schema"])
    place = wf.tool("place", tool="pager.page", params={"message": "hi"})
    wf.wait("payment", signal="paid", correlation_key="{{ input.order_id }}", timeout_s=60,
            on_timeout="cancel", after=[place])
    wf.tool("cancel", tool="pager.page", params={"message": "cancel"}, after=["payment"])

    assert wf.to_dict()["steps"][1] == {
        "name": "payment", "type": "wait", "after": ["place"], "signal": "paid",
        "correlation_key": "{{ input.order_id }}", "timeout_s": 60, "on_timeout": "cancel",
    }
    assert validate(wf.to_dict()) == []
