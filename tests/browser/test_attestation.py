"""The run page marks each completed step's output as signed by who produced it, and flags one
whose attestation fails (docs/audit.md#attestation); steps run by the real workers."""
import pytest

from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import StepRun
from tests.factories import SETUP

from .conftest import wait_for_run
from .test_live import operator_with_password, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]

CHAIN = {"name": "attested-page", "input_schema": {"type": "object"}, "steps": [
    {"name": "lookup", "type": "tool", "tool": "core.echo", "params": {"plan": "gold"}},
    {"name": "reply", "type": "tool", "tool": "core.echo", "after": ["lookup"],
     "params": {"plan": "{{ steps.lookup.output.plan }}"}}]}


def test_the_run_page_says_who_signed_each_output_and_flags_one_edited_in_the_database(
        browser_page, workers, web_server, team, screenshot):
    operator_with_password(team)
    version, _ = workflow_save(team=team, definition=CHAIN, actor=SETUP)
    run = wait_for_run(run_start(version=version, input={}, actor=SETUP).id,
                       states=("completed", "failed"))
    assert run.state == "completed"
    StepRun.objects.filter(run=run, name="lookup").update(output={"plan": "platinum"})
    page = browser_page
    sign_in(page, web_server, "ops_olga", "operate-pass-1")

    page.goto(f"{web_server}/admin/orchestrator/run/{run.id}/live/")
    flagged = page.wait_for_selector("#attestation-lookup")
    signed = page.wait_for_selector("#attestation-reply")

    assert flagged.inner_text() == "attestation failed"
    assert "does not match its attestation" in flagged.get_attribute("title")
    assert signed.inner_text() == "signed"
    assert signed.get_attribute("title").startswith("Produced by worker:")
    screenshot(page, "attestation-failed")
