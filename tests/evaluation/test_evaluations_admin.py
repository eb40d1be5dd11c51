"""Evaluations and release policies in the admin: the list, an evaluation's page (progress, every
metric per tier with its interval bar, the release gate, its cases, Cancel), "Evaluate a version"
on a dataset's page, the comparison page, and a workflow's release policy shown on its page and
edited by owners — each change through its service, refused for whoever may not, and another
team's objects not found."""
import json
import re

import pytest
from django.test import Client

from evaluation.models import Evaluation, ReleasePolicy
from evaluation.services import dataset_create
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Workflow
from tests.factories import SETUP, example_definition

from .canned import loaded, scored, started
from .conftest import sample_cases

pytestmark = pytest.mark.django_db

THRESHOLDS = {"tiers": {"high": {"unauthorized_actions": {"max": 0}, "action_accuracy": {"min": 0.98}}}}


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def cases(dataset, editor):
    loaded(dataset, editor, sample_cases())
    return dataset


@pytest.fixture
def second_version(refund):
    version, _ = workflow_save(team=refund.team, definition={**example_definition("refund-proposal"),
                                                              "description": "A raised refund limit."}, actor=SETUP)
    return version


@pytest.fixture
def done(cases, editor) -> Evaluation:
    return scored(started(cases, editor, note="baseline"), bad={"never-arrived-01", "decline-01"},
                  unauthorized={"never-arrived-02"})


def test_the_list_shows_ones_teams_evaluations_with_progress_pass_rate_and_cost(done, cases, editor, elsewhere):
    page = signed_in(editor).get("/admin/evaluation/evaluation/").content.decode()
    assert f'/admin/evaluation/evaluation/{done.id}/change/">{done.id} · baseline</a>' in page
    assert "refund-proposal" in page and "v1" in page and "golden v2" in page and "30 / 30" in page and "90.0%" in page and "$0.06 / $5.00" in page
    page = signed_in(elsewhere).get("/admin/evaluation/evaluation/").content.decode()
    assert f"/admin/evaluation/evaluation/{done.id}/change/" not in page
    assert signed_in(elsewhere).get(f"/admin/evaluation/evaluation/{done.id}/change/").status_code == 404


def test_an_evaluations_page_shows_each_tiers_metrics_with_interval_bars_and_its_cases(done, reader):
    response = signed_in(reader).get(f"/admin/evaluation/evaluation/{done.id}/change/")
    text = response.content.decode()
    assert response.status_code == 200
    assert "Progress: 30 of 30 cases scored" in text and "passed 27" in text and "failed 3" in text
    assert 'http-equiv="refresh"' not in text  # it has ended
    table = text.split('class="tier-table"')[1].split("</table>")[0]
    heads = re.findall(r'class="tier-head">(?:<span[^>]*>)?(\w+)', table)
    assert heads == ["overall", "high", "medium", "low"]
    unauthorized = table.split('data-metric="unauthorized_actions"')[1].split("</tr>")[0]
    assert unauthorized.count("<svg class=\"ci-bar\"") == 4 and "n=10" in unauthorized
    action = table.split('data-metric="action:propose"')[1].split("</tr>")[0]
    assert "93.3%" in action  # overall: 28 of 30 chose the expected action
    assert "{&quot;" not in table and '{"' not in table  # a table, never a JSON dump
    assert text.count('class="case-row"') == 30
    failed = signed_in(reader).get(f"/admin/evaluation/evaluation/{done.id}/change/?outcome=failed").content.decode()
    rows = re.findall(r'<tr class="case-row"><td><code>([^<]+)</code>.*?</tr>', failed, re.S)
    assert rows == ["decline-01", "never-arrived-01", "never-arrived-02"]
    assert "approval routing, action accuracy, action (propose)" in failed and "unauthorized actions (1)" in failed
    high = signed_in(reader).get(f"/admin/evaluation/evaluation/{done.id}/change/?risk_tier=high").content.decode()
    assert high.count('class="case-row"') == 10
    assert 'id="cancel-form"' not in text  # it has ended, and a member may not


def test_a_running_evaluation_shows_its_progress_and_results_so_far(cases, editor, reader):
    evaluation = scored(started(cases, editor), leave=12, finish=False)
    text = signed_in(editor).get(f"/admin/evaluation/evaluation/{evaluation.id}/change/").content.decode()
    assert 'http-equiv="refresh" content="15"' in text
    assert "Progress: 18 of 30 cases scored" in text and "pending 12" in text
    assert "Results by risk tier so far" in text and 'data-metric="action:propose"' in text
    assert 'id="cancel-form"' in text
    assert 'id="cancel-form"' not in signed_in(reader).get(
        f"/admin/evaluation/evaluation/{evaluation.id}/change/").content.decode()


def test_cancelling_from_the_page_editors_yes_members_no(cases, editor, reader):
    evaluation = started(cases, editor)
    url = f"/admin/evaluation/evaluation/{evaluation.id}/cancel/"
    response = signed_in(reader).post(url, {"reason": "no"}, follow=True)
    assert "evaluation.run" in response.content.decode()
    assert Evaluation.objects.get(pk=evaluation.pk).state == "running"
    response = signed_in(editor).post(url, {"reason": "wrong dataset"}, follow=True)
    assert f"Evaluation {evaluation.id} cancelled." in response.content.decode()
    evaluation.refresh_from_db()
    assert (evaluation.state, evaluation.stop_reason) == ("cancelled", "wrong dataset")
    assert signed_in(editor).get(url).status_code == 405


def test_an_editor_evaluates_a_version_from_the_datasets_page(cases, editor, reader, second_version):
    page = signed_in(editor).get(f"/admin/evaluation/dataset/{cases.id}/change/").content.decode()
    form = page.split('id="evaluate-form"')[1].split("</form>")[0]
    assert '<option value="2" selected>v2 (published)</option>' in form and '<option value="1">v1</option>' in form
    assert '<option value="2" selected>v2 (30 cases)</option>' in form and "v1 (0 cases)" not in form
    assert 'id="evaluate-form"' not in signed_in(reader).get(
        f"/admin/evaluation/dataset/{cases.id}/change/").content.decode()

    url = f"/admin/evaluation/dataset/{cases.id}/evaluate/"
    response = signed_in(editor).post(url, {"version": "2", "dataset_version": "2", "budget_usd": "3",
                                            "concurrency": "4", "note": "the raised limit"})
    evaluation = Evaluation.objects.get()
    assert response.status_code == 302 and response.url == f"/admin/evaluation/evaluation/{evaluation.id}/change/"
    assert (evaluation.version.number, evaluation.dataset_version.number, str(evaluation.budget_usd)) == (
        2, 2, "3.000000")
    page = signed_in(editor).get(f"/admin/evaluation/dataset/{cases.id}/change/").content.decode()
    assert 'class="evaluation-row"' in page and "the raised limit" in page

    refused = signed_in(reader).post(url, {"version": "1", "dataset_version": "2", "budget_usd": "3",
                                           "concurrency": "4"})
    assert "evaluation.run" in refused.content.decode() and Evaluation.objects.count() == 1
    bad = signed_in(editor).post(url, {"version": "1", "dataset_version": "2", "budget_usd": "999999",
                                       "concurrency": "4"})
    assert "<code>budget_usd</code>" in bad.content.decode() and Evaluation.objects.count() == 1


def test_the_comparison_page_shows_tiers_side_by_side_and_the_cases_that_changed(
        cases, editor, reader, second_version):
    base = scored(started(cases, editor))
    new = scored(started(cases, editor, version=2), bad={"never-arrived-01"}, unauthorized={"never-arrived-02"})
    page = signed_in(reader).get(f"/admin/evaluation/evaluation/{new.id}/change/").content.decode()
    assert f'<option value="{base.id}">evaluation {base.id}: v1, completed' in page
    response = signed_in(reader).get(f"/admin/evaluation/evaluation/compare/?new={new.id}&base={base.id}")
    text = response.content.decode()
    assert response.status_code == 200
    changed = re.findall(r'<tr class="changed-row (\w+)"><td><code>([^<]+)</code>.*?<td>([^<]+)</td><td>([^<]+)</td>'
                         r'<td>([^<]+)</td>', text, re.S)
    assert ("worse", "never-arrived-02", "unauthorized actions", "0.00", "1.00") in changed
    assert ("worse", "never-arrived-01", "action (propose)", "pass", "fail") in changed
    high = text.split('data-tier="high"')[1].split("</table>")[0]
    row = high.split('data-metric="unauthorized_actions"')[1].split("</tr>")[0]
    assert 'class="delta worse">+0.10' in row and row.count('class="ci base"') == 3 and row.count('class="ci new"') == 3
    low = text.split('data-tier="low"')[1].split("</table>")[0]
    assert 'class="delta same">+0.0 pts' in low.split('data-metric="action:propose"')[1].split("</tr>")[0]
    default = signed_in(reader).get(f"/admin/evaluation/evaluation/compare/?new={new.id}").content.decode()
    assert 'class="changed-row' in default  # the latest other evaluation is taken when none is picked


def test_comparing_another_dataset_version_or_teams_evaluation_is_refused(cases, editor, elsewhere):
    first = started(cases, editor)
    loaded(cases, editor, [{**sample_cases()[0], "key": "extra-01"}])
    other = started(cases, editor)
    text = signed_in(editor).get(f"/admin/evaluation/evaluation/compare/?new={other.id}&base={first.id}").content.decode()
    assert "<code>base</code>" in text and "same dataset version" in text and 'class="changed-row' not in text
    assert signed_in(elsewhere).get(f"/admin/evaluation/evaluation/compare/?new={other.id}").status_code == 404


def test_an_evaluations_page_shows_what_the_release_gate_finds(done, owner):
    page = signed_in(owner).get(f"/admin/evaluation/evaluation/{done.id}/change/").content.decode()
    assert 'id="release-gate"' not in page  # no policy: no gate
    ReleasePolicy.objects.create(workflow=done.workflow, dataset=done.dataset_version.dataset, thresholds=THRESHOLDS)
    page = signed_in(owner).get(f"/admin/evaluation/evaluation/{done.id}/change/").content.decode()
    gate = page.split('id="release-gate"')[1].split("</div>")[0]
    assert "<code>release_gate.high.unauthorized_actions</code>: high: unauthorized_actions is 0.1, above the " \
        "maximum 0" in gate
    assert "<code>release_gate.high.action_accuracy</code>" in gate  # 8 of 10 chose the expected action


def test_an_owner_sets_the_release_policy_and_the_workflows_page_shows_it(cases, owner, editor, refund):
    url = f"/admin/evaluation/releasepolicy/workflow/{refund.id}/"
    page = signed_in(owner).get(f"/admin/orchestrator/workflow/{refund.id}/change/").content.decode()
    assert 'id="release-policy"' in page and "No release policy" in page and "Set a release policy" in page

    bad = signed_in(owner).post(url, {"dataset": cases.id, "thresholds": '"high"'})
    assert bad.status_code == 400 and "<code>thresholds</code>" in bad.content.decode()
    unknown = signed_in(owner).post(url, {"dataset": cases.id, "thresholds": json.dumps(
        {"tiers": {"high": {"action": {"min": 0.9}}}})})
    assert unknown.status_code == 400 and "<code>thresholds.tiers.high.action</code>" in unknown.content.decode()
    unreadable = signed_in(owner).post(url, {"dataset": cases.id, "thresholds": "{oops"})
    assert unreadable.status_code == 400 and "not JSON" in unreadable.content.decode()
    assert not ReleasePolicy.objects.exists()

    response = signed_in(owner).post(url, {"dataset": cases.id, "thresholds": json.dumps(THRESHOLDS)})
    assert response.status_code == 302
    policy = ReleasePolicy.objects.get()
    assert (policy.dataset, policy.thresholds, policy.updated_by) == (cases, THRESHOLDS, owner)

    page = signed_in(editor).get(f"/admin/orchestrator/workflow/{refund.id}/change/").content.decode()
    panel = page.split('id="release-policy"')[1]
    assert "unauthorized actions" in panel and "≤ 0" in panel and "≥ 0.98 (98%)" in panel
    assert "Version 1 (published)" in panel and "held back" in panel and "has no completed evaluation" in panel
    assert "Change the release policy" not in panel and "The release policy" in panel

    form = signed_in(owner).get(url).content.decode()
    assert 'id="policy-form"' in form and "&quot;unauthorized_actions&quot;" in form
    assert 'id="policy-form"' not in signed_in(editor).get(url).content.decode()
    refused = signed_in(editor).post(url, {"dataset": "", "thresholds": ""})
    assert refused.status_code == 403 and ReleasePolicy.objects.exists()
    removed = signed_in(owner).post(url, {"dataset": "", "thresholds": ""})
    assert removed.status_code == 302 and not ReleasePolicy.objects.exists()


def test_another_teams_release_policy_page_is_not_found(refund, elsewhere, owner):
    assert signed_in(elsewhere).get(f"/admin/evaluation/releasepolicy/workflow/{refund.id}/").status_code == 404
    theirs = Workflow.objects.get(team__slug="elsewhere")
    dataset_create(workflow=theirs, name="theirs", actor=SETUP)
    assert signed_in(owner).get(f"/admin/evaluation/releasepolicy/workflow/{theirs.id}/").status_code == 404


def test_a_shadows_page_says_whose_live_runs_it_follows(refund, editor, second_version):
    from evaluation.evaluations import shadow_start
    from orchestrator.engine.services.workflows import workflow_publish

    workflow_publish(workflow_id=refund.id, number=1, actor=SETUP)
    shadow = shadow_start(workflow=refund, version=2, actor=editor, budget_usd="1")
    page = signed_in(editor).get(f"/admin/evaluation/evaluation/{shadow.id}/change/").content.decode()
    assert "shadow of v1&#x27;s live runs" in page and "A shadow is compared case by case" in page
    listed = signed_in(editor).get("/admin/evaluation/evaluation/").content.decode()
    assert "shadow of v1&#x27;s live runs" in listed
    assert signed_in(editor).get(f"/admin/evaluation/evaluation/compare/?new={shadow.id}").status_code == 200
