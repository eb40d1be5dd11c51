"""Structured output as a contract: valid output flows on, bad output is repaired within the
bound or the attempt fails as invalid_output with every call's tokens charged."""
from decimal import Decimal

import pytest

from budgets.services import cost_of
from orchestrator.engine.executors import ATTEMPT_META_FIELDS, SpentStepError
from orchestrator.engine.executors.agent import Conversation
from orchestrator.engine.retry import StepError
from tests.support.fake_llm import MODEL_VERSION, TOKENS_IN, TOKENS_OUT, reply, status, text

pytestmark = pytest.mark.django_db
VALID = {"category": "billing", "urgency": 2}
TICKET = {"body": "my invoice is wrong"}


def classify(model: str = "gpt", **fields) -> dict:
    return {"name": "classify", "type": "agent", "model": model, "timeout_s": 30,
            "prompt": "Classify: {{ input.body }}", "system": "You classify tickets.",
            "output_schema": {"type": "object", "required": ["category", "urgency"],
                              "properties": {"category": {"enum": ["billing", "technical"]},
                                             "urgency": {"type": "integer"}}},
            "repair_attempts": 1, **fields}


@pytest.mark.parametrize("model", ["gpt", "claude"])
def test_valid_output_flows_on_with_usage_cost_and_versions(fake_llm, models, run_step, model):
    fake_llm.then(reply(VALID))

    result = run_step(classify(model), TICKET)

    assert result.output == VALID
    assert (result.tokens_in, result.tokens_out) == (TOKENS_IN, TOKENS_OUT)
    prices = models[model]
    expected = (Decimal(str(prices["input_usd_per_mtok"])) * TOKENS_IN
                + Decimal(str(prices["output_usd_per_mtok"])) * TOKENS_OUT) / 1_000_000
    assert result.cost_usd == expected
    assert (result.model, result.provider) == (model, prices["provider"])
    assert set(result.meta) <= set(ATTEMPT_META_FIELDS)
    assert result.meta["model_id"] == MODEL_VERSION
    assert result.meta["repair_count"] == 0
    assert len(result.meta["prompt_hash"]) == len(result.meta["schema_hash"]) == 64


@pytest.mark.parametrize("bad", [
    text("Sure, here it is: billing"),                        # not JSON
    text('{"category": "billing", "urgency": 2'),             # truncated
    reply({**VALID, "note": "extra"}),                        # an extra field
    reply({"category": "refunds", "urgency": 2}),             # an unknown enum value
    reply({"category": "billing"}),                           # a missing field
    reply({"category": "billing", "urgency": "2"}),           # a wrong type
])
def test_bad_output_is_repaired_within_the_bound(fake_llm, run_step, bad):
    fake_llm.then(bad, reply(VALID))

    result = run_step(classify(), TICKET)

    assert result.output == VALID
    assert (result.tokens_in, result.tokens_out) == (2 * TOKENS_IN, 2 * TOKENS_OUT)
    assert result.meta["repair_count"] == 1
    repair = fake_llm.requests[1]["body"]["messages"]
    assert [m["role"] for m in repair] == ["system", "user", "assistant", "user"]
    assert repair[2]["content"] == (bad.value if bad.kind == "text" else repair[2]["content"])
    assert "rejected" in repair[3]["content"]


def test_the_repair_message_names_the_problems(fake_llm, run_step):
    fake_llm.then(reply({**VALID, "note": "extra"}), reply(VALID))

    run_step(classify(), TICKET)

    repair = fake_llm.requests[1]["body"]["messages"][-1]["content"]
    assert "'note' was unexpected" in repair


def test_after_the_bound_the_attempt_fails_as_invalid_output_with_every_call_charged(
        fake_llm, run_step):
    fake_llm.then(text("nope"), text("still nope"), text("never"))

    with pytest.raises(SpentStepError) as failure:
        run_step(classify(repair_attempts=2), TICKET)

    error = failure.value
    assert error.error_class == "invalid_output"
    assert "after 2 repair(s)" in error.message
    assert len(fake_llm.requests) == 3
    assert (error.spent.tokens_in, error.spent.tokens_out) == (3 * TOKENS_IN, 3 * TOKENS_OUT)
    assert error.spent.cost_usd > 0 and error.spent.output is None
    assert error.spent.meta["repair_count"] == 2


def test_no_repair_when_the_bound_is_zero(fake_llm, run_step):
    fake_llm.then(text("nope"), reply(VALID))

    with pytest.raises(StepError) as failure:
        run_step(classify(repair_attempts=0), TICKET)

    assert failure.value.error_class == "invalid_output"
    assert len(fake_llm.requests) == 1


def test_a_rate_limit_during_a_repair_keeps_the_tokens_already_spent(fake_llm, run_step):
    fake_llm.then(text("nope"), status(429, {"Retry-After": "3"}))

    with pytest.raises(SpentStepError) as failure:
        run_step(classify(), TICKET)

    error = failure.value
    assert (error.error_class, error.retry_after_s) == ("rate_limit", 3.0)
    assert error.spent.tokens_in == TOKENS_IN


def test_the_scripted_provider_is_never_asked_to_repair(run_step):
    # Valid for the save-time check, which is not strict; rejected at run time (extra field).
    spec = classify("fast", script=[{"output": {**VALID, "note": "extra"}}])

    with pytest.raises(StepError) as failure:
        run_step(spec, TICKET)

    assert failure.value.error_class == "invalid_output"
    assert "after 0 repair(s)" in failure.value.message


def test_a_model_missing_from_the_worker_registry_is_a_permanent_failure(models):
    with pytest.raises(StepError) as failure:
        Conversation.start(classify("gpt-9"), price=cost_of)
    assert failure.value.error_class == "permanent"


def test_the_prompt_hash_changes_with_the_template_not_with_the_input(fake_llm, run_step):
    fake_llm.then(reply(VALID), reply(VALID), reply(VALID))
    first = run_step(classify(), TICKET).meta["prompt_hash"]
    other_input = run_step(classify(), {"body": "something else"}).meta["prompt_hash"]
    changed = run_step(classify(prompt="Categorize: {{ input.body }}"), TICKET).meta["prompt_hash"]

    assert other_input == first
    assert changed != first
