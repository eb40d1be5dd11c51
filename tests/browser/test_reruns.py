"""A bulk re-run in a real browser: an operator selects a workflow's runs on the run list, asks
"Re-run selected runs…", picks the fixed version on the confirmation page and follows the batch's
progress page, which reads itself again until every source run was started again or refused. The
screenshot in docs/operations.md (docs/rerun-progress.png) is taken here."""
import pytest

from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Rerun, Role, Run
from tests.factories import SETUP, member
from tests.support.reruns import echo_definition

from .conftest import wait_for_run

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_an_operator_reruns_failed_runs_on_the_fixed_version_and_follows_the_batch(
        browser_page, screenshot, workers, web_server, team):
    operator = member(team, "ops_olga", role=Role.OPERATOR, staff=True)
    operator.set_password("operate-pass-1")
    operator.save()
    broken, _ = workflow_save(team=team, definition=echo_definition(fixed=False), actor=SETUP)
    holding = echo_definition(fixed=True)
    holding["steps"].append({"name": "hold", "type": "wait", "signal": "go", "after": ["echo"],
                             "timeout_s": 600})
    waiting, _ = workflow_save(team=team, definition=holding, actor=SETUP)
    fixed, _ = workflow_save(team=team, definition=echo_definition(fixed=True), actor=SETUP)
    failed = [run_start(version=broken, input={"ticket": f"T-{i}"}, actor=SETUP) for i in range(4)]
    still_waiting = run_start(version=waiting, input={"ticket": "T-held"}, actor=SETUP)
    for run in failed:
        assert wait_for_run(run.id, states=("failed",), timeout=60).state == "failed"
    wait_for_run(still_waiting.id, states=("waiting",), timeout=60)
    page = browser_page

    page.goto(f"{web_server}/admin/login/?next=/admin/orchestrator/run/")
    page.fill("#id_username", "ops_olga")
    page.fill("#id_password", "operate-pass-1")
    page.click("input[type=submit]")
    page.wait_for_selector("#result_list")
    assert page.locator("#rerun-matching").inner_text() == "Re-run all runs in this view…"
    page.check("#action-toggle")
    page.select_option("select[name=action]", "rerun_runs")
    page.click("button[name=index]")

    page.wait_for_selector("#rerun-form")
    assert page.locator("h1").inner_text() == "Re-run 5 runs of triage"
    assert page.locator("#id_version option:checked").inner_text().startswith("v3 (published)")
    page.click("#confirm-rerun")

    page.wait_for_selector("#rerun-progress[data-state=done]", timeout=90000)
    rerun = Rerun.objects.get()
    assert page.url == f"{web_server}/admin/orchestrator/run/reruns/{rerun.id}/"
    assert (page.inner_text("#rerun-started"), page.inner_text("#rerun-refused"),
            page.inner_text("#rerun-pending")) == ("4", "1", "0")
    assert page.locator("#rerun-items tr.rerun-started .new-run").count() == 4
    assert page.locator("#rerun-items tr.rerun-refused .rerun-reason").inner_text().startswith(
        "still waiting: re-run it once it has ended")
    for run in Run.objects.filter(trigger="rerun"):
        assert run.version_id == fixed.id
        assert wait_for_run(run.id, states=("completed",), timeout=60).state == "completed"
    page.reload()
    page.wait_for_selector("#rerun-progress[data-state=done]")
    screenshot(page, "rerun-progress")
