"""Built-in tools: `http.request` and `core.echo`."""
import httpx
from django.core.exceptions import ImproperlyConfigured

from orchestrator.engine.retry import StepError

from .. import egress
from .registry import FENCING_HEADER, ToolContext, tool

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
        # The whole call (connect, send, every read): capped by the step's timeout_s.
        "timeout_s": {"type": "number", "exclusiveMinimum": 0, "default": 30},
        # Off by default; when on, every hop is checked against the egress policy again.
        "follow_redirects": {"type": "boolean", "default": False},
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
      dedupes_by_key=True, url_params=("url",))
def http_request(params: dict, ctx: ToolContext) -> dict:
    """Make an HTTP request where the egress policy allows; a side-effecting step sends its
    idempotency key as a header. The whole call ends by `timeout_s`, and never after the
    step's own timeout; a response over the policy's size cap fails the step, unstored."""
    headers = dict(params.get("headers") or {})
    if ctx.side_effect:
        headers.setdefault("Idempotency-Key", ctx.idempotency_key)
        if ctx.fencing_token:  # a remote that keeps the highest token per key refuses older ones
            headers.setdefault(FENCING_HEADER, str(ctx.fencing_token))
    deadline_s = float(params.get("timeout_s", 30))
    if ctx.timeout_s:
        deadline_s = min(deadline_s, float(ctx.timeout_s))
    try:
        response = egress.request(
            params.get("method", "GET"), params["url"],
            policy=egress.policy_for(tool="http.request", team=ctx.team), deadline_s=deadline_s,
            headers=headers, params=params.get("query"), json=params.get("json"),
            content=params.get("body"), follow_redirects=params.get("follow_redirects", False),
        )
    except (egress.EgressRefused, egress.ResponseTooLarge, httpx.HTTPError,
            ImproperlyConfigured) as exc:
        raise egress.as_step_error(exc) from exc
    error = classify_status(response.status_code, response.headers.get("retry-after"))
    if error:
        raise error
    try:
        body = response.json()
    except ValueError:
        body = response.text
    return {"status": response.status_code, "headers": dict(response.headers), "body": body}


@tool("core.echo", params_schema={"type": "object"}, description="Return the params unchanged.",
      in_process=True)
def echo(params: dict, ctx: ToolContext) -> dict:
    """Return the params unchanged (a pure step, for wiring data and for benchmarks)."""
    return params
