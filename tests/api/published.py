"""Check a test client's response against the published OpenAPI schema, as the fuzzer does.

`assert_documented(client, response, "GET", "/api/v1/runs/{id}/")` fails unless the schema
served at /api/v1/schema/ documents the response's status code for that operation, and its
content type and body match what it documents there (schemathesis's own validation).

The schema is public (drf-spectacular's SERVE_PUBLIC: the same for any caller) and a function of
the code and the URL configuration, so a process fetches and parses it once per URL configuration.
"""
import copy
import json

import requests
import schemathesis
from django.conf import settings
from django.urls import get_urlconf
from schemathesis.core.transport import Response

_PUBLISHED: dict[str, tuple[dict, object]] = {}


def _published(client) -> tuple[dict, object]:
    """The served schema and schemathesis's reading of it, fetched once per URL configuration."""
    urlconf = get_urlconf() or settings.ROOT_URLCONF
    if urlconf not in _PUBLISHED:
        response = client.get("/api/v1/schema/?format=json")
        assert response.status_code == 200
        raw = json.loads(response.content)
        _PUBLISHED[urlconf] = raw, schemathesis.openapi.from_dict(copy.deepcopy(raw))
    return _PUBLISHED[urlconf]


def published_schema(client) -> dict:
    return copy.deepcopy(_published(client)[0])


def assert_documented(client, response, method: str, path: str) -> None:
    raw, schema = _published(client)
    documented = raw["paths"][path][method.lower()]["responses"]
    assert str(response.status_code) in documented, (
        f"{method} {path} answered {response.status_code}, the schema documents "
        f"{sorted(documented)}: {response.content[:500]!r}")
    operation = schema[path][method]
    operation.validate_response(_as_sent(response, method))


def _as_sent(response, method: str) -> Response:
    """A Django test response as the HTTP response schemathesis validates."""
    request = requests.Request(method, f"http://testserver{response.request['PATH_INFO']}").prepare()
    return Response(status_code=response.status_code,
                    headers={name.lower(): [value] for name, value in response.headers.items()},
                    content=response.content, request=request, elapsed=0.0, verify=True)
