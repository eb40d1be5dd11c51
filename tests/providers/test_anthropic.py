"""The Anthropic Messages provider against a real local server speaking /v1/messages."""
from functools import partial

import pytest

from orchestrator.engine.retry import StepError
from orchestrator.integrations.providers.anthropic import AnthropicProvider
from tests.support.fake_llm import (
    MODEL_VERSION,
    SCHEMA,
    TOKENS_IN,
    TOKENS_OUT,
    call,
    reply,
    slow,
    status,
    text,
)
from tests.support.fake_llm import ask as ask_classification

ask = partial(ask_classification, AnthropicProvider)


def test_the_answer_is_a_forced_call_of_the_respond_tool(fake_llm, anthropic_config):
    fake_llm.then(reply({"category": "billing"}))

    answer = ask(anthropic_config)

    assert answer.output == {"category": "billing"} and answer.invalid == ""
    assert (answer.tokens_in, answer.tokens_out, answer.model_id) == (TOKENS_IN, TOKENS_OUT, MODEL_VERSION)
    sent = fake_llm.requests[0]
    assert sent["path"] == "/v1/messages"
    assert sent["headers"]["x-api-key"] == "sk-ant-test"
    assert sent["headers"]["anthropic-version"] == "2023-06-01"
    body = sent["body"]
    assert body["model"] == "claude-test" and body["max_tokens"] == 1024
    assert body["tools"] == [{"name": "respond", "description": "Submit your answer.",
                              "input_schema": SCHEMA}]
    assert body["tool_choice"] == {"type": "tool", "name": "respond"}
    assert body["system"].startswith("You classify tickets.")
    assert [m["role"] for m in body["messages"]] == ["user"]


def test_text_mode_parses_a_json_reply(fake_llm, anthropic_config):
    anthropic_config["structured_output"] = "none"
    fake_llm.then(reply({"category": "technical"}))

    assert ask(anthropic_config).output == {"category": "technical"}
    assert "tools" not in fake_llm.requests[0]["body"]


def test_malformed_text_is_an_invalid_reply(fake_llm, anthropic_config):
    anthropic_config["structured_output"] = "none"
    fake_llm.then(text("I think it is billing."))

    answer = ask(anthropic_config)

    assert answer.output is None and "not valid JSON" in answer.invalid


def test_a_tool_use_of_another_tool_is_invalid_and_never_run(fake_llm, anthropic_config):
    fake_llm.then(call("shell.exec", {"cmd": "rm -rf /"}))

    answer = ask(anthropic_config)

    assert answer.output is None and "shell.exec" in answer.invalid


def test_the_api_key_defaults_to_anthropic_api_key(fake_llm, anthropic_config, monkeypatch):
    del anthropic_config["api_key_env"]
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)

    with pytest.raises(StepError) as failure:
        ask(anthropic_config)

    assert failure.value.error_class == "auth" and "ANTHROPIC_API_KEY" in failure.value.message


@pytest.mark.parametrize("behaviour, error_class, retry_after", [
    (status(429, {"retry-after": "4"}), "rate_limit", 4.0),
    (status(529), "transient", None),
    (status(500), "transient", None),
    (status(403), "auth", None),
    (status(400), "invalid_request", None),
])
def test_http_errors_are_classified(fake_llm, anthropic_config, behaviour, error_class, retry_after):
    fake_llm.then(behaviour)

    with pytest.raises(StepError) as failure:
        ask(anthropic_config)

    assert (failure.value.error_class, failure.value.retry_after_s) == (error_class, retry_after)


def test_a_slow_server_is_a_timeout(fake_llm, anthropic_config):
    fake_llm.then(slow(2, reply({"category": "billing"})))
    anthropic_config["timeout_s"] = 0.3

    with pytest.raises(StepError) as failure:
        ask(anthropic_config)

    assert failure.value.error_class == "timeout"


def test_repair_turns_alternate_roles(fake_llm, anthropic_config):
    fake_llm.then(reply({"category": "billing"}))
    turns = ({"role": "assistant", "content": ""}, {"role": "user", "content": "fix it"})

    ask(anthropic_config, messages=turns)

    messages = fake_llm.requests[0]["body"]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[1]["content"] == "(empty reply)"  # the API rejects empty turns
