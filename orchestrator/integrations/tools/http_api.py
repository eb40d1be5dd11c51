"""`http.json`: call a JSON API an operator configured as a named `http` connection, with its
credential added by the tool - so a token never sits in a definition, a run's params, the
effect ledger or the audit ledger.

The connection holds `base_url` and `auth` (`bearer` token, `basic` username/password, or a
`header` name/value; secrets from the environment or a secrets file). A step gives a `path`
relative to the base URL, a method, query and JSON body. The call goes through
`orchestrator.integrations.egress.request` under the policy of exactly the configured origin
(`egress.policy_for_base_url`), capped at the tool's response size for the team
(`egress.policy_for(tool="http.json")`), so a path cannot lead anywhere else. A step that has a
side effect sends its idempotency key as `Idempotency-Key`, like `http.request`.
"""
import base64
from urllib.parse import urlsplit

import httpx
from django.core.exceptions import ImproperlyConfigured

from orchestrator.engine.retry import StepError

from .. import egress
from .builtin import classify_status
from .named import CONNECTION_PARAM, connection_for, deadline_s, failure
from .registry import ToolContext, tool

_FORBIDDEN_HEADERS = {"authorization", "proxy-authorization", "cookie", "host"}
HTTP_JSON_PARAMS = {
    "type": "object", "additionalProperties": False, "required": ["connection", "path"],
    "properties": {
        "connection": CONNECTION_PARAM,
        "method": {"type": "string", "enum": ["GET", "POST", "PUT", "PATCH", "DELETE"],
                   "default": "GET"},
        "path": {"type": "string", "maxLength": 2048, "pattern": r"^(?!.*://)(?!//)[^\\\x00]*$",
                 "description": "Relative to the connection's base_url."},
        "query": {"type": "object", "additionalProperties": {"type": ["string", "number",
                                                                      "boolean"]}},
        "json": {"description": "The request body, sent as JSON."},
        "headers": {"type": "object", "additionalProperties": {"type": "string"},
                    "maxProperties": 30,
                    "description": "Extra headers; never Authorization (the connection's)."},
        "timeout_s": {"type": "number", "exclusiveMinimum": 0, "default": 30},
    },
}
HTTP_JSON_OUTPUT = {"type": "object", "required": ["status", "body"],
                    "properties": {"status": {"type": "integer"}, "body": {}}}


def check_http_json(params: dict, connection) -> list[tuple[tuple, str]]:
    headers = params.get("headers")
    if isinstance(headers, dict):
        return [(("headers", name), f"{name} is set by the connection, never by a step")
                for name in headers if name.lower() in _FORBIDDEN_HEADERS]
    return []


def _url(base_url: str, path: str) -> str:
    if ".." in path.split("?")[0].split("/"):
        raise StepError("policy", f"path {path!r} may not contain '..'")
    return base_url.rstrip("/") + "/" + path.lstrip("/")


def _auth_headers(connection) -> dict:
    auth = connection.get("auth")
    if not auth:
        return {}
    if auth["type"] == "bearer":
        return {"Authorization": f"Bearer {connection.secret('token', within=auth)}"}
    if auth["type"] == "basic":
        pair = f"{connection.secret('username', within=auth)}:{connection.secret('password', within=auth)}"
        return {"Authorization": "Basic " + base64.b64encode(pair.encode()).decode()}
    return {str(auth["name"]): connection.secret("value", within=auth)}


@tool("http.json", params_schema=HTTP_JSON_PARAMS, output_schema=HTTP_JSON_OUTPUT,
      connection="http", dedupes_by_key=True, check=check_http_json,
      description="Call a JSON API on a named connection, authenticated by the connection.")
def http_json(params: dict, ctx: ToolContext) -> dict:
    connection = connection_for(params, ctx, "http")
    if check_http_json(params, connection):
        raise StepError("policy", check_http_json(params, connection)[0][1])
    base_url = str(connection.get("base_url"))
    url = _url(base_url, params["path"])
    headers = {"Accept": "application/json", **(params.get("headers") or {}),
               **_auth_headers(connection)}
    if ctx.side_effect:
        headers.setdefault("Idempotency-Key", ctx.idempotency_key)
    try:
        cap = egress.policy_for(tool="http.json", team=ctx.team).max_response_bytes
        policy = egress.policy_for_base_url(base_url, max_response_bytes=cap)
        if urlsplit(url).netloc != urlsplit(base_url).netloc:
            raise egress.EgressRefused(url, "it leaves the connection's base_url")
        response = egress.request(
            params.get("method", "GET"), url, policy=policy,
            deadline_s=deadline_s(connection, params, ctx), headers=headers,
            params=params.get("query"), json=params.get("json"))
    except (egress.EgressRefused, egress.ResponseTooLarge, httpx.HTTPError,
            ImproperlyConfigured, ValueError) as exc:
        if isinstance(exc, ValueError) and not isinstance(exc, httpx.HTTPError):
            raise failure(connection, "policy", exc) from exc
        error = egress.as_step_error(exc)
        raise failure(connection, error.error_class, error.message) from exc
    error = classify_status(response.status_code, response.headers.get("retry-after"))
    if error:
        error.message = f"{error.message} from {params['path']}"
        raise error
    if not response.content:
        return {"status": response.status_code, "body": None}
    try:
        body = response.json()
    except ValueError:
        raise StepError("permanent", f"{params['path']} answered {response.status_code} with a "
                                     "body that is not JSON") from None
    return {"status": response.status_code, "body": body}
