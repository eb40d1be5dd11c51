"""The fingerprint of a reusable step result (services/results_cache.py): the rendered key
joined with everything that decides the output; and when a step may be reused at all."""
import copy

import pytest

from orchestrator.engine.retry import StepError
from orchestrator.engine.services.results_cache import fingerprint_of, reusable
from orchestrator.integrations.tools.registry import _TOOLS, Tool

AGENT = {"name": "classify", "type": "agent", "model": "fast", "prompt": "Classify {{ input.body }}",
         "system": "", "output_schema": {"type": "object"}, "timeout_s": 30,
         "cache": {"key": "{{ input.ticket }}", "ttl_s": 60}}
TOOL = {"name": "look", "type": "tool", "tool": "cache.test_lookup", "params": {"q": "{{ input.ticket }}"},
        "cache": {"key": "{{ input.ticket }}", "ttl_s": 60}}
STEP_INPUT = {"input": {"ticket": "T-1", "body": "my invoice"}, "steps": {}}


def changed(spec: dict, **fields) -> dict:
    spec = copy.deepcopy(spec)
    spec.update(fields)
    return spec


@pytest.fixture
def lookup_tool():
    def register(**fields):
        _TOOLS["cache.test_lookup"] = Tool("cache.test_lookup", lambda params, ctx: {},
                                           {"type": "object"}, **fields)
    register()
    yield register
    _TOOLS.pop("cache.test_lookup", None)


def test_the_same_step_over_the_same_key_has_the_same_fingerprint():
    other_body = {"input": {"ticket": "T-1", "body": "another text"}, "steps": {}}

    assert fingerprint_of(AGENT, STEP_INPUT) == fingerprint_of(AGENT, other_body)
    assert fingerprint_of(AGENT, STEP_INPUT)[1] == "T-1"


@pytest.mark.parametrize("edit", [
    {"prompt": "Classify, briefly: {{ input.body }}"},
    {"system": "You are terse."},
    {"model": "deep"},
    {"output_schema": {"type": "object", "required": ["category"]}},
    {"temperature": 0.5},
    {"cache": {"key": "{{ input.ticket }}:{{ input.body }}", "ttl_s": 60}},
])
def test_what_decides_the_output_changes_the_fingerprint(edit):
    assert fingerprint_of(changed(AGENT, **edit), STEP_INPUT) != fingerprint_of(AGENT, STEP_INPUT)


def test_another_key_value_changes_the_fingerprint_but_the_ttl_does_not():
    other_ticket = {"input": {"ticket": "T-2", "body": "my invoice"}, "steps": {}}

    assert fingerprint_of(AGENT, other_ticket) != fingerprint_of(AGENT, STEP_INPUT)
    assert (fingerprint_of(changed(AGENT, cache={"key": "{{ input.ticket }}", "ttl_s": 9}), STEP_INPUT)
            == fingerprint_of(AGENT, STEP_INPUT))


def test_the_models_provider_and_model_id_in_the_registry_change_the_fingerprint(settings):
    before = fingerprint_of(AGENT, STEP_INPUT)
    settings.STEPWISE_MODELS = {**settings.STEPWISE_MODELS,
                                "fast": {**settings.STEPWISE_MODELS["fast"], "model_id": "fast-2"}}
    assert fingerprint_of(AGENT, STEP_INPUT) != before
    settings.STEPWISE_MODELS = {**settings.STEPWISE_MODELS,
                                "fast": {**settings.STEPWISE_MODELS["fast"], "provider": "openai"}}
    assert fingerprint_of(AGENT, STEP_INPUT) != before


def test_a_new_tool_version_or_output_schema_changes_the_fingerprint(lookup_tool):
    before = fingerprint_of(TOOL, STEP_INPUT)
    lookup_tool(version="2")
    assert fingerprint_of(TOOL, STEP_INPUT) != before
    lookup_tool(output_schema={"type": "object", "required": ["rows"]})
    assert fingerprint_of(TOOL, STEP_INPUT) != before


def test_a_key_that_cannot_be_rendered_fails_the_attempt_as_validation():
    with pytest.raises(StepError) as error:
        fingerprint_of(changed(AGENT, cache={"key": "{{ input.missing }}", "ttl_s": 60}), STEP_INPUT)

    assert error.value.error_class == "validation" and "cache key" in error.value.message


def test_only_a_live_run_without_secrets_and_a_step_without_effects_is_reused(lookup_tool):
    assert reusable(AGENT, sandbox=None, sealed=None)
    assert reusable(TOOL, sandbox=None, sealed=None)
    assert not reusable({**AGENT, "cache": None}, sandbox=None, sealed=None)
    assert not reusable(AGENT, sandbox={"purpose": "evaluation"}, sealed=None)
    assert not reusable(AGENT, sandbox=None, sealed="sealed-secrets")
    assert not reusable({**TOOL, "side_effect": True}, sandbox=None, sealed=None)
    assert not reusable({**TOOL, "tool": "no.such_tool"}, sandbox=None, sealed=None)
    lookup_tool(side_effect=True)  # registered as changing the world after the step was saved
    assert not reusable(TOOL, sandbox=None, sealed=None)
