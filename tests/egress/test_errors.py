"""How a step classifies a call that got no usable response (`as_step_error`, from the mutation
survivors of orchestrator/integrations/egress/errors.py): each class of the retry table in
docs/failure-semantics.md, and the words the step's error keeps."""

import httpx
import pytest
from django.core.exceptions import ImproperlyConfigured

from orchestrator.integrations.egress import EgressRefused, ResponseTooLarge, as_step_error

REFUSED = EgressRefused("http://10.0.0.1/", "10.0.0.1 is a private address")
TOO_LARGE = ResponseTooLarge("http://api.example.com/big", 1024, declared=2048)


@pytest.mark.parametrize(
    "error, error_class, message",
    [
        (
            REFUSED,
            "policy",
            "egress policy refuses http://10.0.0.1/: 10.0.0.1 is a private address",
        ),
        (
            ImproperlyConfigured("STEPWISE_EGRESS must be a JSON object"),
            "policy",
            "the egress policy setting is malformed: STEPWISE_EGRESS must be a JSON object",
        ),
        (
            TOO_LARGE,
            "permanent",
            "the response of http://api.example.com/big declares 2048 bytes; the limit is 1024 "
            "bytes (max_response_bytes in STEPWISE_EGRESS)",
        ),
        (
            httpx.ReadTimeout("the call's deadline of 5 s passed"),
            "timeout",
            "ReadTimeout: the call's deadline of 5 s passed",
        ),
        (httpx.ConnectTimeout("timed out"), "timeout", "ConnectTimeout: timed out"),
        (httpx.InvalidURL("Invalid port: 'x'"), "invalid_request", "InvalidURL: Invalid port: 'x'"),
        (
            httpx.UnsupportedProtocol("Request URL has an unsupported protocol 'ftp://'."),
            "invalid_request",
            "UnsupportedProtocol: Request URL has an unsupported protocol 'ftp://'.",
        ),
        (
            httpx.ConnectError("[Errno 111] Connection refused"),
            "transient",
            "ConnectError: [Errno 111] Connection refused",
        ),
        (
            httpx.RemoteProtocolError("Server disconnected"),
            "transient",
            "RemoteProtocolError: Server disconnected",
        ),
    ],
)
def test_each_failure_is_classified_with_its_words(error, error_class, message):
    step_error = as_step_error(error)
    assert (step_error.error_class, step_error.message) == (error_class, message)


def test_a_long_message_is_cut_to_300_characters_with_its_errors_name_first():
    step_error = as_step_error(httpx.ConnectError("x" * 1000))
    assert step_error.message == ("ConnectError: " + "x" * 1000)[:300]
    assert (
        as_step_error(EgressRefused("http://a/", "y" * 1000)).message
        == ("egress policy refuses http://a/: " + "y" * 1000)[:300]
    )
