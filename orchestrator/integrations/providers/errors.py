"""How a failed model API call is classified, so retry policies can act on it.

| what happened                                   | class             | retried if listed |
|-------------------------------------------------|-------------------|-------------------|
| HTTP 429 (Retry-After / retry-after-ms honoured) | `rate_limit`      | yes               |
| HTTP 408, 504, a connect/read/write/pool timeout | `timeout`         | yes               |
| other HTTP 5xx (incl. 529 overloaded), a dropped connection, a garbled 2xx body | `transient` | yes |
| HTTP 401, 403, an API key variable that is not set | `auth`          | never             |
| other HTTP 4xx, a bad base URL                   | `invalid_request` | never             |
| a base URL whose name resolves to a metadata or link-local address (orchestrator.integrations.egress) | `policy` | never |
| a reply larger than `max_response_bytes` (default 8 MiB) | `permanent` | never        |

Messages carry the status and the API's own error text (shortened), never a header, so an
API key cannot leak into a step's error.
"""
import json
from datetime import UTC
from email.utils import parsedate_to_datetime

import httpx

from orchestrator.engine.clock import now
from orchestrator.engine.retry import StepError

from .. import egress

MESSAGE_LIMIT = 300
# The largest reply read from a model API (registry `max_response_bytes`); a larger one fails
# the call as `permanent` instead of being held in memory.
DEFAULT_MAX_RESPONSE_BYTES = 8 * 1024 * 1024


def retry_after_s(headers: httpx.Headers | dict) -> float | None:
    """Seconds to wait, from `retry-after-ms`, or `Retry-After` as seconds or an HTTP-date."""
    headers = httpx.Headers(headers)
    millis = headers.get("retry-after-ms")
    if millis:
        try:
            return max(float(millis) / 1000, 0.0)
        except ValueError:
            pass
    value = (headers.get("retry-after") or "").strip()
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max((when - now().astimezone(UTC)).total_seconds(), 0.0)


def api_message(body: str) -> str:
    """The API's own error message from an error body (OpenAI and Anthropic shapes), shortened."""
    try:
        data = json.loads(body)
    except ValueError:
        return body.strip()[:MESSAGE_LIMIT]
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        return str(error.get("message") or error.get("type") or "")[:MESSAGE_LIMIT]
    if isinstance(error, str):
        return error[:MESSAGE_LIMIT]
    return ""


def classify_status(status: int, headers: httpx.Headers | dict, body: str = "") -> StepError | None:
    """The StepError for an HTTP status (None for 2xx/3xx)."""
    if status < 400:
        return None
    detail = api_message(body)
    message = f"HTTP {status}" + (f": {detail}" if detail else "")
    if status == 429:
        return StepError("rate_limit", message, retry_after_s(headers))
    if status in (408, 504):
        return StepError("timeout", message)
    if status >= 500:
        return StepError("transient", message, retry_after_s(headers))
    if status in (401, 403):
        return StepError("auth", message)
    return StepError("invalid_request", message)


def classify_exception(exc: Exception) -> StepError:
    """The StepError for a call that got no HTTP response (the classes of
    orchestrator.integrations.egress)."""
    return egress.as_step_error(exc)


def post_json(url: str, *, headers: dict, payload: dict, timeout_s: float,
              connect_timeout_s: float, params: dict | None = None,
              max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES) -> dict:
    """POST `payload` and return the decoded JSON body, or raise a classified StepError.

    One request through the egress client, to the configured base URL's origin only (an
    operator's explicit allowance, whatever address it has), within `timeout_s` in all, its
    reply read up to `max_response_bytes`. No retries, no redirects followed (a redirect is a
    misconfigured base URL).
    """
    try:
        policy = egress.policy_for_base_url(url, max_response_bytes=max_response_bytes)
    except ValueError as exc:
        raise StepError("invalid_request", f"bad base URL: {exc}") from exc
    try:
        response = egress.request("POST", url, policy=policy, deadline_s=timeout_s,
                                  connect_timeout_s=connect_timeout_s, headers=headers,
                                  json=payload, params=params)
    except (egress.EgressRefused, egress.ResponseTooLarge, httpx.HTTPError) as exc:
        raise classify_exception(exc) from exc
    error = classify_status(response.status_code, response.headers, response.text)
    if error is not None:
        raise error
    if response.status_code >= 300:
        raise StepError("invalid_request", f"HTTP {response.status_code}: the base URL redirects")
    try:
        body = response.json()
    except ValueError as exc:
        raise StepError("transient", f"HTTP {response.status_code} with a body that is not JSON") from exc
    if not isinstance(body, dict):
        raise StepError("transient", "the API replied with JSON that is not an object")
    return body
