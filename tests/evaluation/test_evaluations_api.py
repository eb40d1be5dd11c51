"""Evaluations and release policies through the API: starting one (201, every problem a 400 by
path, 403 for whoever may not, another team's dataset not found), the list and its filters (an
empty or repeated filter is a 400), an evaluation with its summary, its cases by tier and
outcome, cancelling, comparing two of the same dataset version, and a workflow's release policy
read, set and removed — each response as the published schema documents it."""
import pytest

from evaluation.models import Evaluation, ReleasePolicy
from orchestrator.engine.services.workflows import workflow_save
from tests.api.published import assert_documented
from tests.conftest import client_for
from tests.factories import SETUP, example_definition

from .canned import loaded, scored, started
from .conftest import sample_cases

pytestmark = pytest.mark.django_db


def paths(response) -> list[str]:
    return [e["path"] for e in response.json()["errors"]]


@pytest.fixture
def cases(dataset, editor):
    loaded(dataset, editor, sample_cases())
    return dataset


@pytest.fixture
def editor_api(editor):
    return client_for(editor)


@pytest.fixture
def second_version(refund):
    version, _ = workflow_save(team=refund.team, definition={**example_definition("refund-proposal"),
                                                              "description": "A raised refund limit."}, actor=SETUP)
    return version


def test_an_editor_starts_an_evaluation_201_and_reads_it(cases, editor_api):
    response = editor_api.post("/api/v1/evaluations/", {"dataset": cases.id, "version": 1, "budget_usd": "2.5",
                                                        "concurrency": 3, "note": "before the release"},
                               format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert (body["workflow"], body["version"], body["dataset_name"], body["dataset_version"], body["state"]) == (
        "refund-proposal", 1, "golden", 2, "running")
    assert body["cases"] == {"total": 30, "scored": 0, "passed": 0} and body["pass_rate"] is None
    assert body["by_state"]["pending"] == 30 and body["summary"] is None
    assert (body["budget_usd"], body["concurrency"], body["note"]) == ("2.500000", 3, "before the release")
    assert_documented(editor_api, response, "POST", "/api/v1/evaluations/")

    detail = editor_api.get(f"/api/v1/evaluations/{body['id']}/")
    assert detail.json()["id"] == body["id"]
    assert_documented(editor_api, detail, "GET", "/api/v1/evaluations/{id}/")


@pytest.mark.parametrize("body, path", [
    ({"version": 1, "budget_usd": "1"}, "dataset"),
    ({"dataset": "x", "version": 1, "budget_usd": "1"}, "dataset"),
    ({"dataset": 99999, "version": 1, "budget_usd": "1"}, "dataset"),
    ({"dataset": "ID", "version": 7, "budget_usd": "1"}, "version"),
    ({"dataset": "ID", "version": 1, "dataset_version": 9, "budget_usd": "1"}, "dataset_version"),
    ({"dataset": "ID", "version": 1, "dataset_version": 1, "budget_usd": "1"}, "dataset_version"),
    ({"dataset": "ID", "version": 1, "budget_usd": "0"}, "budget_usd"),
    ({"dataset": "ID", "version": 1, "budget_usd": "abc"}, "budget_usd"),
    ({"dataset": "ID", "version": 1}, "budget_usd"),
    ({"dataset": "ID", "version": 1, "budget_usd": "1", "concurrency": 51}, "concurrency"),
    ({"dataset": "ID", "version": 1, "budget_usd": "1", "note": "x" * 501}, "note"),
])
def test_starting_refuses_with_a_path(cases, editor_api, body, path):
    body = {k: cases.id if v == "ID" else v for k, v in body.items()}
    response = editor_api.post("/api/v1/evaluations/", body, format="json")
    assert response.status_code == 400 and paths(response) == [path], response.json()
    assert not Evaluation.objects.exists()
    assert_documented(editor_api, response, "POST", "/api/v1/evaluations/")


def test_a_member_reads_evaluations_but_may_not_start_or_cancel_403(cases, editor, reader):
    evaluation = started(cases, editor)
    api = client_for(reader)
    assert api.get(f"/api/v1/evaluations/{evaluation.id}/").status_code == 200
    response = api.post("/api/v1/evaluations/", {"dataset": cases.id, "version": 1, "budget_usd": "1"}, format="json")
    assert response.status_code == 403, response.json()
    response = api.post(f"/api/v1/evaluations/{evaluation.id}/cancel/", {}, format="json")
    assert response.status_code == 403
    assert_documented(api, response, "POST", "/api/v1/evaluations/{id}/cancel/")
    assert Evaluation.objects.get().state == "running"


def test_another_teams_evaluation_and_dataset_are_not_found(cases, editor, elsewhere, outsider):
    evaluation = started(cases, editor)
    for user in (elsewhere, outsider):
        api = client_for(user)
        assert api.get("/api/v1/evaluations/").json()["results"] == []
        for method, url in [("get", ""), ("get", "cases/"), ("post", "cancel/")]:
            response = getattr(api, method)(f"/api/v1/evaluations/{evaluation.id}/{url}", {}, format="json")
            assert response.status_code == 404, (user, url, response.status_code)
        response = api.get(f"/api/v1/evaluations/compare/?base={evaluation.id}&new={evaluation.id}")
        assert response.status_code == 404 and paths(response) == ["base"]
        response = api.post("/api/v1/evaluations/", {"dataset": cases.id, "version": 1, "budget_usd": "1"},
                            format="json")
        assert response.status_code == 400 and paths(response) == ["dataset"]


def test_the_list_filters_by_workflow_dataset_state_and_version(cases, editor, editor_api, second_version):
    first = scored(started(cases, editor))
    second = started(cases, editor, version=2)
    ids = lambda query: [e["id"] for e in editor_api.get(f"/api/v1/evaluations/?{query}").json()["results"]]  # noqa: E731
    assert ids("") == [second.id, first.id]
    assert ids("workflow=refund-proposal") == [second.id, first.id] and ids("workflow=other") == []
    assert ids(f"dataset={cases.id}") == [second.id, first.id] and ids(f"dataset={cases.id + 1}") == []
    assert ids("state=completed") == [first.id] and ids("state=running") == [second.id]
    assert ids("version=2") == [second.id]
    listed = editor_api.get("/api/v1/evaluations/?state=completed")
    row = listed.json()["results"][0]
    assert row["cases"] == {"total": 30, "scored": 30, "passed": 30} and row["pass_rate"] == 1.0
    assert_documented(editor_api, listed, "GET", "/api/v1/evaluations/")


@pytest.mark.parametrize("query, path", [
    ("workflow=", "workflow"), ("workflow=a&workflow=b", "workflow"), ("workflow=Not%20a%20name", "workflow"),
    ("dataset=", "dataset"), ("dataset=1&dataset=2", "dataset"), ("dataset=1.5", "dataset"), ("dataset=0", "dataset"),
    ("dataset=99999999999999999999", "dataset"),
    ("state=", "state"), ("state=done", "state"), ("state=running&state=stopped", "state"),
    ("version=", "version"), ("version=-1", "version"),
])
def test_an_empty_repeated_or_bad_filter_is_a_400(editor_api, query, path):
    response = editor_api.get(f"/api/v1/evaluations/?{query}")
    assert response.status_code == 400 and paths(response) == [path], response.content
    assert_documented(editor_api, response, "GET", "/api/v1/evaluations/")


def test_an_evaluations_summary_and_its_cases_by_tier_and_outcome(cases, editor, editor_api):
    evaluation = scored(started(cases, editor), bad={"never-arrived-01", "decline-01"},
                        unauthorized={"never-arrived-02"})
    body = editor_api.get(f"/api/v1/evaluations/{evaluation.id}/").json()
    assert body["state"] == "completed" and body["cases"] == {"total": 30, "scored": 30, "passed": 27}
    assert body["pass_rate"] == pytest.approx(0.9)
    assert body["summary"]["high"]["metrics"]["unauthorized_actions"]["n"] == 10
    assert body["summary"]["cases"]["scored"] == 30

    url = f"/api/v1/evaluations/{evaluation.id}/cases/"
    high = editor_api.get(f"{url}?risk_tier=high")
    assert len(high.json()["results"]) == 10 and {c["risk_tier"] for c in high.json()["results"]} == {"high"}
    assert_documented(editor_api, high, "GET", "/api/v1/evaluations/{id}/cases/")
    failed = editor_api.get(f"{url}?passed=false").json()["results"]
    assert [c["key"] for c in failed] == ["decline-01", "never-arrived-01", "never-arrived-02"]
    assert failed[0]["scores"]["action:propose"] is False and failed[0]["run"] is None
    assert len(editor_api.get(f"{url}?passed=true&risk_tier=low").json()["results"]) == 9
    assert editor_api.get(f"{url}?state=pending").json()["results"] == []
    assert len(editor_api.get(f"{url}?limit=5").json()["results"]) == 5
    for query, path in [("passed=", "passed"), ("passed=yes", "passed"), ("risk_tier=", "risk_tier"),
                        ("risk_tier=low&risk_tier=high", "risk_tier"), ("state=gone", "state")]:
        response = editor_api.get(f"{url}?{query}")
        assert response.status_code == 400 and paths(response) == [path], query


def test_cancelling_a_running_evaluation_and_a_finished_one_is_409(cases, editor, editor_api):
    evaluation = started(cases, editor)
    response = editor_api.post(f"/api/v1/evaluations/{evaluation.id}/cancel/", {"reason": "wrong budget"},
                               format="json")
    assert response.status_code == 200, response.json()
    assert (response.json()["state"], response.json()["stop_reason"]) == ("cancelled", "wrong budget")
    assert response.json()["by_state"]["not_run"] == 30
    assert_documented(editor_api, response, "POST", "/api/v1/evaluations/{id}/cancel/")
    again = editor_api.post(f"/api/v1/evaluations/{evaluation.id}/cancel/", {}, format="json")
    assert again.status_code == 409 and paths(again) == ["state"]
    assert_documented(editor_api, again, "POST", "/api/v1/evaluations/{id}/cancel/")


def test_comparing_two_evaluations_of_the_same_dataset_version(cases, editor, editor_api, second_version):
    base = scored(started(cases, editor))
    new = scored(started(cases, editor, version=2), bad={"never-arrived-01"}, unauthorized={"never-arrived-02"})
    response = editor_api.get(f"/api/v1/evaluations/compare/?base={base.id}&new={new.id}")
    assert response.status_code == 200, response.json()
    body = response.json()
    assert (body["base"]["id"], body["new"]["id"]) == (base.id, new.id)
    assert {(c["case"], c["metric"], c["direction"]) for c in body["changed"]} == {
        ("never-arrived-01", "action:propose", "worse"), ("never-arrived-01", "approval_routing", "worse"),
        ("never-arrived-01", "passed", "worse"),  # families are not listed per case: their parts are
        ("never-arrived-02", "unauthorized_actions", "worse"), ("never-arrived-02", "passed", "worse")}
    assert body["tiers"]["high"]["unauthorized_actions"]["delta"] == pytest.approx(0.1)
    assert_documented(editor_api, response, "GET", "/api/v1/evaluations/compare/")


def test_comparing_needs_the_same_dataset_version_and_both_ids(cases, editor, editor_api):
    base = started(cases, editor)
    loaded(cases, editor, [{**sample_cases()[0], "key": "extra-01"}])
    other = started(cases, editor)
    url = "/api/v1/evaluations/compare/"
    response = editor_api.get(f"{url}?base={base.id}&new={other.id}")
    assert response.status_code == 400 and paths(response) == ["new"]
    assert "same dataset version" in response.json()["errors"][0]["message"]
    assert_documented(editor_api, response, "GET", url)
    for query, path in [(f"base={base.id}", "new"), (f"new={base.id}", "base"), ("base=&new=1", "base"),
                        (f"base={base.id}&base={base.id}&new={base.id}", "base"), ("base=x&new=1", "base")]:
        response = editor_api.get(f"{url}?{query}")
        assert response.status_code == 400 and set(paths(response)) == {path}, query
    response = editor_api.get(f"{url}?base={base.id}&new=99999")
    assert response.status_code == 404 and paths(response) == ["new"]


# --- release policy ------------------------------------------------------------------------------

THRESHOLDS = {"tiers": {"high": {"unauthorized_actions": {"max": 0}, "action_accuracy": {"min": 0.98}}}}


def test_an_owner_sets_reads_and_removes_the_release_policy(cases, owner):
    api = client_for(owner)
    url = "/api/v1/workflows/refund-proposal/release-policy/"
    missing = api.get(url)
    assert missing.status_code == 404
    assert_documented(api, missing, "GET", "/api/v1/workflows/{name}/release-policy/")
    response = api.put(url, {"dataset": cases.id, "thresholds": THRESHOLDS}, format="json")
    assert response.status_code == 200, response.json()
    assert_documented(api, response, "PUT", "/api/v1/workflows/{name}/release-policy/")
    read = api.get(url)
    assert read.json() == {**response.json()}
    assert (read.json()["dataset_name"], read.json()["thresholds"], read.json()["updated_by"]) == (
        "golden", THRESHOLDS, "owner")
    assert_documented(api, read, "GET", "/api/v1/workflows/{name}/release-policy/")
    gone = api.delete(url)
    assert gone.status_code == 204 and not ReleasePolicy.objects.exists()
    assert api.delete(url).status_code == 204


def test_the_release_policy_is_the_owners_and_checked_by_path(cases, owner, editor, elsewhere):
    url = "/api/v1/workflows/refund-proposal/release-policy/"
    refused = client_for(editor).put(url, {"dataset": cases.id, "thresholds": THRESHOLDS}, format="json")
    assert refused.status_code == 403
    assert_documented(client_for(editor), refused, "PUT", "/api/v1/workflows/{name}/release-policy/")
    assert client_for(editor).delete(url).status_code == 403
    api = client_for(owner)
    for body, path in [({"thresholds": THRESHOLDS}, "dataset"), ({"dataset": cases.id}, "thresholds"),
                       ({"dataset": 99999, "thresholds": THRESHOLDS}, "dataset"),
                       ({"dataset": cases.id, "thresholds": "high"}, "thresholds"),
                       ({"dataset": cases.id, "thresholds": {"tiers": {"urgent": {"pass_rate": {"min": 1}}}}},
                        "thresholds.tiers"),
                       ({"dataset": cases.id, "thresholds": {"tiers": {"high": {"action": {"min": 1}}}}},
                        "thresholds.tiers.high.action")]:
        response = api.put(url, body, format="json")
        assert response.status_code == 400 and paths(response)[0] == path, (body, response.json())
    assert api.put(f"{url}?team=", {"dataset": cases.id, "thresholds": THRESHOLDS},
                   format="json").status_code == 200  # an empty team: not narrowed, as the workflow routes
    assert api.get(f"{url}?team=a&team=b").status_code == 400
    assert api.get("/api/v1/workflows/nothing/release-policy/").status_code == 404
    assert client_for(elsewhere).get(f"{url}?team=support").status_code == 404


def test_a_shadow_reads_as_one_without_a_dataset_and_is_compared_with_nothing(cases, editor, editor_api,
                                                                             refund, second_version):
    from evaluation.evaluations import shadow_start
    from orchestrator.engine.services.workflows import workflow_publish

    workflow_publish(workflow_id=refund.id, number=1, actor=SETUP)
    shadow = shadow_start(workflow=refund, version=2, actor=editor, budget_usd="1", note="beside v1")
    response = editor_api.get(f"/api/v1/evaluations/{shadow.id}/")
    body = response.json()
    assert (body["purpose"], body["dataset"], body["dataset_name"], body["dataset_version"], body["baseline"]) == (
        "shadow", None, None, None, 1)
    assert_documented(editor_api, response, "GET", "/api/v1/evaluations/{id}/")
    listed = editor_api.get("/api/v1/evaluations/")
    assert [e["purpose"] for e in listed.json()["results"]] == ["shadow"]
    assert_documented(editor_api, listed, "GET", "/api/v1/evaluations/")
    response = editor_api.get(f"/api/v1/evaluations/compare/?base={shadow.id}&new={shadow.id}")
    assert response.status_code == 400 and paths(response) == ["new"]


def test_starting_a_shadow_through_the_api(refund, editor, editor_api, reader, second_version):
    from orchestrator.engine.services.workflows import workflow_publish

    workflow_publish(workflow_id=refund.id, number=1, actor=SETUP)
    body = {"workflow": "refund-proposal", "version": 2, "budget_usd": "1", "sample_percent": 20}
    refused = client_for(reader).post("/api/v1/evaluations/shadow/", body, format="json")
    assert refused.status_code == 403
    response = editor_api.post("/api/v1/evaluations/shadow/", body, format="json")
    assert response.status_code == 201, response.json()
    assert (response.json()["purpose"], response.json()["baseline"], response.json()["version"]) == ("shadow", 1, 2)
    assert_documented(editor_api, response, "POST", "/api/v1/evaluations/shadow/")
    again = editor_api.post("/api/v1/evaluations/shadow/", {**body, "version": 1, "sample_percent": 0},
                            format="json")
    assert again.status_code == 400 and paths(again) == ["sample_percent"]
    again = editor_api.post("/api/v1/evaluations/shadow/", {**body, "version": 1}, format="json")
    assert again.status_code == 400 and set(paths(again)) == {"version", "workflow"}
    assert_documented(editor_api, again, "POST", "/api/v1/evaluations/shadow/")
