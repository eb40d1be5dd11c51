import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Run, StepState
from tests.factories import example_definition

from .driving import SUPPORT_INPUT, drive_to_gate

RUNS = "/api/v1/workflows/support-reply/runs/"


@pytest.fixture
def support(team, requester):
    version, _ = workflow_save(team=team, definition=example_definition("support"), actor=requester)
    return version


def start(client, body=None, **headers):
    return client.post(RUNS, body if body is not None else {"input": SUPPORT_INPUT},
                       format="json", headers=headers)


@pytest.mark.django_db
def test_starting_a_run_is_202_with_its_id_and_url(api, support):
    response = start(api)

    assert response.status_code == 202, response.json()
    body = response.json()
    assert body["url"].endswith(f"/api/v1/runs/{body['id']}/")
    assert (body["workflow"], body["version"], body["state"]) == ("support-reply", 1, "running")
    run = Run.objects.get(pk=body["id"])
    assert run.created_by.username == "requester"
    assert [s.name for s in run.steps.order_by("position")] == [
        "classify", "research", "fetch_history", "draft", "approve", "send"]
    assert run.steps.get(name="classify").state == StepState.QUEUED


@pytest.mark.django_db
def test_invalid_input_is_a_400_listing_paths_and_creates_no_run(api, support):
    response = start(api, {"input": {"ticket_id": "", "body": "x", "customer_email": "a@b.c",
                                     "extra": 1}})

    assert response.status_code == 400
    paths = {e["path"] for e in response.json()["errors"]}
    assert "input.ticket_id" in paths
    assert "input" in paths  # the additional property
    assert Run.objects.count() == 0


@pytest.mark.django_db
def test_input_not_wrapped_in_input_is_a_400(api, support):
    response = start(api, SUPPORT_INPUT)

    assert response.status_code == 400
    assert "put the run input under 'input'" in response.json()["errors"][0]["message"]
    assert Run.objects.count() == 0


@pytest.mark.django_db
def test_a_pinned_older_version_is_run(api, team, requester, support):
    changed = example_definition("support")
    changed["description"] = "v2"
    workflow_save(team=team, definition=changed, actor=requester)

    pinned = start(api, {"input": SUPPORT_INPUT, "version": 1})
    latest = start(api)
    missing = start(api, {"input": SUPPORT_INPUT, "version": 7})

    assert (pinned.json()["version"], latest.json()["version"]) == (1, 2)
    assert missing.status_code == 400
    assert missing.json()["errors"][0]["path"] == "version"


@pytest.mark.django_db
def test_idempotency_key_replay_returns_the_same_run(api, support):
    first = start(api, **{"Idempotency-Key": "k-1"})
    again = start(api, **{"Idempotency-Key": "k-1"})

    assert first.status_code == 202
    assert again.status_code in (200, 202)
    assert again.json()["id"] == first.json()["id"]
    assert Run.objects.count() == 1


@pytest.mark.django_db
def test_idempotency_key_with_another_body_is_a_409(api, support):
    start(api, **{"Idempotency-Key": "k-1"})

    response = start(api, {"input": {**SUPPORT_INPUT, "body": "something else"}},
                     **{"Idempotency-Key": "k-1"})

    assert response.status_code == 409
    assert "Idempotency-Key" in response.json()["errors"][0]["message"]
    assert Run.objects.count() == 1


@pytest.mark.django_db
def test_run_detail_lists_steps_in_order_with_states_and_attempts(api, support):
    run_id = start(api).json()["id"]
    drive_to_gate(Run.objects.get(pk=run_id))

    body = api.get(f"/api/v1/runs/{run_id}/").json()

    assert body["input"] == SUPPORT_INPUT
    assert (body["workflow"], body["version"], body["state"]) == ("support-reply", 1, "waiting")
    steps = {s["name"]: s for s in body["steps"]}
    assert [s["name"] for s in body["steps"]][0] == "classify"
    assert steps["classify"]["state"] == "completed"
    assert steps["classify"]["output"] == {"category": "billing", "urgency": "high"}
    assert steps["classify"]["attempts"] == 1
    attempt = steps["classify"]["attempt_records"][0]
    assert (attempt["number"], attempt["worker"], attempt["outcome"]) == (1, "test-worker",
                                                                         "succeeded")
    assert attempt["idempotency_key"].endswith(":classify:default")
    assert steps["approve"]["state"] == "waiting"
    assert steps["approve"]["approval"]["state"] == "pending"
    assert steps["send"]["approval"] is None
    assert body["tokens_in"] == 40 and body["tokens_out"] == 20


@pytest.mark.django_db
def test_run_detail_takes_the_same_number_of_queries_however_far_the_run_got(api, support):
    fresh = start(api).json()["id"]
    driven = start(api, {"input": {**SUPPORT_INPUT, "ticket_id": "T-2"}}).json()["id"]
    drive_to_gate(Run.objects.get(pk=driven))

    with CaptureQueriesContext(connection) as fresh_queries:
        api.get(f"/api/v1/runs/{fresh}/")
    with CaptureQueriesContext(connection) as driven_queries:
        api.get(f"/api/v1/runs/{driven}/")

    # token, run (+version, workflow, team, user, parent), steps (+approval), attempts, budget
    assert len(driven_queries) == len(fresh_queries) == 5


@pytest.mark.django_db
def test_runs_list_filters_by_state_and_workflow_newest_first(api, team, requester, support):
    workflow_save(team=team, definition=example_definition("lead-routing"), actor=requester)
    first = start(api).json()["id"]
    second = start(api, {"input": {**SUPPORT_INPUT, "ticket_id": "T-2"}}).json()["id"]
    api.post(f"/api/v1/runs/{first}/cancel/")

    all_runs = api.get("/api/v1/runs/").json()["results"]
    running = api.get("/api/v1/runs/?state=running").json()["results"]
    cancelled = api.get("/api/v1/runs/", {"state": ["cancelled", "cancelling"]}).json()["results"]
    by_workflow = api.get("/api/v1/runs/?workflow=support-reply").json()["results"]
    other_workflow = api.get("/api/v1/runs/?workflow=lead-routing").json()["results"]

    assert [r["id"] for r in all_runs] == [second, first]
    assert [r["id"] for r in running] == [second]
    assert [r["id"] for r in cancelled] == [first]
    assert len(by_workflow) == 2
    assert other_workflow == []


@pytest.mark.django_db
def test_runs_list_filters_by_creation_time(api, support):
    run_id = start(api).json()["id"]
    created = Run.objects.get(pk=run_id).created_at

    after = api.get("/api/v1/runs/", {"created_after": created.isoformat()}).json()["results"]
    before = api.get("/api/v1/runs/", {"created_before": created.isoformat()}).json()["results"]

    assert [r["id"] for r in after] == [run_id]
    assert before == []


@pytest.mark.django_db
def test_outsider_gets_404_on_a_run_and_an_empty_list(api, outsider_api, support):
    run_id = start(api).json()["id"]

    assert outsider_api.get(f"/api/v1/runs/{run_id}/").status_code == 404
    assert outsider_api.post(f"/api/v1/runs/{run_id}/cancel/").status_code == 404
    assert outsider_api.get("/api/v1/runs/").json()["results"] == []
    assert Run.objects.get(pk=run_id).state == "running"


@pytest.mark.django_db
def test_unknown_run_id_is_404(api):
    assert api.get("/api/v1/runs/not-a-uuid/").status_code == 404
    assert api.get("/api/v1/runs/00000000-0000-0000-0000-000000000000/").status_code == 404


@pytest.mark.django_db
def test_cancel_is_202_and_cancelling_again_is_409(api, support):
    run_id = start(api).json()["id"]

    response = api.post(f"/api/v1/runs/{run_id}/cancel/")
    again = api.post(f"/api/v1/runs/{run_id}/cancel/")

    assert response.status_code == 202
    assert response.json()["state"] in ("cancelled", "cancelling")
    assert {s["state"] for s in response.json()["steps"]} == {"cancelled"}
    assert again.status_code == 409
    assert "already ended" in again.json()["errors"][0]["message"]


@pytest.mark.django_db
def test_idempotency_key_reused_for_another_version_is_a_409(api, team, requester, support):
    changed = example_definition("support")
    changed["description"] = "v2"
    workflow_save(team=team, definition=changed, actor=requester)
    start(api, {"input": SUPPORT_INPUT, "version": 1}, **{"Idempotency-Key": "k-2"})

    response = start(api, {"input": SUPPORT_INPUT, "version": 2}, **{"Idempotency-Key": "k-2"})

    assert response.status_code == 409
    assert Run.objects.count() == 1


def test_the_schemas_example_body_starts_a_run_as_it_stands(api, support):
    schema = api.get("/api/v1/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    body = schema["paths"]["/api/v1/workflows/{name}/runs/"]["post"]["requestBody"]
    [example] = body["content"]["application/json"]["examples"].values()

    response = api.post(RUNS, example["value"], format="json")

    assert response.status_code == 202, response.json()
    assert "additionalProp1" not in str(example)


def test_a_blank_callback_url_means_no_callback(api, support):
    response = api.post(RUNS, {"input": SUPPORT_INPUT, "callback_url": "", "callback_secret": ""},
                        format="json")

    assert response.status_code == 202, response.json()


def test_a_start_names_its_path_from_the_documented_ones_only(api, support):
    refused = api.post(f"{RUNS}?via=AAA", {"input": SUPPORT_INPUT}, format="json")
    from_builder = api.post(f"{RUNS}?via=builder", {"input": SUPPORT_INPUT}, format="json")

    assert refused.status_code == 400
    assert refused.json()["errors"] == [{"path": "via", "message": "one of: api, builder"}]
    assert from_builder.status_code == 202
    assert from_builder.json()["provenance"]["path"] == "builder"
    assert Run.objects.count() == 1
