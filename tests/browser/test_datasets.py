"""Datasets in a real browser: an editor uploads the refund example's JSON lines file to a
dataset and reads its cases by tier, then opens a finished run (run by the real workers), takes
"Add to a dataset" from its page, corrects the expected outcome and adds it. The screenshots in
docs/evaluation.md are taken here."""
import json

import pytest

from evaluation.models import Dataset
from evaluation.services import dataset_create
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Role
from tests.evaluation.conftest import SAMPLES
from tests.factories import SETUP, example_definition, member

from .conftest import expect, wait_for_run

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_an_editor_uploads_cases_and_adds_a_corrected_run(browser_page, screenshot, workers, web_server,
                                                          team, tmp_path):
    editor = member(team, "editor", role=Role.EDITOR, staff=True)
    editor.set_password("editor-pass-1")
    editor.save()
    version, _ = workflow_save(team=team, definition=example_definition("refund-proposal"), actor=SETUP)
    dataset = dataset_create(workflow=version.workflow, name="golden", actor=SETUP,
                             description="Refund requests, by how much a wrong answer costs.")
    run = run_start(version=version, input={"order_id": "ORD-1002", "message": "Just wanted to say hi."},
                    actor=SETUP)
    run = wait_for_run(run.id, states=("completed", "failed"), timeout=90)
    assert run.state == "completed"
    page = browser_page

    page.goto(f"{web_server}/admin/login/?next=/admin/evaluation/dataset/")
    page.fill("#id_username", "editor")
    page.fill("#id_password", "editor-pass-1")
    page.click("input[type=submit]")
    page.click("text=golden")
    page.set_input_files("#upload-form input[type=file]", str(SAMPLES / "refund-proposal.jsonl"))
    page.fill("#upload-form input[name=note]", "the refund example's cases")
    page.click("#upload-form input[type=submit]")
    page.wait_for_selector("text=Version 2: 30 cases.")
    page.click("#cases >> text=high")
    expect(page.locator("#cases h2")).to_have_text("Cases of version 2 (10 high)")
    expect(page.locator("tr.case-row")).to_have_count(10)
    screenshot(page, "evaluation-dataset")

    page.goto(f"{web_server}/admin/orchestrator/run/{run.id}/change/")
    page.click("#add-to-dataset")
    page.select_option("#id_risk_tier", "high")
    page.fill("#id_tags", "from-production, corrected")
    offered = json.loads(page.input_value("#id_expected"))
    assert offered["steps"]["propose"]["action"]["name"] == "decline"
    corrected = {"run": {"state": "completed", "must_be_approved": False},
                 "steps": {"propose": {"action": {"name": "decline"}}}}
    page.fill("#id_expected", json.dumps(corrected, indent=2))
    screenshot(page, "evaluation-add-run")
    page.click("#from-run-form input[type=submit]")
    page.wait_for_selector("text=version 3, 31 cases")

    case = Dataset.objects.get(pk=dataset.pk).latest_version.cases.get(key=f"run-{run.id}")
    assert (case.expected, case.risk_tier, case.tags) == (corrected, "high", ["from-production", "corrected"])
    assert case.input == {"order_id": "ORD-1002", "message": "Just wanted to say hi."}
