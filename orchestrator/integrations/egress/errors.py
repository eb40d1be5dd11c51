"""What an outbound call through the egress client raises besides httpx's own errors, and how a
step classifies each (the retry table in docs/failure-semantics.md)."""

from __future__ import annotations

import httpx
from django.core.exceptions import ImproperlyConfigured

from orchestrator.engine.retry import StepError

MESSAGE_LIMIT = 300


class EgressRefused(Exception):
    """The policy refuses the destination (a scheme, host, port or address). Nothing was sent
    to it. Never worth retrying: the same call is refused again."""

    def __init__(self, url: str, reason: str):
        super().__init__(f"egress policy refuses {url}: {reason}")
        self.url = url
        self.reason = reason


class ResponseTooLarge(Exception):
    """The response body is larger than the policy's cap; the read stopped there."""

    def __init__(self, url: str, limit: int, declared: int | None = None):
        size = f"declares {declared} bytes" if declared is not None else f"exceeds {limit} bytes"
        super().__init__(f"the response of {url} {size}; the limit is {limit} bytes "
                         "(max_response_bytes in STEPWISE_EGRESS)")
        self.url = url
        self.limit = limit


def as_step_error(exc: Exception) -> StepError:
    """The StepError of a call that got no usable response: a refusal (or a malformed policy
    setting, which refuses everything) is `policy`, an oversized response `permanent` (neither
    is retried), the deadline `timeout`, an invalid URL `invalid_request`, any other transport
    failure `transient`."""
    text = str(exc)[:MESSAGE_LIMIT]
    if isinstance(exc, EgressRefused):
        return StepError("policy", text)
    if isinstance(exc, ImproperlyConfigured):
        return StepError("policy", f"the egress policy setting is malformed: {text}")
    if isinstance(exc, ResponseTooLarge):
        return StepError("permanent", text)
    text = f"{type(exc).__name__}: {text}"[:MESSAGE_LIMIT]
    if isinstance(exc, httpx.TimeoutException):
        return StepError("timeout", text)
    if isinstance(exc, httpx.UnsupportedProtocol | httpx.InvalidURL):
        return StepError("invalid_request", text)
    return StepError("transient", text)
