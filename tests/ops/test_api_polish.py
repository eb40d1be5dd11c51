"""API polish: run input formats are checked, errors are in one shape (DRF's 401 and 404 too),
readiness is split from liveness, the docs' assets are local and the token scheme comes first."""
import pytest
from rest_framework.test import APIClient

from orchestrator.engine.services.workflows import workflow_save
from tests.factories import SETUP

pytestmark = pytest.mark.django_db

CONTACT = {"name": "contact", "input_schema": {
    "type": "object", "required": ["email"],
    "properties": {"email": {"type": "string", "format": "email"},
                   "when": {"type": "string", "format": "date-time"}}},
    "steps": [{"name": "echo", "type": "tool", "tool": "core.echo"}]}


def test_an_input_that_breaks_a_format_is_refused_before_a_run_exists(team, api):
    workflow_save(team=team, definition=CONTACT, actor=SETUP)
    refused = api.post("/api/v1/workflows/contact/runs/",
                       {"input": {"email": "not-an-address", "when": "yesterday"}}, format="json")
    assert refused.status_code == 400
    assert {e["path"] for e in refused.json()["errors"]} == {"input.email", "input.when"}
    accepted = api.post("/api/v1/workflows/contact/runs/",
                        {"input": {"email": "a@example.com", "when": "2026-11-30T10:00:00Z"}},
                        format="json")
    assert accepted.status_code == 202


@pytest.mark.parametrize("path, code", [("/api/v1/runs/", 401),
                                        ("/api/v1/workflows/nothing-here/", 404),
                                        ("/api/v1/no-such-route/", 404)])
def test_drf_and_django_errors_come_in_the_one_shape(requester, path, code):
    client = APIClient()
    if code == 404:
        client.force_authenticate(requester)
    response = client.get(path)
    assert response.status_code == code
    body = response.json()
    assert list(body) == ["errors"] and body["errors"][0]["message"]


def test_readiness_answers_anonymously_with_nothing_but_its_verdict(client):
    response = client.get("/api/v1/health/ready/")
    assert (response.status_code, response.json()) == (200, {"status": "ready"})


def test_readiness_is_503_when_the_broker_does_not_answer(client, monkeypatch):
    from orchestrator.operations import health

    monkeypatch.setattr(health, "broker_status", lambda: "error: ConnectionRefusedError")
    response = client.get("/api/v1/health/ready/")
    assert (response.status_code, response.json()) == (503, {"status": "not ready"})
    assert client.get("/api/v1/health/").status_code == 200  # still alive


def test_the_docs_pages_load_their_assets_from_this_server(client):
    page = client.get("/api/v1/docs/").content.decode()
    assert "drf_spectacular_sidecar" in page and "cdn.jsdelivr" not in page
    page = client.get("/api/v1/redoc/").content.decode()
    assert '<script src="/api/v1/redoc/redoc.standalone.js">' in page and "cdn." not in page
    bundle = client.get("/api/v1/redoc/redoc.standalone.js")
    assert bundle.status_code == 200 and b"Redoc" in bundle.content
    assert b"https://cdn.redoc.ly/" not in bundle.content  # its footer logo is served here


def test_the_token_scheme_is_listed_first(api):
    schema = api.get("/api/v1/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    assert list(schema["components"]["securitySchemes"])[0] == "tokenAuth"
    # An HTTP bearer scheme: Swagger's "Authorize" takes the bare key and sends "Bearer <key>".
    assert schema["components"]["securitySchemes"]["tokenAuth"] == {"type": "http", "scheme": "bearer"}
    runs = schema["paths"]["/api/v1/runs/"]["get"]["security"]
    assert "tokenAuth" in runs[0]
