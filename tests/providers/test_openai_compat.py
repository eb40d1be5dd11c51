"""The OpenAI-compatible provider against a real local server speaking chat completions."""
from functools import partial

import pytest

from orchestrator.engine.retry import StepError
from orchestrator.integrations.providers import ModelRequest
from orchestrator.integrations.providers.openai_compat import (
    AzureOpenAIProvider,
    OpenAICompatProvider,
)
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

ask = partial(ask_classification, OpenAICompatProvider)


def test_a_valid_reply_is_parsed_with_usage_and_model_version(fake_llm, openai_config):
    fake_llm.then(reply({"category": "billing"}))

    answer = ask(openai_config)

    assert answer.output == {"category": "billing"} and answer.invalid == ""
    assert (answer.tokens_in, answer.tokens_out) == (TOKENS_IN, TOKENS_OUT)
    assert answer.model_id == MODEL_VERSION


def test_the_request_uses_json_schema_mode_the_key_from_the_environment_and_the_model_id(
        fake_llm, openai_config):
    fake_llm.then(reply({"category": "billing"}))

    ask(openai_config, temperature=0.0, max_tokens=50)

    sent = fake_llm.requests[0]
    assert sent["path"] == "/v1/chat/completions"
    assert sent["headers"]["Authorization"] == "Bearer sk-test-openai"
    body = sent["body"]
    assert body["model"] == "gpt-test"
    assert body["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "respond", "schema": SCHEMA, "strict": False}}
    assert (body["temperature"], body["max_tokens"]) == (0.0, 50)
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert '"billing"' in body["messages"][0]["content"]  # the contract is stated too
    assert "tools" not in body


def test_no_key_is_sent_when_the_registry_names_none(fake_llm, openai_config):
    fake_llm.then(reply({"category": "billing"}))
    del openai_config["api_key_env"]

    ask(openai_config)

    assert "Authorization" not in fake_llm.requests[0]["headers"]


def test_a_named_but_unset_key_variable_is_an_auth_failure_without_a_call(fake_llm, openai_config,
                                                                           monkeypatch):
    monkeypatch.delenv("FAKE_OPENAI_KEY")

    with pytest.raises(StepError) as failure:
        ask(openai_config)

    assert failure.value.error_class == "auth" and "FAKE_OPENAI_KEY" in failure.value.message
    assert fake_llm.requests == []


@pytest.mark.parametrize("mode", ["json_object", "none"])
def test_plain_json_modes(fake_llm, openai_config, mode):
    fake_llm.then(reply({"category": "technical"}))
    openai_config["structured_output"] = mode

    assert ask(openai_config).output == {"category": "technical"}
    body = fake_llm.requests[0]["body"]
    assert body.get("response_format") == ({"type": "json_object"} if mode == "json_object" else None)


def test_tools_mode_offers_one_function_and_reads_its_arguments(fake_llm, openai_config):
    fake_llm.then(reply({"category": "billing"}))
    openai_config["structured_output"] = "tools"

    assert ask(openai_config).output == {"category": "billing"}
    body = fake_llm.requests[0]["body"]
    assert [t["function"]["name"] for t in body["tools"]] == ["respond"]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "respond"}}


def test_a_non_object_schema_is_wrapped_for_tools_and_unwrapped_in_the_reply(fake_llm, openai_config):
    openai_config["structured_output"] = "tools"
    fake_llm.then(reply({"value": "hello"}))
    request = ModelRequest(model="gpt-test", prompt="Say hello", output_schema={"type": "string"})

    answer = OpenAICompatProvider(openai_config).complete(request)

    assert answer.output == "hello"
    assert fake_llm.requests[0]["body"]["tools"][0]["function"]["parameters"]["required"] == ["value"]


@pytest.mark.parametrize("raw, ok", [
    ('{"category": "billing"}', True),
    ('```json\n{"category": "billing"}\n```', True),
    ('Sure! {"category": "billing"}', False),
    ('{"category": "billing"', False),
    ("", False),
    ('{"score": NaN}', False),
])
def test_malformed_json_is_an_invalid_reply_not_an_exception(fake_llm, openai_config, raw, ok):
    fake_llm.then(text(raw))

    answer = ask(openai_config)

    assert (answer.invalid == "") is ok
    assert (answer.output is not None) is ok
    assert answer.raw == raw
    assert answer.tokens_in == TOKENS_IN  # a bad reply still cost tokens


def test_extra_fields_pass_the_provider_and_are_left_to_the_executor(fake_llm, openai_config):
    fake_llm.then(reply({"category": "billing", "urgent": True}))
    assert ask(openai_config).output == {"category": "billing", "urgent": True}


def test_a_call_of_a_tool_that_was_not_offered_is_invalid(fake_llm, openai_config):
    openai_config["structured_output"] = "tools"
    fake_llm.then(call("payments.wire", {"to": "attacker", "amount": 1e6}))

    answer = ask(openai_config)

    assert answer.output is None
    assert "payments.wire" in answer.invalid and "not offered" in answer.invalid


@pytest.mark.parametrize("behaviour, error_class, retry_after", [
    (status(429, {"Retry-After": "2"}), "rate_limit", 2.0),
    (status(500), "transient", None),
    (status(503), "transient", None),
    (status(504), "timeout", None),
    (status(401), "auth", None),
    (status(400, message="context length exceeded"), "invalid_request", None),
])
def test_http_errors_are_classified(fake_llm, openai_config, behaviour, error_class, retry_after):
    fake_llm.then(behaviour)

    with pytest.raises(StepError) as failure:
        ask(openai_config)

    assert failure.value.error_class == error_class
    assert failure.value.retry_after_s == retry_after
    assert len(fake_llm.requests) == 1  # one call: no retry behind the step's policy


def test_a_slow_server_is_a_timeout(fake_llm, openai_config):
    fake_llm.then(slow(2, reply({"category": "billing"})))
    openai_config["timeout_s"] = 0.3

    with pytest.raises(StepError) as failure:
        ask(openai_config)

    assert failure.value.error_class == "timeout"


def test_the_step_deadline_caps_the_call_timeout(fake_llm, openai_config):
    fake_llm.then(slow(2, reply({"category": "billing"})))

    with pytest.raises(StepError) as failure:
        ask(openai_config, timeout_s=0.3)

    assert failure.value.error_class == "timeout"


def test_nothing_listening_is_transient(openai_config):
    openai_config["base_url"] = "http://127.0.0.1:9/v1"
    with pytest.raises(StepError) as failure:
        ask(openai_config)
    assert failure.value.error_class == "transient"


def test_a_cut_off_reply_is_invalid(fake_llm, openai_config):
    fake_llm.then(text('{"category": "bil'))
    answer = ask(openai_config)
    assert answer.invalid


def test_repair_turns_follow_the_prompt(fake_llm, openai_config):
    fake_llm.then(reply({"category": "billing"}))
    turns = ({"role": "assistant", "content": "nope"}, {"role": "user", "content": "fix it"})

    ask(openai_config, messages=turns)

    roles = [m["role"] for m in fake_llm.requests[0]["body"]["messages"]]
    assert roles == ["system", "user", "assistant", "user"]


def test_azure_sends_the_key_in_api_key_and_the_api_version(fake_llm, openai_config, monkeypatch):
    monkeypatch.setenv("AZURE_OPENAI_API_KEY", "azure-key")
    config = {"provider": "azure_openai", "base_url": fake_llm.openai_base_url,
              "api_version": "2024-10-21", "model_id": "my-deployment"}
    fake_llm.then(reply({"category": "billing"}))

    answer = AzureOpenAIProvider(config).complete(
        ModelRequest(model="my-deployment", prompt="x", output_schema=SCHEMA))

    sent = fake_llm.requests[0]
    assert answer.output == {"category": "billing"}
    assert sent["path"] == "/v1/chat/completions?api-version=2024-10-21"
    assert sent["headers"]["api-key"] == "azure-key" and "Authorization" not in sent["headers"]
