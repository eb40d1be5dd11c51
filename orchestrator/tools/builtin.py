"""Built-in tools: `http.request` and `core.echo`."""
import httpx

from ..retry import StepError
from .registry import ToolContext, tool

HTTP_PARAMS = {
    "type": "object",
    "additionalProperties": False,
    "required": ["url"],
    "properties": {
        "method": {"type": "string", "enum": ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"],
                   "default": "GET"},
        "url": {"type": "string", "pattern": "^https?://"},
        "headers": {"type": "object", "additionalProperties": {"type": "string"}},
        "query": {"type": "object"},
        "json": {},
        "body": {"type": "string"},
        "timeout_s": {"type": "number", "exclusiveMinimum": 0, "default": 30},
    },
}


def classify_status(status: int, retry_after: str | None) -> StepError | None:
    """Map an HTTP status to an error class (None for success)."""
    if status < 400:
        return None
    if status == 429:
        delay = float(retry_after) if retry_after and retry_after.replace(".", "", 1).isdigit() else None
        return StepError("rate_limit", "HTTP 429 Too Many Requests", delay)
    if status in (401, 403):
        return StepError("auth", f"HTTP {status}")
    if status in (408, 504):
        return StepError("timeout", f"HTTP {status}")
    if status >= 500:
        return StepError("transient", f"HTTP {status}")
    return StepError("permanent", f"HTTP {status}")


@tool("http.request", params_schema=HTTP_PARAMS, description="Make an HTTP request.",
      dedupes_by_key=True)
def http_request(params: dict, ctx: ToolContext) -> dict:
    """Make an HTTP request; a side-effecting step sends its idempotency key as a header."""
    headers = dict(params.get("headers") or {})
    if ctx.side_effect:
        headers.setdefault("Idempotency-Key", ctx.idempotency_key)
    try:
        response = httpx.request(
            params.get("method", "GET"), params["url"], headers=headers,
            params=params.get("query"), json=params.get("json"),
            content=params.get("body"), timeout=params.get("timeout_s", 30),
        )
    except httpx.TimeoutException as exc:
        raise StepError("timeout", f"{type(exc).__name__}: {exc}") from exc
    except httpx.HTTPError as exc:
        raise StepError("transient", f"{type(exc).__name__}: {exc}") from exc
    error = classify_status(response.status_code, response.headers.get("retry-after"))
    if error:
        raise error
    try:
        body = response.json()
    except ValueError:
        body = response.text
    return {"status": response.status_code, "headers": dict(response.headers), "body": body}


@tool("core.echo", params_schema={"type": "object"}, description="Return the params unchanged.")
def echo(params: dict, ctx: ToolContext) -> dict:
    """Return the params unchanged (a pure step, for wiring data and for benchmarks)."""
    return params
