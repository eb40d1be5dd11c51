"""A sleep step at save (docs/definitions.md, "Sleep"): exactly one of `for_s` and `until`,
`for_s` within its bounds, a time zone that exists and only with `until`, an `until` template
checked like every other and a literal one read as a time; none of the fields of a step that
runs something. What saves is normalized with its time zone."""

from __future__ import annotations

import pytest

from orchestrator.engine.definitions import normalize_definition
from orchestrator.engine.definitions.limits import MAX_SLEEP_S


def definition(**nap) -> dict:
    return {
        "name": "napper",
        "input_schema": {
            "type": "object",
            "required": ["at"],
            "properties": {"at": {"type": "string"}},
        },
        "steps": [
            {
                "name": "pick",
                "type": "tool",
                "tool": "pager.page",
                "params": {"message": "hi"},
                "output_schema": {
                    "type": "object",
                    "required": ["at"],
                    "properties": {"at": {"type": "string"}},
                },
            },
            {"name": "nap", "type": "sleep", "after": ["pick"], **nap},
        ],
    }


@pytest.mark.parametrize(
    "nap",
    [
        {"for_s": 1},
        {"for_s": MAX_SLEEP_S},
        {"until": "2026-12-24T18:00:00"},
        {"until": "2026-12-24"},
        {"until": "2026-12-24T18:00:00+01:00", "timezone": "America/New_York"},
        {"until": "{{ input.at }}", "timezone": "Europe/Paris"},
        {"until": "{{ steps.pick.output.at }}"},
        {"for_s": 5, "when": "input.at != ''", "description": "a pause"},
    ],
)
def test_a_sleep_that_saves(validate, nap):
    assert validate(definition(**nap)) == []


@pytest.mark.parametrize(
    ("nap", "path", "message"),
    [
        (
            {},
            "steps[1]",
            "a sleep step needs for_s (seconds to wait) or until (a time to wait for)",
        ),
        ({"for_s": 5, "until": "2026-12-24"}, "steps[1].until", "give for_s or until, not both"),
        ({"for_s": 0}, "steps[1].for_s", "must be > 0"),
        ({"for_s": -3}, "steps[1].for_s", "must be > 0"),
        ({"for_s": MAX_SLEEP_S + 1}, "steps[1].for_s", "must be <= 7,776,000"),
        ({"for_s": 1.5}, "steps[1].for_s", "integer"),
        ({"for_s": 5, "timezone": "UTC"}, "steps[1].timezone", "timezone is only used with until"),
        (
            {"until": "2026-12-24", "timezone": "Mars/Olympus"},
            "steps[1].timezone",
            "unknown time zone 'Mars/Olympus'",
        ),
        (
            {"until": "tomorrow at noon"},
            "steps[1].until",
            "'tomorrow at noon' is not a time: expected ISO 8601",
        ),
        ({"until": ""}, "steps[1].until", "must not be empty"),
        ({"until": "{{ nothing }}"}, "steps[1].until", "unknown template variable 'nothing'"),
        ({"until": "{{ steps.nap.output }}"}, "steps[1].until", "cannot read its own output"),
        ({"until": "{{ input.at"}, "steps[1].until", "invalid template"),
        ({"for_s": 5, "timeout_s": 60}, "steps[1].timeout_s", "unknown field 'timeout_s'"),
        ({"for_s": 5, "retry": {"max_attempts": 3}}, "steps[1].retry", "unknown field 'retry'"),
        (
            {"for_s": 5, "output_schema": {"type": "object"}},
            "steps[1].output_schema",
            "unknown field",
        ),
    ],
)
def test_a_sleep_that_is_refused_says_where_and_why(validate, nap, path, message):
    problems = validate(definition(**nap))
    assert any(p.path == path and message in p.message for p in problems), problems


def test_a_sleep_may_not_be_a_step_of_a_loop_s_body(validate):
    doc = definition(for_s=5)
    doc["steps"][1] = {
        "name": "again",
        "type": "loop",
        "max_iterations": 2,
        "until": "true",
        "body": [{"name": "nap", "type": "sleep", "for_s": 5}],
    }
    problems = validate(doc)
    assert any(p.path == "steps[1].body[0].type" for p in problems), problems


def test_a_sleep_is_normalized_with_its_time_zone_and_nothing_of_a_step_that_runs(validate):
    until = normalize_definition(definition(until="2026-12-24"))["steps"][1]
    sleep_for = normalize_definition(definition(for_s=5))["steps"][1]

    assert until["timezone"] == "UTC"
    assert "timezone" not in sleep_for
    for step in (until, sleep_for):
        assert "timeout_s" not in step and "retry" not in step
        assert validate({**definition(), "steps": [definition()["steps"][0], step]}) == []
    assert normalize_definition(
        normalize_definition(definition(until="2026-12-24"))
    ) == normalize_definition(definition(until="2026-12-24"))


def test_a_sleep_written_in_python_is_the_step_its_yaml_is(validate):
    from stepwise_client.builder import Workflow

    wf = Workflow("napper", input_schema=definition()["input_schema"])
    pick = wf.tool(
        "pick", **{k: v for k, v in definition()["steps"][0].items() if k not in ("name", "type")}
    )
    wf.sleep("nap", until="{{ input.at }}", timezone="Europe/Paris", after=[pick])
    wf.sleep("rest", for_s=30, after=["nap"])

    steps = wf.to_dict()["steps"]
    assert steps[1:] == [
        {
            "name": "nap",
            "type": "sleep",
            "after": ["pick"],
            "until": "{{ input.at }}",
            "timezone": "Europe/Paris",
        },
        {"name": "rest", "type": "sleep", "after": ["nap"], "for_s": 30},
    ]
    assert validate(wf.to_dict()) == []
