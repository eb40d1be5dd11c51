"""Evaluations in a real browser: an editor starts an evaluation of a version from the dataset's
page and reads its page (progress, then every metric per tier with its interval bars and the
failing cases once its cases are scored), compares a draft's evaluation with the published
version's, and an owner sets the workflow's release policy and reads the gate's verdict on the
workflow's page. The screenshots in docs/evaluation.md are taken here.

The cases' scores are written into the rows (what `evaluation_advance` writes once the sandboxed
runs end; the engine's part is tested in tests/evaluation and tests/integration), so the pages
are read against numbers the test chose.
"""
import json

import pytest

from evaluation import selectors
from evaluation.models import Evaluation, ReleasePolicy
from evaluation.services import dataset_cases_add, dataset_create
from orchestrator.engine.services.workflows import workflow_policy_set, workflow_save
from orchestrator.models import Role
from tests.evaluation.canned import scored, started
from tests.evaluation.conftest import sample_cases
from tests.factories import SETUP, example_definition, member

from .conftest import expect

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]

#: The draft's failures: it raised the refund limit, so large refunds go out without approval.
RAISED = {"bad": {"never-arrived-01", "never-arrived-03", "partial-04", "injection-02"},
          "unauthorized": {"never-arrived-02", "never-arrived-04"}}
THRESHOLDS = {"tiers": {"high": {"unauthorized_actions": {"max": 0}, "action_accuracy": {"min": 0.98},
                                 "max_regression": 0.01},
                        "overall": {"pass_rate": {"min": 0.9}}}}


def person(team, name: str, role: str):
    user = member(team, name, role=role, staff=True)
    user.set_password(f"{name}-pass-1")
    user.save()
    return user


def sign_in(page, web_server: str, name: str, then: str) -> None:
    page.goto(f"{web_server}/admin/login/?next={then}")
    page.fill("#id_username", name)
    page.fill("#id_password", f"{name}-pass-1")
    page.click("input[type=submit]")


def refund_with_a_draft(team):
    """The refund example published as v1, and a draft v2 (saving no longer publishes)."""
    version, _ = workflow_save(team=team, definition=example_definition("refund-proposal"), actor=SETUP)
    workflow_policy_set(workflow_id=version.workflow_id, publish_on_save=False, actor=SETUP)
    workflow_save(team=team, definition={**example_definition("refund-proposal"),
                                         "description": "Refund proposals, with the refund limit raised."},
                  actor=SETUP)
    dataset = dataset_create(workflow=version.workflow, name="golden", actor=SETUP,
                             description="Refund requests, by how much a wrong answer costs.")
    dataset_cases_add(dataset=dataset, cases=sample_cases(), actor=SETUP, note="the refund example's cases")
    return version.workflow, dataset


def finished(evaluation: Evaluation, **outcome) -> Evaluation:
    """Its cases scored and it completed, summarised by the scorers' summary."""
    evaluation = scored(evaluation, **outcome, finish=False)
    summary = selectors.summarize(selectors.scored_results(evaluation))
    summary["cases"] = selectors.cases_by_state(evaluation)
    evaluation.complete(summary=summary)
    evaluation.save()
    return evaluation


def test_an_editor_evaluates_a_draft_and_reads_its_results(browser_page, screenshot, web_server, team):
    person(team, "editor", Role.EDITOR)
    workflow, dataset = refund_with_a_draft(team)
    page = browser_page

    sign_in(page, web_server, "editor", f"/admin/evaluation/dataset/{dataset.id}/change/")
    form = page.locator("#evaluate-form")
    assert form.locator("#id_version option:checked").inner_text() == "v2"
    assert form.locator("#id_dataset_version option:checked").inner_text() == "v2 (30 cases)"
    page.fill("#evaluate-form #id_budget_usd", "2.50")
    page.fill("#evaluate-form #id_note", "the raised refund limit")
    page.click("#evaluate-form input[type=submit]")
    page.wait_for_selector("text=started: version 2 over 30 cases")
    evaluation = Evaluation.objects.get()
    assert page.locator("#progress h2").inner_text().startswith("Progress: 0 of 30 cases scored")
    assert page.locator(".legend-pending").inner_text() == "pending 30"
    assert page.locator("#cancel-form").count() == 1

    finished(evaluation, **RAISED)
    page.reload()
    assert page.locator("#progress h2").inner_text() == "Progress: 30 of 30 cases scored"
    heads = [h.lower() for h in page.locator(".tier-table thead th").all_inner_texts()]
    assert heads == ["metric", "overall", "high", "medium", "low"]
    unauthorized = page.locator('.tier-table tr[data-metric="unauthorized_actions"]')
    assert unauthorized.locator("svg.ci-bar").count() == 4
    assert "n=10" in unauthorized.locator("td").nth(1).inner_text()
    assert page.locator("#cancel-form").count() == 0
    page.click("#cases >> text=failed")
    expect(page.locator("tr.case-row")).to_have_count(6)
    page.click("#cases >> text=all")
    screenshot(page, "evaluation-run")


def test_comparing_the_drafts_evaluation_with_the_published_versions(browser_page, screenshot, web_server, team):
    person(team, "editor", Role.EDITOR)
    workflow, dataset = refund_with_a_draft(team)
    base = finished(started(dataset, SETUP, version=1, note="published"))
    new = finished(started(dataset, SETUP, version=2, note="the raised refund limit"), **RAISED)
    page = browser_page

    sign_in(page, web_server, "editor", f"/admin/evaluation/evaluation/{new.id}/change/")
    page.select_option("#compare select[name=base]", str(base.id))
    page.click("#compare input[type=submit]")
    page.wait_for_selector("#changed")
    changed = page.locator("tr.changed-row")
    cases = {row.split("\t")[0] for row in changed.all_inner_texts()}
    assert cases == RAISED["bad"] | RAISED["unauthorized"]
    assert page.locator("tr.changed-row.better").count() == 0
    high = page.locator('.compare-table[data-tier="high"]')
    assert high.locator('tr[data-metric="unauthorized_actions"] td.delta.worse').count() == 1
    assert high.locator("svg.ci-bar").count() == high.locator("tbody tr").count()
    screenshot(page, "evaluation-compare")


def test_an_owner_sets_the_release_policy_and_reads_the_gate(browser_page, screenshot, web_server, team):
    person(team, "owner", Role.OWNER)
    workflow, dataset = refund_with_a_draft(team)
    finished(started(dataset, SETUP, version=1, note="published"))
    finished(started(dataset, SETUP, version=2, note="the raised refund limit"), **RAISED)
    page = browser_page

    sign_in(page, web_server, "owner", f"/admin/orchestrator/workflow/{workflow.id}/change/")
    assert "No release policy" in page.locator("#release-policy").inner_text()
    page.click("#release-policy-link")
    page.select_option("#id_dataset", str(dataset.id))
    page.fill("#id_thresholds", "{not json")
    page.click("#policy-form input[type=submit]")
    assert "not JSON" in page.locator("#policy-form").inner_text()
    assert not ReleasePolicy.objects.exists()
    page.fill("#id_thresholds", json.dumps(THRESHOLDS, indent=2))
    page.click("#policy-form input[type=submit]")
    page.wait_for_selector("text=The release policy of refund-proposal was set.")
    assert ReleasePolicy.objects.get().thresholds == THRESHOLDS
    rows = page.locator("#current-policy tr.threshold-row").all_inner_texts()
    assert any("unauthorized actions" in r and "≤ 0" in r for r in rows), rows
    checks = page.locator("#current-policy .gate-checks").inner_text()
    assert "Version 2" in checks and "Version 1 (published)" in checks and "held back" in checks
    screenshot(page, "evaluation-policy")

    page.goto(f"{web_server}/admin/orchestrator/workflow/{workflow.id}/change/")
    panel = page.locator("#release-policy").inner_text()
    assert "golden" in panel and "Change the release policy" in panel
