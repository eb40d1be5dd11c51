"""Moving runs to another version from the run list, in a real browser: an operator selects
three runs waiting at a gate, takes "Move to another version…", reads the dry run (a table per
run, the refused one with its reason), gives a reason and confirms; the compatible runs move.
The screenshot in docs/operations.md (docs/move-dry-run.png) is taken here."""
import pytest

from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Event, Role, Run
from tests.engine.test_moves import ANNOUNCE, RELEASE, variant
from tests.factories import SETUP, member

from .conftest import wait_for_run

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]

LONG_TITLES = {"type": "object", "required": ["title"],
               "properties": {"title": {"type": "string", "minLength": 5}}}


def test_an_operator_moves_runs_after_reading_the_dry_run(browser_page, screenshot, workers,
                                                          web_server, team):
    operator = member(team, "operator", role=Role.OPERATOR, staff=True)
    operator.set_password("operator-pass-1")
    operator.save()
    v1, _ = workflow_save(team=team, definition=RELEASE, actor=SETUP)
    runs = [run_start(version=v1, input={"title": title}, actor=operator)
            for title in ("Spring release", "Autumn release", "Fix")]
    for run in runs:
        assert wait_for_run(run.id, states=("waiting", "failed")).state == "waiting"
    v2, _ = workflow_save(team=team, definition=variant(add=[ANNOUNCE], input_schema=LONG_TITLES),
                          actor=SETUP)
    page = browser_page

    page.goto(f"{web_server}/admin/login/?next=/admin/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", "operator-pass-1")
    page.click("input[type=submit]")
    page.wait_for_url(f"{web_server}/admin/")
    page.evaluate("localStorage.setItem('django.admin.navSidebarIsOpen', 'false')")

    page.goto(f"{web_server}/admin/orchestrator/run/")
    for run in runs:
        page.check(f"#result_list input[value='{run.id}']")
    page.select_option("select[name=action]", "move_runs")
    page.click("button[name=index]")
    page.select_option("#id_version", str(v2.id))
    page.click("#move-dry-run")
    page.wait_for_selector("#move-summary")
    assert page.inner_text("#move-summary") == "2 of 3 runs can move."
    assert page.locator(".move-plan[data-movable=yes]").count() == 2
    refused = page.locator(f".move-plan[data-run='{runs[2].id}']")
    assert refused.get_attribute("data-movable") == "no"
    assert "input.title: the run's input fails version 2's input_schema: 'Fix' is too short" in \
        refused.locator(".move-refusals").inner_text()
    added = page.locator(f".move-plan[data-run='{runs[0].id}'] tr.move-step-added")
    assert added.inner_text().split("\t")[:2] == ["announce", "added"]
    screenshot(page, "move-dry-run")
    assert {r.version_id for r in Run.objects.all()} == {v1.id}  # a dry run changes nothing

    page.fill("#id_reason", "announce every release")
    page.click("#move-confirm")
    page.wait_for_selector(".messagelist")
    messages = page.inner_text(".messagelist")
    assert "Moved 2 run(s) to release v2." in messages
    assert f"Run {runs[2].id} was not moved: the run's input fails" in messages
    assert {r.id: r.version_id for r in Run.objects.all()} == {
        runs[0].id: v2.id, runs[1].id: v2.id, runs[2].id: v1.id}
    moved = Event.objects.get(run=runs[0], kind="run.moved")
    assert (moved.actor, moved.payload["reason"]) == ("user:operator", "announce every release")
