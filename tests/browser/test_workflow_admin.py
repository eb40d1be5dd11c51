"""An editor tries to publish, in the admin, a draft that drops a mandatory gate: refused with
the paths; the workflow page shows which version runs. A run's secret input is a marker there."""
import pytest

from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Role, Workflow
from tests.engine.test_mandatory_gates import GATED, without_gate
from tests.factories import SETUP, member

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]

SECRET = {**GATED, "name": "notify-secret", "input_schema": {
    "type": "object", "properties": {"access_code": {"type": "string", "writeOnly": True}}}}


def test_an_editor_cannot_publish_a_draft_without_the_mandatory_gate(browser_page, screenshot,
                                                                    web_server, team):
    editor = member(team, "editor", role=Role.EDITOR, staff=True)
    editor.set_password("editor-pass-1")
    editor.save()
    workflow_save(team=team, definition=GATED, actor=SETUP)
    Workflow.objects.filter(team=team, name=GATED["name"]).update(publish_on_save=False)
    draft, _ = workflow_save(team=team, definition=without_gate(), actor=editor)
    secret_version, _ = workflow_save(team=team, definition=SECRET, actor=SETUP)
    run = run_start(version=secret_version, input={"access_code": "tok-visible-nowhere"}, actor=editor)
    page = browser_page

    page.goto(f"{web_server}/admin/login/?next=/admin/")
    page.fill("#id_username", "editor")
    page.fill("#id_password", "editor-pass-1")
    page.click("input[type=submit]")
    page.wait_for_url(f"{web_server}/admin/")
    page.evaluate("localStorage.setItem('django.admin.navSidebarIsOpen', 'false')")

    page.goto(f"{web_server}/admin/orchestrator/workflowversion/")
    page.check(f"#result_list input[value='{draft.id}']")
    page.select_option("select[name=action]", "publish")
    page.click("button[name=index]")
    page.wait_for_selector(".messagelist")
    message = page.inner_text(".messagelist")
    assert "drops or weakens a mandatory gate" in message
    assert "steps: mandatory gate 'approve' was removed (or renamed)" in message
    screenshot(page, "admin-publish-refused")

    page.goto(f"{web_server}/admin/orchestrator/workflow/")
    rows = page.inner_text("#result_list")
    assert "notify" in rows
    screenshot(page, "admin-workflows-published")
    assert Workflow.objects.get(team=team, name="notify").active_version.number == 1

    page.goto(f"{web_server}/admin/orchestrator/run/{run.id}/change/")
    content = page.inner_text("#content")
    assert "input.access_code" in content and "tok-visible-nowhere" not in content
