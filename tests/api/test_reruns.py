"""`POST /api/v1/runs/rerun/` and `GET /api/v1/reruns/<id>/`: a batch asked by runs or by the run
list's filter, answered 202 then 200 for a repeat of its key, refused whole by path for what
names no run of one workflow of the person's teams, and its progress read back."""
import pytest

from orchestrator.engine.services.reruns import rerun_advance
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Rerun, Run
from tests.factories import SETUP
from tests.support.reruns import echo_definition, failed_runs

pytestmark = pytest.mark.django_db


@pytest.fixture
def versions(team):
    broken, _ = workflow_save(team=team, definition=echo_definition(fixed=False), actor=SETUP)
    fixed, _ = workflow_save(team=team, definition=echo_definition(fixed=True), actor=SETUP)
    return broken, fixed


def rerun(api, body, key="batch-1"):
    return api.post("/api/v1/runs/rerun/", body, format="json", HTTP_IDEMPOTENCY_KEY=key)


def test_a_rerun_by_runs_is_accepted_and_a_repeat_returns_the_same_batch(api, versions):
    broken, _ = versions
    ids = [str(r.id) for r in failed_runs(broken, 2)]

    first = rerun(api, {"runs": ids, "version": 2})
    again = rerun(api, {"runs": ids, "version": 2})

    assert first.status_code == 202, first.json()
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    body = first.json()
    assert {k: body[k] for k in ("workflow", "version", "team", "requested_by", "key", "state",
                                 "total", "started", "refused", "pending", "selection")} == {
        "workflow": "triage", "version": 2, "team": "support", "requested_by": "user:requester",
        "key": "batch-1", "state": "running", "total": 2, "started": 0, "refused": 0, "pending": 2,
        "selection": {"runs": 2}}
    assert [i["source_run"] for i in body["items"]] == ids
    assert Rerun.objects.count() == 1
    conflict = rerun(api, {"runs": ids[:1], "version": 2})
    assert conflict.status_code == 409
    assert conflict.json()["errors"][0]["path"] == "Idempotency-Key"


def test_progress_shows_each_source_with_its_new_run(api, versions):
    broken, _ = versions
    sources = failed_runs(broken, 2)
    batch = rerun(api, {"filter": {"workflow": "triage", "state": ["failed"]}, "version": 2}).json()
    rerun_advance(rerun_id=batch["id"])

    progress = api.get(f"/api/v1/reruns/{batch['id']}/")

    assert progress.status_code == 200
    body = progress.json()
    assert (body["state"], body["started"], body["pending"]) == ("done", 2, 0)
    assert body["selection"] == {"filter": {"state": ["failed"]}}
    new_runs = {i["source_run"]: i["new_run"] for i in body["items"]}
    assert set(new_runs) == {str(r.id) for r in sources}
    assert {str(r.id) for r in Run.objects.filter(version__number=2)} == set(new_runs.values())
    assert [b["id"] for b in api.get("/api/v1/reruns/").json()["results"]] == [batch["id"]]


@pytest.mark.parametrize(("body", "headers", "path"), [
    ({"version": 2}, {"HTTP_IDEMPOTENCY_KEY": "k"}, "runs"),
    ({"runs": ["3f1c2a8e-7d4b-4c61-9a0e-5b2d8c7f1e93"], "version": 2}, {"HTTP_IDEMPOTENCY_KEY": "k"}, "runs"),
    ({"filter": {"workflow": "triage"}, "version": 9}, {"HTTP_IDEMPOTENCY_KEY": "k"}, "version"),
    ({"filter": {"workflow": "nothing"}, "version": 2}, {"HTTP_IDEMPOTENCY_KEY": "k"}, "filter.workflow"),
    ({"filter": {"workflow": "triage", "state": ["completed"]}, "version": 2},
     {"HTTP_IDEMPOTENCY_KEY": "k"}, "filter"),
    ({"filter": {"workflow": "triage"}, "version": 2}, {}, "Idempotency-Key"),
])
def test_a_request_naming_nothing_to_rerun_is_a_400_by_path(api, versions, body, headers, path):
    failed_runs(versions[0], 1)

    answer = api.post("/api/v1/runs/rerun/", body, format="json", **headers)

    assert answer.status_code == 400, answer.json()
    assert path in [e["path"] for e in answer.json()["errors"]]
    assert not Rerun.objects.exists()


def test_another_teams_runs_and_batches_are_not_reachable(api, outsider_api, versions):
    ids = [str(r.id) for r in failed_runs(versions[0], 1)]
    batch = rerun(api, {"runs": ids, "version": 2}).json()

    by_runs = rerun(outsider_api, {"runs": ids, "version": 2})
    by_filter = rerun(outsider_api, {"filter": {"workflow": "triage", "team": "support"}, "version": 2})

    assert by_runs.status_code == 400
    assert by_runs.json()["errors"] == [{"path": "runs", "message": "none of these runs is one of "
                                         "your teams' runs"}]
    assert by_filter.status_code == 400 and by_filter.json()["errors"][0]["path"] == "filter.workflow"
    assert outsider_api.get(f"/api/v1/reruns/{batch['id']}/").status_code == 404
    assert outsider_api.get("/api/v1/reruns/").json()["results"] == []
    assert Rerun.objects.count() == 1


def test_the_rerun_endpoints_are_in_the_openapi_schema(api):
    paths = api.get("/api/v1/schema/", HTTP_ACCEPT="application/json").json()["paths"]
    assert "post" in paths["/api/v1/runs/rerun/"]
    assert "get" in paths["/api/v1/reruns/{id}/"]
