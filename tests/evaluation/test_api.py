"""Datasets through the API: each endpoint's answers (201, 400 with paths, 403, 404 for another
team's dataset, 409), pagination, the upload's two forms, and the Python client."""
import json

import httpx
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from evaluation.models import Dataset
from stepwise_client import Stepwise
from tests.conftest import client_for

from .conftest import SAMPLES, good_case, sample_cases

pytestmark = pytest.mark.django_db


def paths(response) -> list[str]:
    return [e["path"] for e in response.json()["errors"]]


@pytest.fixture
def editor_api(editor):
    return client_for(editor)


@pytest.fixture
def loaded(dataset, editor_api):
    response = editor_api.post(f"/api/v1/datasets/{dataset.id}/cases/", {"cases": sample_cases()}, format="json")
    assert response.status_code == 201, response.json()
    return dataset


def test_create_list_and_read_a_dataset(refund, editor_api):
    response = editor_api.post("/api/v1/datasets/", {"workflow": "refund-proposal", "name": "golden",
                                                     "description": "d"}, format="json")
    assert response.status_code == 201, response.json()
    created = response.json()
    assert (created["team"], created["workflow"], created["latest"]["number"]) == ("support", "refund-proposal", 1)

    listed = editor_api.get("/api/v1/datasets/?workflow=refund-proposal").json()
    assert [d["name"] for d in listed["results"]] == ["golden"]
    assert editor_api.get("/api/v1/datasets/?workflow=other").json()["results"] == []

    detail = editor_api.get(f"/api/v1/datasets/{created['id']}/").json()
    assert [v["number"] for v in detail["versions"]] == [1]


@pytest.mark.parametrize("body, path", [
    ({"workflow": "refund-proposal", "name": "Bad Name"}, "name"),
    ({"workflow": "nope", "name": "x"}, "workflow"),
    ({"name": "x"}, "workflow"),
])
def test_create_refuses_with_a_path(refund, editor_api, body, path):
    response = editor_api.post("/api/v1/datasets/", body, format="json")
    assert response.status_code == 400 and paths(response) == [path]


def test_a_member_reads_but_may_not_change_403(loaded, reader):
    api = client_for(reader)
    assert api.get(f"/api/v1/datasets/{loaded.id}/cases/").status_code == 200
    for url, body in [("cases/", {"cases": [good_case()]}), ("cases/remove/", {"keys": ["decline-01"]})]:
        response = api.post(f"/api/v1/datasets/{loaded.id}/{url}", body, format="json")
        assert response.status_code == 403, response.json()
    assert api.post("/api/v1/datasets/", {"workflow": "refund-proposal", "name": "mine"},
                    format="json").status_code == 403
    assert loaded.versions.count() == 2


def test_another_teams_dataset_is_not_found_404(loaded, elsewhere, outsider):
    for user in (elsewhere, outsider):
        api = client_for(user)
        assert loaded.id not in [d["id"] for d in api.get("/api/v1/datasets/").json()["results"]]
        for method, url, body in [
            ("get", "", None), ("get", "cases/", None), ("get", "versions/1/cases/", None),
            ("post", "cases/", {"cases": [good_case()]}), ("post", "cases/remove/", {"keys": ["decline-01"]}),
            ("post", "from-run/", {"run": "00000000-0000-0000-0000-000000000000", "risk_tier": "low"}),
        ]:
            response = getattr(api, method)(f"/api/v1/datasets/{loaded.id}/{url}", body, format="json")
            assert response.status_code == 404, (user, url, response.status_code)
    assert loaded.versions.count() == 2


def test_cases_are_listed_by_key_a_page_at_a_time_and_filtered(loaded, editor_api):
    first = editor_api.get(f"/api/v1/datasets/{loaded.id}/cases/?limit=7").json()
    assert len(first["results"]) == 7 and first["previous"] is None
    keys = [c["key"] for c in first["results"]]
    assert keys == sorted(keys)
    second = editor_api.get(first["next"]).json()
    assert second["results"][0]["key"] > keys[-1]
    high = editor_api.get(f"/api/v1/datasets/{loaded.id}/cases/?risk_tier=high&limit=100").json()
    assert len(high["results"]) == 10 and high["next"] is None and {c["risk_tier"] for c in high["results"]} == {"high"}
    tagged = editor_api.get(f"/api/v1/datasets/{loaded.id}/cases/?tag=injection").json()
    assert len(tagged["results"]) == 4 and tagged["next"] is None
    assert editor_api.get(f"/api/v1/datasets/{loaded.id}/cases/?limit=0").status_code == 400
    assert editor_api.get(f"/api/v1/datasets/{loaded.id}/cases/?risk_tier=urgent").status_code == 400


def test_an_old_version_keeps_its_cases(loaded, editor_api):
    response = editor_api.post(f"/api/v1/datasets/{loaded.id}/cases/remove/", {"keys": ["decline-01"]}, format="json")
    assert response.status_code == 201 and response.json()["number"] == 3
    assert len(editor_api.get(f"/api/v1/datasets/{loaded.id}/versions/2/cases/").json()["results"]) == 30
    assert len(editor_api.get(f"/api/v1/datasets/{loaded.id}/versions/3/cases/").json()["results"]) == 29
    assert editor_api.get(f"/api/v1/datasets/{loaded.id}/versions/9/cases/").status_code == 404


def test_adding_bad_cases_is_a_400_listing_each_path(dataset, editor_api):
    response = editor_api.post(f"/api/v1/datasets/{dataset.id}/cases/", {"cases": [
        good_case("a"), good_case("b", risk_tier="urgent"), good_case("c", input={"order_id": 1, "message": "m"})]},
        format="json")
    assert response.status_code == 400
    assert paths(response) == ["cases[1].risk_tier", "cases[2].input.order_id"]
    response = editor_api.post(f"/api/v1/datasets/{dataset.id}/cases/", {"cases": [good_case()], "mode": "merge"},
                               format="json")
    assert response.status_code == 400 and paths(response) == ["mode"]


def test_upload_as_a_body_or_as_a_multipart_file(dataset, editor_api):
    data = (SAMPLES / "refund-proposal.jsonl").read_bytes()
    response = editor_api.generic("POST", f"/api/v1/datasets/{dataset.id}/upload/?note=first", data,
                                  content_type="application/jsonl")
    assert response.status_code == 201, response.json()
    assert (response.json()["case_count"], response.json()["note"]) == (30, "first")

    csv = b'key,input,expected,risk_tier,tags\nx1,"{""order_id"": ""ORD-1001"", ""message"": ""m""}",' \
          b'"{""run"": {""state"": ""completed""}}",low,a\n'
    response = editor_api.post(f"/api/v1/datasets/{dataset.id}/upload/",
                               {"file": SimpleUploadedFile("more.csv", csv, "text/csv"), "mode": "add"},
                               format="multipart")
    assert response.status_code == 201, response.json()
    assert response.json()["case_count"] == 31


def test_an_upload_with_bad_lines_is_a_400_naming_each_line(dataset, editor_api):
    data = json.dumps(good_case("a")) + "\nnot json\n" + json.dumps(good_case("b", risk_tier="x")) + "\n"
    response = editor_api.generic("POST", f"/api/v1/datasets/{dataset.id}/upload/", data.encode(),
                                  content_type="application/jsonl")
    assert response.status_code == 400 and paths(response) == ["line 2"]
    response = editor_api.post(f"/api/v1/datasets/{dataset.id}/upload/",
                               {"file": SimpleUploadedFile("cases.txt", b"{}", "text/plain")}, format="multipart")
    assert response.status_code == 400 and paths(response) == ["file"]
    assert dataset.versions.count() == 1


def test_add_a_finished_run_corrected_and_refuse_a_live_one(dataset, finished_run, operator, refund, editor):
    from orchestrator.engine.services.runs import run_start

    api = client_for(operator)
    response = api.post(f"/api/v1/datasets/{dataset.id}/from-run/", {
        "run": str(finished_run.id), "risk_tier": "high", "tags": ["prod"],
        "expected": {"run": {"must_be_approved": True}}}, format="json")
    assert response.status_code == 201, response.json()
    case = api.get(f"/api/v1/datasets/{dataset.id}/cases/").json()["results"][0]
    assert case["source_run"] == str(finished_run.id) and case["expected"] == {"run": {"must_be_approved": True}}

    live = run_start(version=refund.active_version, input={"order_id": "ORD-1003", "message": "hi"}, actor=editor)
    response = api.post(f"/api/v1/datasets/{dataset.id}/from-run/", {"run": str(live.id), "risk_tier": "low"},
                        format="json")
    assert response.status_code == 409 and paths(response) == ["run"]
    response = api.post(f"/api/v1/datasets/{dataset.id}/from-run/",
                        {"run": "00000000-0000-0000-0000-000000000000", "risk_tier": "low"}, format="json")
    assert response.status_code == 400 and paths(response) == ["run"]


def test_the_python_client(refund, editor, live_server_client):
    client = live_server_client(editor)
    created = client.create_dataset("refund-proposal", "golden", description="d")
    version = client.upload_cases(created["id"], (SAMPLES / "refund-proposal.jsonl").read_bytes(), format="jsonl")
    assert version["case_count"] == 30
    version = client.add_cases(created["id"], [good_case()])
    assert version["number"] == 3
    version = client.remove_cases(created["id"], ["c1"])
    assert version["case_count"] == 30
    assert len(client.cases(created["id"], version=2)) == 30
    assert [d["name"] for d in client.datasets(workflow="refund-proposal")] == ["golden"]
    assert client.dataset(created["id"])["versions"][0]["number"] == 4
    assert Dataset.objects.get(pk=created["id"]).versions.count() == 4


@pytest.fixture
def live_server_client():
    """A client whose HTTP goes through Django's test client (no server: same process, same
    transaction)."""
    def build(user):
        api = client_for(user)

        def answer(request: httpx.Request) -> httpx.Response:
            content_type = request.headers.get("content-type", "")
            response = api.generic(request.method, str(request.url.raw_path.decode()), request.content,
                                   content_type=content_type)
            return httpx.Response(response.status_code, content=response.content,
                                  headers={"content-type": response.get("Content-Type", "")})

        http = httpx.Client(base_url="http://stepwise.test", transport=httpx.MockTransport(answer))
        return Stepwise("http://stepwise.test", "unused", http=http)
    return build


def test_listing_datasets_reads_their_latest_versions_at_once(refund, editor, editor_api,
                                                              django_assert_max_num_queries):
    from evaluation.services import dataset_create

    dataset_create(workflow=refund, name="first", actor=editor)
    editor_api.get("/api/v1/datasets/")  # the token, the session: read once
    with django_assert_max_num_queries(6) as few:
        editor_api.get("/api/v1/datasets/")
    for n in range(5):
        dataset_create(workflow=refund, name=f"more-{n}", actor=editor)
    with django_assert_max_num_queries(len(few.captured_queries)):
        assert len(editor_api.get("/api/v1/datasets/").json()["results"]) == 6


@pytest.mark.parametrize("query", ["risk_tier=", "risk_tier=high&risk_tier=low", "risk_tier=urgent",
                                   "tag=a&tag=b"])
def test_a_case_list_refuses_an_empty_repeated_or_unknown_filter_naming_it(query, loaded, editor_api):
    answer = editor_api.get(f"/api/v1/datasets/{loaded.id}/cases/?{query}")
    assert answer.status_code == 400
    assert paths(answer) == [query.split("=")[0]]
