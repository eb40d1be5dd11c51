"""A step's `cache` (docs/definitions.md#cache): accepted on agent, tool and llm router steps
whose results may be reused, refused with its path everywhere else."""

from __future__ import annotations

import pytest

from orchestrator.engine.definitions import validate_definition

from .examples import MODELS, TOOLS, WORKFLOWS

CACHE = {"key": "{{ input.ticket_id }}", "ttl_s": 3600}


def step_named(doc: dict, name: str) -> dict:
    return next(s for s in doc["steps"] if s["name"] == name)


def problems_at(problems, path: str) -> list[str]:
    return [p.message for p in problems if p.path == path]


def test_an_agent_step_and_a_reading_tool_step_may_be_reused(support_workflow, validate):
    step_named(support_workflow, "classify")["cache"] = dict(CACHE)
    step_named(support_workflow, "fetch_history")["cache"] = {
        "key": "{{ input.ticket_id }}:{{ steps.classify.output.category }}", "ttl_s": 60}

    assert validate(support_workflow) == []


def test_an_llm_router_may_be_reused(routing_workflow, validate):
    route = step_named(routing_workflow, "route")
    route.update(strategy="llm", model="fast", prompt="Route {{ input.body }}", cache=dict(CACHE))
    for r in route["routes"]:
        r.pop("when")
        r["description"] = f"the {r['name']} tickets"
    route["cache"]["key"] = "{{ input.body }}"

    assert validate(routing_workflow) == []


def test_a_step_with_side_effect_true_is_refused(support_workflow, validate):
    step_named(support_workflow, "send")["cache"] = dict(CACHE)

    [message] = problems_at(validate(support_workflow), "steps[5].cache")
    assert "side_effect: true is never reused" in message


def test_a_step_of_a_tool_declared_side_effecting_is_refused(support_workflow):
    step_named(support_workflow, "fetch_history")["cache"] = dict(CACHE)

    problems = validate_definition(support_workflow, tools=TOOLS, models=MODELS,
                                   workflows=WORKFLOWS.get, side_effect_tools={"http.get"})

    [message] = problems_at(problems, "steps[2].cache")
    assert "tool 'http.get' changes the world" in message


def test_the_service_knows_which_registered_tools_are_side_effecting(db):
    from orchestrator.engine.services.workflows import definition_problems
    from orchestrator.models import Team

    definition = {
        "name": "cached-send", "input_schema": {"type": "object"},
        "steps": [{"name": "send", "type": "tool", "tool": "mail.send", "params": {},
                   "cache": dict(CACHE, key="x")}],
    }
    problems = definition_problems(definition, team=Team.objects.create(slug="t", name="t"))

    assert any(p.path == "steps[0].cache" and "changes the world" in p.message for p in problems), problems


@pytest.mark.parametrize(("kind", "name", "why"), [
    ("human_gate", "approve", "a person decides it"),
])
def test_a_gate_is_refused(support_workflow, validate, kind, name, why):
    step_named(support_workflow, name)["cache"] = dict(CACHE)

    [message] = problems_at(validate(support_workflow), "steps[4].cache")
    assert f"a {kind} step's result is never reused: {why}" in message


@pytest.mark.parametrize(("name", "index", "fragment"), [
    ("summarize_each", 3, "a map step's result is never reused"),
    ("archive", 4, "a sub_workflow step's result is never reused"),
    ("route", 1, "'cache' is only used with strategy: llm"),
])
def test_maps_sub_workflows_and_rule_routers_are_refused(routing_workflow, validate, name,
                                                         index, fragment):
    step_named(routing_workflow, name)["cache"] = dict(CACHE, key="{{ input.body }}")

    [message] = problems_at(validate(routing_workflow), f"steps[{index}].cache")
    assert fragment in message


def test_a_map_item_is_refused(routing_workflow, validate):
    step_named(routing_workflow, "summarize_each")["item"]["cache"] = dict(CACHE, key="{{ item }}")

    problems = validate(routing_workflow)

    assert any(p.path == "steps[3].item.cache" for p in problems), problems


@pytest.mark.parametrize(("step", "fragment"), [
    ({"name": "pause", "type": "sleep", "for_s": 5}, "a sleep step's result is never reused"),
    ({"name": "reply", "type": "wait", "signal": "answer"}, "a wait step's result is never reused"),
    ({"name": "again", "type": "loop", "max_iterations": 2, "until": "true",
      "body": [{"name": "draft", "type": "tool", "tool": "http.get",
                "params": {"url": "https://a.example/"}}]},
     "a loop step's result is never reused"),
])
def test_waiting_and_looping_steps_are_refused(validate, step, fragment):
    doc = {"name": "w", "input_schema": {"type": "object"},
           "steps": [{**step, "cache": dict(CACHE, key="k")}]}

    [message] = problems_at(validate(doc), "steps[0].cache")
    assert fragment in message


def test_a_step_in_a_loop_body_is_refused(validate):
    doc = {"name": "w", "input_schema": {"type": "object"}, "steps": [{
        "name": "again", "type": "loop", "max_iterations": 2, "until": "true",
        "body": [{"name": "draft", "type": "tool", "tool": "http.get",
                  "params": {"url": "https://a.example/"}, "cache": dict(CACHE, key="k")}]}]}

    [message] = problems_at(validate(doc), "steps[0].body[0].cache")
    assert "loop's body is never reused" in message


@pytest.mark.parametrize(("ttl", "fragment"), [
    (0, "must be > 0"),
    (-5, "must be > 0"),
    (10 ** 9, "must be <="),
    ("1h", "must be"),
    (1.5, "must be"),
])
def test_a_bad_ttl_is_refused(support_workflow, validate, ttl, fragment):
    step_named(support_workflow, "classify")["cache"] = dict(CACHE, ttl_s=ttl)

    [message] = problems_at(validate(support_workflow), "steps[0].cache.ttl_s")
    assert fragment in message


@pytest.mark.parametrize(("cache", "path", "fragment"), [
    ({"ttl_s": 60}, "steps[0].cache", "missing required field 'key'"),
    ({"key": "k"}, "steps[0].cache", "missing required field 'ttl_s'"),
    ({"key": "{{ input.nothing_here }}", "ttl_s": 60}, "steps[0].cache.key", "nothing_here"),
    ({"key": "{{ steps.draft.output }}", "ttl_s": 60}, "steps[0].cache.key", "draft"),
    ({"key": "k", "ttl_s": 60, "scope": "global"}, "steps[0].cache.scope", "unknown field"),
])
def test_a_bad_key_or_a_missing_field_is_refused(support_workflow, validate, cache, path, fragment):
    step_named(support_workflow, "classify")["cache"] = cache

    messages = problems_at(validate(support_workflow), path)
    assert messages and fragment in messages[0], validate(support_workflow)


def test_a_key_that_reads_a_secret_input_is_refused(support_workflow, validate):
    support_workflow["input_schema"]["properties"]["api_token"] = {"type": "string",
                                                                   "writeOnly": True}
    support_workflow["input_schema"]["required"].append("api_token")
    step_named(support_workflow, "classify")["cache"] = dict(
        CACHE, key="{{ input.ticket_id }}:{{ input['api_token'] }}")

    [message] = problems_at(validate(support_workflow), "steps[0].cache.key")
    assert "reads input.api_token, a secret input" in message
