"""Datasets in the admin: listed per team, a dataset's page with its versions and cases, the
upload and remove forms, creating one, and adding a finished run from its page — each through
the services, refused for whoever may not, and another team's dataset not found."""
import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from evaluation.models import Dataset
from evaluation.services import dataset_cases_add, dataset_create
from tests.factories import SETUP

from .conftest import SAMPLES, good_case, sample_cases

pytestmark = pytest.mark.django_db


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_list_shows_the_datasets_of_ones_teams_only(dataset, elsewhere, editor):
    from orchestrator.models import Workflow

    theirs = dataset_create(workflow=Workflow.objects.get(team__slug="elsewhere"), name="theirs", actor=SETUP)
    page = signed_in(editor).get("/admin/evaluation/dataset/").content.decode()
    assert "golden" in page and "theirs" not in page
    page = signed_in(elsewhere).get("/admin/evaluation/dataset/").content.decode()
    assert "theirs" in page and ">golden<" not in page
    assert signed_in(elsewhere).get(f"/admin/evaluation/dataset/{dataset.id}/change/").status_code == 404
    assert signed_in(editor).get(f"/admin/evaluation/dataset/{theirs.id}/change/").status_code == 404


def test_a_datasets_page_shows_its_versions_and_a_versions_cases(dataset, editor, reader):
    dataset_cases_add(dataset=dataset, cases=sample_cases(), actor=editor)
    dataset_cases_add(dataset=dataset, cases=[good_case()], actor=editor)
    page = signed_in(reader).get(f"/admin/evaluation/dataset/{dataset.id}/change/?version=2&risk_tier=high")
    text = page.content.decode()
    assert page.status_code == 200
    assert "Cases of version 2 (10 high)" in text and "<code>never-arrived-01</code>" in text and "<code>c1</code>" not in text
    assert text.count('class="case-row"') == 10
    assert 'id="upload-form"' not in text  # a member reads, and is offered no change
    text = signed_in(editor).get(f"/admin/evaluation/dataset/{dataset.id}/change/").content.decode()
    assert "Cases of version 3 (31)" in text and 'id="upload-form"' in text and "page 1 of 1" not in text


def test_an_editor_uploads_a_file_and_a_bad_one_lists_each_line(dataset, editor):
    client = signed_in(editor)
    bad = (json.dumps(good_case("a")) + "\n" + json.dumps(good_case("b", risk_tier="urgent")) + "\n").encode()
    page = client.post(f"/admin/evaluation/dataset/{dataset.id}/upload/",
                       {"file": SimpleUploadedFile("bad.jsonl", bad), "mode": "add"})
    assert page.status_code == 200 and "<code>line 2.risk_tier</code>" in page.content.decode()
    assert dataset.versions.count() == 1

    response = client.post(f"/admin/evaluation/dataset/{dataset.id}/upload/", {
        "file": SimpleUploadedFile("refund.jsonl", (SAMPLES / "refund-proposal.jsonl").read_bytes()),
        "mode": "add", "note": "from the admin"})
    assert response.status_code == 302
    assert dataset.latest_version.case_count == 30 and dataset.latest_version.note == "from the admin"


def test_a_member_may_not_upload_nor_remove(dataset, reader, editor):
    dataset_cases_add(dataset=dataset, cases=[good_case()], actor=editor)
    client = signed_in(reader)
    page = client.post(f"/admin/evaluation/dataset/{dataset.id}/upload/", {
        "file": SimpleUploadedFile("refund.jsonl", (SAMPLES / "refund-proposal.jsonl").read_bytes()), "mode": "add"})
    assert "may not dataset.edit" in page.content.decode()
    client.post(f"/admin/evaluation/dataset/{dataset.id}/remove/", {"keys": "c1"})
    assert dataset.versions.count() == 2


def test_an_editor_removes_cases_by_key(dataset, editor):
    dataset_cases_add(dataset=dataset, cases=sample_cases(), actor=editor)
    signed_in(editor).post(f"/admin/evaluation/dataset/{dataset.id}/remove/", {"keys": "decline-01\ndecline-02\n"})
    assert dataset.latest_version.case_count == 28


def test_creating_a_dataset_in_the_admin(refund, editor, reader):
    assert signed_in(reader).get("/admin/evaluation/dataset/add/").status_code in (403, 404)
    client = signed_in(editor)
    response = client.post("/admin/evaluation/dataset/add/", {"workflow": refund.id, "name": "golden"})
    assert response.status_code == 302
    assert Dataset.objects.get(workflow=refund, name="golden").versions.count() == 1
    page = client.post("/admin/evaluation/dataset/add/", {"workflow": refund.id, "name": "golden"})
    assert "already has a dataset" in page.content.decode()


def test_a_finished_runs_page_offers_add_to_a_dataset_to_editors_and_operators(finished_run, editor, operator, reader):
    for user, offered in [(editor, True), (operator, True), (reader, False)]:
        page = signed_in(user).get(f"/admin/orchestrator/run/{finished_run.id}/change/").content.decode()
        assert ('id="add-to-dataset"' in page) is offered, user


def test_adding_a_run_with_its_outcome_corrected(dataset, finished_run, operator):
    client = signed_in(operator)
    form = client.get(f"/admin/evaluation/dataset/from-run/{finished_run.id}/").content.decode()
    assert "&quot;decline&quot;" in form  # what the run did, offered for correction
    corrected = {"run": {"must_be_approved": True}, "steps": {"propose": {"action": {"name": "refund"}}}}
    bad = client.post(f"/admin/evaluation/dataset/from-run/{finished_run.id}/", {
        "dataset": dataset.id, "risk_tier": "high", "expected": json.dumps({"steps": {"ghost": {"abstain": True}}})})
    assert "<code>cases[0].expected.steps.ghost</code>" in bad.content.decode()
    response = client.post(f"/admin/evaluation/dataset/from-run/{finished_run.id}/", {
        "dataset": dataset.id, "risk_tier": "high", "tags": "prod, refund", "expected": json.dumps(corrected)})
    assert response.status_code == 302
    case = dataset.latest_version.cases.get()
    assert (case.expected, case.tags, case.source_run_id) == (corrected, ["prod", "refund"], finished_run.id)


def test_a_run_of_another_team_is_not_found(finished_run, elsewhere):
    assert signed_in(elsewhere).get(f"/admin/evaluation/dataset/from-run/{finished_run.id}/").status_code == 404
