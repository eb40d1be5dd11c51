"""Model calls go through the egress client: to the configured base URL only, read up to a cap."""
import socket
from functools import partial

import pytest

from orchestrator.engine.retry import StepError
from orchestrator.integrations.providers.anthropic import AnthropicProvider
from orchestrator.integrations.providers.openai_compat import OpenAICompatProvider
from tests.support.fake_llm import ask, reply, text

ask_openai = partial(ask, OpenAICompatProvider)


def test_a_base_url_on_loopback_is_the_operators_allowance_under_the_default_policy(
        fake_llm, openai_config, anthropic_config, settings):
    settings.STEPWISE_EGRESS = {}  # no loopback allowance: the registry's base_url is one
    fake_llm.then(reply({"category": "billing"}), reply({"category": "technical"}))
    assert ask_openai(openai_config).output == {"category": "billing"}
    assert ask(AnthropicProvider, anthropic_config).output == {"category": "technical"}


def test_a_base_url_whose_name_resolves_to_the_metadata_address_is_refused(
        openai_config, monkeypatch):
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        if host == "llm.internal.example":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("169.254.169.254", port))]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    config = {**openai_config, "base_url": "http://llm.internal.example/v1", "timeout_s": 2}
    with pytest.raises(StepError) as refused:
        ask_openai(config)
    assert refused.value.error_class == "policy"
    assert "169.254.169.254 is a cloud metadata address" in refused.value.message


def test_a_reply_over_the_registrys_cap_fails_permanently(fake_llm, openai_config):
    fake_llm.then(text("x" * 20_000))
    with pytest.raises(StepError) as big:
        ask_openai({**openai_config, "max_response_bytes": 10_000})
    assert big.value.error_class == "permanent"
    assert "the limit is 10000 bytes" in big.value.message


def test_a_base_url_that_is_not_http_is_an_invalid_request(openai_config):
    with pytest.raises(StepError) as bad:
        ask_openai({**openai_config, "base_url": "file:///etc"})
    assert bad.value.error_class == "invalid_request"
