"""How the published OpenAPI schema (/api/v1/schema/) says which errors an endpoint answers.

drf-spectacular documents what a view declares with `extend_schema`; the errors that come from
the shared machinery (authentication, routing, parsing, query parameters) are true of every
endpoint alike, so they are added here instead of on each view, all in the one error shape
(`Errors`, orchestrator/web/api/errors.py):

* 400 where the request has query or header parameters or a body (a value that does not parse,
  a filter or page outside its range, a body of the wrong shape);
* 401 where a token or session is required, 403 where such a request changes something;
* 404 where the path names an object (not there, or not visible to the caller);
* 415 where there is a body (a media type the endpoint does not read).

A code the view documents itself is left as the view says. The fuzzer in CI checks that every
response is one the schema describes (docs/security.md, "Fuzzing the API").
"""
from drf_spectacular.openapi import AutoSchema

from .serializers import ErrorsSerializer

_WHY = {
    "400": "A parameter or the body is not valid; every problem, each with its path.",
    "401": "No valid token or session.",
    "403": "You may not do this.",
    "404": "Not found, or not visible to you.",
    "415": "The body's media type is not one this endpoint reads.",
}


class StepwiseAutoSchema(AutoSchema):
    def get_operation(self, *args, **kwargs):
        operation = super().get_operation(*args, **kwargs)
        if operation is None:
            return None
        responses = operation["responses"]
        for code in self._shared_errors(operation):
            responses.setdefault(code, self._errors_response(_WHY[code]))
        return operation

    def _shared_errors(self, operation: dict) -> list[str]:
        has_body = "requestBody" in operation
        authenticated = any(operation.get("security") or [])
        codes = []
        if has_body or any(p["in"] in ("query", "header") for p in operation.get("parameters", [])):
            codes.append("400")
        if authenticated:
            codes.append("401")
            if self.method not in ("GET", "HEAD", "OPTIONS"):
                codes.append("403")
        if "{" in self.path:
            codes.append("404")
        if has_body:
            codes.append("415")
        return codes

    def _errors_response(self, description: str) -> dict:
        schema = self.resolve_serializer(ErrorsSerializer, "response").ref
        return {"description": description, "content": {"application/json": {"schema": schema}}}


def token_scheme_first(result: dict, generator, request, public) -> dict:
    """List the token scheme before the session cookie in `securitySchemes` and in each
    operation's `security`, so Swagger UI's "Authorize" offers the token first."""
    schemes = result.get("components", {}).get("securitySchemes")
    if schemes and "tokenAuth" in schemes:
        result["components"]["securitySchemes"] = {
            "tokenAuth": schemes["tokenAuth"], **{k: v for k, v in schemes.items() if k != "tokenAuth"}}
    for path in result.get("paths", {}).values():
        for operation in path.values():
            if isinstance(operation, dict) and isinstance(operation.get("security"), list):
                operation["security"].sort(key=lambda requirement: "tokenAuth" not in requirement)
    return result
