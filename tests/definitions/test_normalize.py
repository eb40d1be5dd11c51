"""normalize_definition: every default written out, nothing the author wrote changed."""

from __future__ import annotations

import copy

from orchestrator.engine.definitions import normalize_definition

RETRY_DEFAULTS = {
    "max_attempts": 1,
    "backoff": "exponential",
    "base_s": 2,
    "max_s": 60,
    "jitter": True,
    "retry_on": ["timeout", "rate_limit", "transient"],
}


def by_name(doc):
    return {step["name"]: step for step in doc["steps"]}


def test_top_level_defaults_are_filled():
    doc = {
        "name": "tiny",
        "input_schema": {},
        "steps": [{"name": "a", "type": "human_gate", "approvers": "ops"}],
    }

    normalized = normalize_definition(doc)

    assert normalized["on_error"] == "fail"
    assert normalized["max_parallel"] == 10
    assert normalized["description"] == ""
    assert normalized["budget"] == {"max_cost_usd": None, "max_duration_s": None, "on_duration": "pause"}


def test_step_defaults_are_filled(support_workflow):
    steps = by_name(normalize_definition(support_workflow))

    classify = steps["classify"]
    assert classify["after"] == []
    assert classify["when"] is None
    assert classify["join"] == "all"
    assert classify["fallback"] is None
    assert classify["description"] == ""
    assert classify["retry"] == RETRY_DEFAULTS
    assert classify["timeout_s"] == 30  # written by the author, kept
    assert steps["research"]["timeout_s"] == 300
    assert steps["approve"]["timeout_s"] == 14400
    assert steps["research"]["retry"] == {
        **RETRY_DEFAULTS,
        "max_attempts": 3,
        "base_s": 1,
        "max_s": 30,
    }
    assert steps["fetch_history"]["side_effect"] is False
    assert steps["send"]["side_effect"] is True
    assert steps["research"]["script"] == []


def test_human_gate_defaults_to_one_day():
    doc = {
        "name": "gate",
        "input_schema": {},
        "steps": [{"name": "ok", "type": "human_gate", "approvers": "ops"}],
    }
    assert normalize_definition(doc)["steps"][0]["timeout_s"] == 86400


def test_type_specific_defaults_are_filled(routing_workflow):
    for step in routing_workflow["steps"]:
        step.pop("merge", None)
        step.pop("input", None)
        step.pop("params", None)

    steps = by_name(normalize_definition(routing_workflow))

    assert steps["route"]["strategy"] == "rules"
    assert steps["summarize_each"]["merge"] == "list"
    assert steps["archive"]["input"] == {}
    assert steps["page_oncall"]["params"] == {}
    item = steps["summarize_each"]["item"]
    assert item["timeout_s"] == 300
    assert item["retry"] == RETRY_DEFAULTS
    assert item["description"] == ""


def test_compensation_params_default_to_empty_and_its_retry_to_the_steps():
    doc = {
        "name": "comp",
        "input_schema": {},
        "steps": [{"name": "pay", "type": "tool", "tool": "pay", "retry": {"max_attempts": 4},
                   "compensate": {"tool": "refund"}}],
    }
    step = normalize_definition(doc)["steps"][0]
    assert step["compensate"] == {"tool": "refund", "params": {}, "retry": step["retry"]}
    assert step["compensate"]["retry"]["max_attempts"] == 4


def test_a_compensations_own_retry_keeps_what_it_sets_and_takes_the_rest_from_the_step():
    doc = {
        "name": "comp",
        "input_schema": {},
        "steps": [{"name": "pay", "type": "tool", "tool": "pay", "retry": {"max_attempts": 4, "base_s": 7},
                   "compensate": {"tool": "refund", "retry": {"max_attempts": 9}}}],
    }
    retry = normalize_definition(doc)["steps"][0]["compensate"]["retry"]
    assert (retry["max_attempts"], retry["base_s"]) == (9, 7)


def test_normalization_does_not_mutate_its_input(support_workflow):
    before = copy.deepcopy(support_workflow)
    normalized = normalize_definition(support_workflow)
    normalized["steps"][0]["retry"]["retry_on"].append("invalid_output")

    assert support_workflow == before
    assert (
        normalize_definition(support_workflow)["steps"][0]["retry"]["retry_on"]
        == RETRY_DEFAULTS["retry_on"]
    )


def test_normalized_definition_is_still_valid_and_a_fixed_point(
    support_workflow, routing_workflow, validate
):
    for doc in (support_workflow, routing_workflow):
        normalized = normalize_definition(doc)
        assert validate(normalized) == []
        assert normalize_definition(normalized) == normalized
