"""How a failed model API call is classified, so retry policies can act on it.

| what happened                                   | class             | retried if listed |
|-------------------------------------------------|-------------------|-------------------|
| HTTP 429 (Retry-After / retry-after-ms honoured) | `rate_limit`      | yes               |
| HTTP 408, 504, a connect/read/write/pool timeout | `timeout`         | yes               |
| other HTTP 5xx (incl. 529 overloaded), a dropped connection, a garbled 2xx body | `transient` | yes |
| HTTP 401, 403, an API key variable that is not set | `auth`          | never             |
| other HTTP 4xx, a bad base URL                   | `invalid_request` | never             |

Messages carry the status and the API's own error text (shortened), never a header, so an
API key cannot leak into a step's error.
"""
import json
from datetime import UTC
from email.utils import parsedate_to_datetime

import httpx

from ..clock import now
from ..retry import StepError

MESSAGE_LIMIT = 300


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


def classify_exception(exc: httpx.HTTPError) -> StepError:
    """The StepError for a call that got no HTTP response."""
    text = f"{type(exc).__name__}: {exc}"[:MESSAGE_LIMIT]
    if isinstance(exc, httpx.TimeoutException):
        return StepError("timeout", text)
    if isinstance(exc, httpx.UnsupportedProtocol | httpx.InvalidURL):
        return StepError("invalid_request", text)
    return StepError("transient", text)


def post_json(url: str, *, headers: dict, payload: dict, timeout_s: float,
              connect_timeout_s: float, params: dict | None = None) -> dict:
    """POST `payload` and return the decoded JSON body, or raise a classified StepError.

    One request, no retries, no redirects followed (a redirect is a misconfigured base URL).
    """
    timeout = httpx.Timeout(timeout_s, connect=min(connect_timeout_s, timeout_s))
    try:
        with httpx.Client(timeout=timeout, follow_redirects=False) as client:
            response = client.post(url, headers=headers, json=payload, params=params)
    except httpx.InvalidURL as exc:
        raise classify_exception(exc) from exc
    except httpx.HTTPError as exc:
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
