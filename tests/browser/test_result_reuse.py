"""The run page marks a step whose output was reused from an earlier run (docs/operations.md,
"Reusing results"), linking to the run it came from; steps run by the real workers."""
import pytest

from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from tests.factories import SETUP

from .conftest import wait_for_run
from .test_live import operator_with_password, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]

LOOKUP = {
    "name": "cached-lookup",
    "input_schema": {"type": "object", "required": ["customer"],
                     "properties": {"customer": {"type": "string"}}},
    "steps": [
        {"name": "lookup", "type": "tool", "tool": "core.echo",
         "params": {"customer": "{{ input.customer }}", "plan": "gold"},
         "cache": {"key": "{{ input.customer }}", "ttl_s": 3600}},
        {"name": "reply", "type": "tool", "tool": "core.echo", "after": ["lookup"],
         "params": {"plan": "{{ steps.lookup.output.plan }}"}},
    ],
}


def test_the_run_page_marks_a_reused_step_and_links_to_where_it_came_from(
        browser_page, workers, web_server, team, screenshot):
    operator_with_password(team)
    version, _ = workflow_save(team=team, definition=LOOKUP, actor=SETUP)
    first = wait_for_run(run_start(version=version, input={"customer": "c-1"}, actor=SETUP).id,
                         states=("completed", "failed"))
    second = wait_for_run(run_start(version=version, input={"customer": "c-1"}, actor=SETUP).id,
                          states=("completed", "failed"))
    assert (first.state, second.state) == ("completed", "completed")
    page = browser_page
    sign_in(page, web_server, "ops_olga", "operate-pass-1")

    page.goto(f"{web_server}/admin/orchestrator/run/{second.id}/live/")
    mark = page.wait_for_selector("#reused-lookup")

    assert mark.inner_text() == "reused"
    assert mark.get_attribute("href") == f"/admin/orchestrator/run/{first.id}/live/"
    assert f"of run {first.id}" in mark.get_attribute("title")
    assert page.query_selector("#reused-reply") is None  # it computed its own output
    screenshot(page, "reused-result")

    page.goto(f"{web_server}/admin/orchestrator/run/{first.id}/live/")
    page.wait_for_selector("#step-lookup")
    assert page.query_selector("#reused-lookup") is None
