"""Check a test client's response against the published OpenAPI schema, as the fuzzer does.

`assert_documented(client, response, "GET", "/api/v1/runs/{id}/")` fails unless the schema
served at /api/v1/schema/ documents the response's status code for that operation, and its
content type and body match what it documents there (schemathesis's own validation).
"""
import json

import requests
import schemathesis
from schemathesis.core.transport import Response


def published_schema(client) -> dict:
    response = client.get("/api/v1/schema/?format=json")
    assert response.status_code == 200
    return json.loads(response.content)


def assert_documented(client, response, method: str, path: str) -> None:
    raw = published_schema(client)
    documented = raw["paths"][path][method.lower()]["responses"]
    assert str(response.status_code) in documented, (
        f"{method} {path} answered {response.status_code}, the schema documents "
        f"{sorted(documented)}: {response.content[:500]!r}")
    operation = schemathesis.openapi.from_dict(raw)[path][method]
    operation.validate_response(_as_sent(response, method))


def _as_sent(response, method: str) -> Response:
    """A Django test response as the HTTP response schemathesis validates."""
    request = requests.Request(method, f"http://testserver{response.request['PATH_INFO']}").prepare()
    return Response(status_code=response.status_code,
                    headers={name.lower(): [value] for name, value in response.headers.items()},
                    content=response.content, request=request, elapsed=0.0, verify=True)
