"""The run page's Fork dialog in a real browser, against a real server and real workers: a
refused fork lists its problems by path and starts nothing; a fork started from the dialog
opens the new run's page, which links to its source, and the source's page links to it.
The docs' screenshot of the dialog (docs/fork-dialog.png) is taken here."""
import pytest

from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Event, Role, Run, StepRun
from tests.factories import SETUP, member

from .conftest import wait_for_run
from .test_live import sign_in

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]

REPORT = {
    "name": "weekly-report",
    "description": "Research a topic, draft a report, publish it.",
    "input_schema": {"type": "object", "required": ["topic"],
                     "properties": {"topic": {"type": "string", "minLength": 1}}},
    "steps": [
        {"name": "research", "type": "tool", "tool": "core.echo", "params": {"notes": "{{ input.topic }}"}},
        {"name": "draft", "type": "tool", "tool": "core.echo", "after": ["research"],
         "params": {"text": "About {{ steps.research.output.notes }}"}},
        {"name": "publish", "type": "tool", "tool": "core.echo", "after": ["draft"],
         "side_effect": True, "params": {"published": "{{ steps.draft.output.text }}"}},
    ],
}


def test_forking_a_run_from_its_page(browser_page, screenshot, workers, web_server, team):
    operator = member(team, "ops_olga", role=Role.OPERATOR, staff=True)
    operator.set_password("operate-pass-1")
    operator.save()
    version, _ = workflow_save(team=team, definition=REPORT, actor=SETUP)
    source = wait_for_run(run_start(version=version, input={"topic": "refunds"}, actor=operator).id,
                          states=("completed", "failed"), timeout=60)
    assert source.state == "completed", source.error
    page = browser_page
    sign_in(page, web_server, "ops_olga", "operate-pass-1")
    page.goto(f"{web_server}/admin/orchestrator/run/{source.id}/live/")

    page.click("#fork-open")
    page.select_option("#fork-step", "draft")
    page.fill("#fork-input", '{"topic": ""}')
    page.fill("#fork-step-input", '{"research": {"notes": "chargebacks"}}')
    page.check("input[name=repeat_effects][value=publish]")
    page.fill("#fork-reason", "the first report went to the wrong list")
    page.click("#fork-submit")
    page.wait_for_selector("#fork-errors:not([hidden])")
    assert "input.topic" in page.inner_text("#fork-errors")
    assert not Run.objects.filter(forked_from=source).exists()
    screenshot(page, "fork-dialog")

    page.fill("#fork-input", '{"topic": "refunds"}')
    page.click("#fork-submit")
    page.wait_for_url(lambda url: str(source.id) not in url and url.endswith("/live/"))
    fork = Run.objects.get(forked_from=source)
    assert str(fork.id) in page.url
    assert "draft" in page.inner_text("#fork-source")
    page.wait_for_function("document.querySelector('#run-state')?.dataset.state === 'completed'")
    draft = StepRun.objects.get(run=fork, name="draft")
    assert draft.output == {"text": "About chargebacks"}
    assert StepRun.objects.get(run=fork, name="research").output == {"notes": "refunds"}
    repeated = Event.objects.get(run=fork, kind="fork.effect_repeat")
    assert repeated.payload["reason"] == "the first report went to the wrong list"
    page.click("#fork-source a")
    page.wait_for_selector("#fork-forks")
    assert str(fork.id) in page.inner_text("#fork-forks")
