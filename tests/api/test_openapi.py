"""The published OpenAPI schema describes what the API really answers: every field that can be
null says so, and every status code an endpoint gives is documented, with its body.

Each case here is one the API fuzzer found (tests/api/test_openapi_fuzz.py), kept as a plain
test: before, the schema said `decided_by`, `redriven_by` and `created_by` were always strings,
and listed no 401, no 404 and no 400 for bad query parameters or bodies.
"""
import pytest
from rest_framework.test import APIClient

from approvals.models import ApprovalRequest
from orchestrator.engine.retry import StepError
from orchestrator.engine.services.kinds.worker import Usage, step_claim, step_fail
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import DeadLetter, Run
from tests.factories import SETUP

from .driving import drive_to_gate, support_run
from .published import assert_documented

pytestmark = pytest.mark.django_db

FRAGILE = {"name": "fragile", "input_schema": {"type": "object"}, "steps": [
    {"name": "call", "type": "tool", "tool": "core.echo"}]}
UNKNOWN_RUN = "9b0f2b47-0000-4000-8000-000000000000"


@pytest.fixture
def pending(team, requester) -> ApprovalRequest:
    return ApprovalRequest.objects.get(run=drive_to_gate(support_run(team, requester)))


@pytest.fixture
def engine_run(team) -> Run:
    """A run no person started, of a workflow no person saved: both `created_by` are null."""
    version, _ = workflow_save(team=team, definition=FRAGILE, actor=SETUP)
    return run_start(version=version, input={}, actor=SETUP)


@pytest.fixture
def open_letter(engine_run) -> DeadLetter:
    step = engine_run.steps.get(name="call")
    claim = step_claim(step_id=step.id, worker="test")
    step_fail(step_id=step.id, attempt=claim.attempt, error=StepError("permanent", "boom"),
              usage=Usage(), worker="test")
    return DeadLetter.objects.get(step=step)


def test_a_pending_approval_has_no_decider_and_the_schema_says_it_may_be_null(approver_api, pending):
    response = approver_api.get(f"/api/v1/approvals/{pending.id}/")

    assert response.json()["decided_by"] is None
    assert_documented(approver_api, response, "GET", "/api/v1/approvals/{id}/")
    assert_documented(approver_api, approver_api.get("/api/v1/approvals/"), "GET",
                      "/api/v1/approvals/")


def test_an_open_dead_letter_was_redriven_by_nobody_and_the_schema_says_it_may_be_null(
        api, open_letter):
    response = api.get(f"/api/v1/dead-letters/{open_letter.id}/")

    assert response.json()["redriven_by"] is None
    assert_documented(api, response, "GET", "/api/v1/dead-letters/{id}/")
    assert_documented(api, api.get("/api/v1/dead-letters/"), "GET", "/api/v1/dead-letters/")


def test_what_the_engine_did_has_no_creator_and_the_schema_says_it_may_be_null(api, engine_run):
    response = api.get(f"/api/v1/runs/{engine_run.id}/")
    versions = api.get("/api/v1/workflows/fragile/versions/")

    assert response.json()["created_by"] is None
    assert versions.json()["results"][0]["created_by"] is None
    assert_documented(api, response, "GET", "/api/v1/runs/{id}/")
    assert_documented(api, api.get("/api/v1/runs/"), "GET", "/api/v1/runs/")
    assert_documented(api, versions, "GET", "/api/v1/workflows/{name}/versions/")


@pytest.mark.parametrize("method, url, path", [
    ("GET", f"/api/v1/runs/{UNKNOWN_RUN}/", "/api/v1/runs/{id}/"),
    ("POST", f"/api/v1/runs/{UNKNOWN_RUN}/cancel/", "/api/v1/runs/{id}/cancel/"),
    ("POST", "/api/v1/approvals/999/approve/", "/api/v1/approvals/{id}/approve/"),
    ("POST", "/api/v1/dead-letters/999/redrive/", "/api/v1/dead-letters/{id}/redrive/"),
    ("POST", "/api/v1/workflows/nothing/runs/", "/api/v1/workflows/{name}/runs/"),
    ("GET", "/api/v1/workflows/nothing/versions/1/", "/api/v1/workflows/{name}/versions/{number}/"),
])
def test_an_unknown_object_is_a_documented_404(api, method, url, path):
    response = api.generic(method, url, "{}", content_type="application/json")

    assert response.status_code == 404
    assert_documented(api, response, method, path)


def test_a_step_the_run_does_not_have_is_a_documented_404(api, engine_run):
    response = api.post(f"/api/v1/runs/{engine_run.id}/steps/nothing/retry/")

    assert response.status_code == 404
    assert_documented(api, response, "POST", "/api/v1/runs/{id}/steps/{step}/retry/")


@pytest.mark.parametrize("path", ["/api/v1/runs/", "/api/v1/workflows/", "/api/v1/approvals/",
                                  "/api/v1/dead-letters/", "/api/v1/health/details/"])
def test_no_credentials_is_a_documented_401(api, path):
    response = APIClient().get(path)

    assert response.status_code == 401
    assert_documented(api, response, "GET", path)


@pytest.mark.parametrize("query", ["state=null", "created_before=yesterday", "limit=null"])
def test_a_query_parameter_that_is_not_valid_is_a_documented_400(api, query):
    response = api.get(f"/api/v1/runs/?{query}")

    assert response.status_code == 400
    assert_documented(api, response, "GET", "/api/v1/runs/")


def test_an_approval_note_over_its_limit_is_a_documented_400(approver_api, pending):
    response = approver_api.post(f"/api/v1/approvals/{pending.id}/approve/",
                                 {"note": "x" * 10001}, format="json")

    assert response.status_code == 400
    assert response.json()["errors"][0]["path"] == "note"
    assert_documented(approver_api, response, "POST", "/api/v1/approvals/{id}/approve/")


def test_a_body_of_an_unread_media_type_is_a_documented_415(api):
    response = api.post("/api/v1/workflows/", b"name,steps", content_type="text/csv")

    assert response.status_code == 415
    assert_documented(api, response, "POST", "/api/v1/workflows/")


def test_a_firing_no_person_made_has_no_firer_and_the_schema_says_it_may_be_null(api, team):
    from orchestrator.models import Role
    from tests.factories import member
    from triggers.services.config import trigger_create
    from triggers.services.firing import trigger_fire_api

    owner = member(team, "trigger-owner", role=Role.OWNER)
    workflow_save(team=team, definition=FRAGILE, actor=SETUP)
    trigger, _ = trigger_create(team=team, kind="api", name="by-engine", workflow="fragile",
                                actor=owner)
    trigger_fire_api(trigger_id=trigger.id, payload={}, key="k1", actor=SETUP)
    owner.delete()  # the trigger's creator is gone too

    response = api.get(f"/api/v1/triggers/{trigger.id}/firings/")
    detail = api.get(f"/api/v1/triggers/{trigger.id}/")

    assert response.json()["results"][0]["fired_by"] is None
    assert detail.json()["created_by"] is None
    assert_documented(api, response, "GET", "/api/v1/triggers/{id}/firings/")
    assert_documented(api, detail, "GET", "/api/v1/triggers/{id}/")
