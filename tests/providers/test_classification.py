"""Every HTTP outcome and transport failure maps to one error class the retry policy knows."""
from datetime import timedelta
from email.utils import format_datetime

import httpx
import pytest

from orchestrator.engine.clock import now
from orchestrator.engine.retry import ERROR_CLASSES, NEVER_RETRIED
from orchestrator.integrations.providers.errors import (
    classify_exception,
    classify_status,
    retry_after_s,
)


@pytest.mark.parametrize("status, error_class", [
    (429, "rate_limit"),
    (408, "timeout"),
    (504, "timeout"),
    (500, "transient"),
    (502, "transient"),
    (503, "transient"),
    (529, "transient"),  # Anthropic "overloaded"
    (401, "auth"),
    (403, "auth"),
    (400, "invalid_request"),
    (404, "invalid_request"),
    (413, "invalid_request"),
    (422, "invalid_request"),
])
def test_http_status_is_classified(status, error_class):
    error = classify_status(status, {}, '{"error": {"message": "nope"}}')
    assert error.error_class == error_class
    assert error.error_class in ERROR_CLASSES
    assert error.message == f"HTTP {status}: nope"


@pytest.mark.parametrize("status", [200, 201, 204])
def test_success_is_not_an_error(status):
    assert classify_status(status, {}, "") is None


def test_auth_and_bad_requests_are_never_retried_and_throttling_is():
    assert {"auth", "invalid_request"} <= NEVER_RETRIED
    assert not {"rate_limit", "timeout", "transient"} & NEVER_RETRIED


@pytest.mark.parametrize("headers, expected", [
    ({"Retry-After": "7"}, 7.0),
    ({"Retry-After": "1.5"}, 1.5),
    ({"retry-after-ms": "250"}, 0.25),
    ({"retry-after-ms": "250", "Retry-After": "9"}, 0.25),
    ({"Retry-After": "-3"}, 0.0),
    ({"Retry-After": "soon"}, None),
    ({}, None),
])
def test_retry_after_is_read_in_seconds(headers, expected):
    assert retry_after_s(headers) == expected


def test_retry_after_may_be_an_http_date():
    header = format_datetime(now() + timedelta(seconds=30), usegmt=True)
    assert 28 <= retry_after_s({"Retry-After": header}) <= 30


def test_a_429_carries_its_retry_after_hint():
    error = classify_status(429, {"Retry-After": "3"}, "")
    assert (error.error_class, error.retry_after_s) == ("rate_limit", 3.0)


def test_error_messages_use_the_api_message_not_headers():
    error = classify_status(401, {"Authorization": "Bearer sk-secret"},
                            '{"type": "error", "error": {"type": "authentication_error", '
                            '"message": "invalid x-api-key"}}')
    assert error.message == "HTTP 401: invalid x-api-key"
    assert "sk-secret" not in error.message


@pytest.mark.parametrize("exc, error_class", [
    (httpx.ConnectTimeout("t"), "timeout"),
    (httpx.ReadTimeout("t"), "timeout"),
    (httpx.WriteTimeout("t"), "timeout"),
    (httpx.PoolTimeout("t"), "timeout"),
    (httpx.ConnectError("refused"), "transient"),
    (httpx.RemoteProtocolError("eof"), "transient"),
    (httpx.ReadError("reset"), "transient"),
    (httpx.UnsupportedProtocol("ftp://"), "invalid_request"),
])
def test_transport_failures_are_classified(exc, error_class):
    assert classify_exception(exc).error_class == error_class
