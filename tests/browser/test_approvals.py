"""A reviewer approves in a real browser: signs in (not staff), opens the inbox, reads the
e-mail the support example will send, approves with a note; real workers finish the run and the
e-mail carries the note."""
import json

import pytest
from django.contrib.auth.models import Group

from examples.tools import outbox_path
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Role
from tests.factories import SETUP, example_definition, member

from .conftest import wait_for, wait_for_run

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]

TICKET = {"ticket_id": "T-1001", "customer_email": "sam@example.com",
          "body": "Hello, I was charged twice for my March invoice (INV-2291). "
                  "Could you refund the duplicate charge? Thanks, Sam"}
NOTE = "I have refunded the duplicate charge; it shows on your card within 3 days."


def emails_of(run_id) -> list[dict]:
    path = outbox_path()
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [row for row in rows if row["idempotency_key"].startswith(f"{run_id}:")]


def test_a_reviewer_approves_the_support_email_with_a_note(browser_page, screenshot, workers, web_server, team):
    starter = member(team, "agent_smith", role=Role.EDITOR)
    reviewer = member(team, "reviewer", role=Role.MEMBER, groups=("support_leads",))
    reviewer.set_password("review-pass-1")
    reviewer.save()
    Group.objects.get_or_create(name="support_managers")
    support, _ = workflow_save(team=team, definition=example_definition("support"), actor=SETUP)
    refunds, _ = workflow_save(team=team, definition=example_definition("refund-proposal"), actor=SETUP)
    run = run_start(version=support, input=TICKET, actor=starter)
    other = run_start(version=refunds, input={"order_id": "ORD-1002",
                                              "message": "My order never arrived."}, actor=starter)
    wait_for_run(run.id, states=("waiting",), timeout=60)
    wait_for_run(other.id, states=("waiting",), timeout=60)
    page = browser_page

    page.goto(f"{web_server}/admin/login/?next=/admin/")
    page.fill("#id_username", "reviewer")
    page.fill("#id_password", "review-pass-1")
    page.click("input[type=submit]")
    page.wait_for_url(f"{web_server}/admin/")
    assert page.inner_text(".waiting-count") == "2"
    assert "2 pending approval requests" in page.inner_text(".waiting-module")

    # Django's navigation sidebar closed (it remembers this in localStorage): more room.
    page.evaluate("localStorage.setItem('django.admin.navSidebarIsOpen', 'false')")
    page.click(".waiting-module a")  # the inbox
    page.wait_for_selector("#result_list")
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 2
    assert "email.send to sam@example.com: Re: ticket T-1001" in page.inner_text("#result_list")
    assert "refund order_id=ORD-1002, amount_usd=1200.0" in page.inner_text("#result_list")
    screenshot(page, "approvals-inbox")

    page.click("text=refund order_id=ORD-1002")  # a typed proposal: evidence, rationale, risk
    page.wait_for_selector("#decision-form")
    assert "The order was not delivered; a full refund is due." in page.inner_text("#content")
    assert page.is_visible("#id_confirm")  # high risk: approving asks for a confirmation
    screenshot(page, "approvals-proposal")
    page.go_back()
    page.wait_for_selector("#result_list")

    page.click("text=email.send to sam@example.com: Re: ticket T-1001")
    page.wait_for_selector("#decision-form")
    text = page.inner_text("#content")
    assert "charged twice for my March invoice" in text  # the customer's message
    assert "sam@example.com" in page.inner_text(".message-preview")  # the e-mail to be sent
    assert "Known issue; the policy allows a fix or a refund" in page.inner_text(".message-preview")
    shown_hash = page.inner_text("#proposal-hash")
    assert page.input_value("input[name=proposal_hash]") == shown_hash
    page.fill("#id_note", NOTE)
    screenshot(page, "approvals-decision")

    page.click("button.approve-button")
    page.wait_for_selector(".messagelist")
    assert "Approved: email.send to sam@example.com" in page.inner_text(".messagelist")

    finished = wait_for_run(run.id, states=("completed", "failed"), timeout=60)
    assert finished.state == "completed", finished.error
    [email] = wait_for(lambda: emails_of(run.id), timeout=10)
    assert email["to"] == "sam@example.com"
    assert email["body"].endswith(f"P.S. {NOTE}")
    assert finished.steps.get(name="approve").output["proposal_hash"] == shown_hash
