"""The reviewer on a phone (390 px wide): the inbox fits the screen without sideways scrolling,
and on the decision page Approve and Reject come right after the action, not two screens down.
The gate is reached in-process through the worker's own code path (`tests.approvals.conftest`);
the browser talks to the real web server."""
import pytest

from orchestrator.models import Role
from tests.approvals.conftest import support_gate
from tests.factories import member

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]

PHONE = {"width": 390, "height": 844}


@pytest.fixture
def phone_page(browser):
    context = browser.new_context(viewport=PHONE, locale="en-US", color_scheme="light",
                                  device_scale_factor=1, is_mobile=True, has_touch=True)
    page = context.new_page()
    page.set_default_timeout(30_000)
    yield page
    context.close()


def sign_in(page, web_server, username, password):
    page.goto(f"{web_server}/admin/login/?next=/admin/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("input[type=submit]")
    page.wait_for_url(f"{web_server}/admin/")


def overflow(page) -> int:
    """How far the page, or any box on it that scrolls sideways (the changelist's table sits in
    one), reaches past what is shown."""
    return page.evaluate("""() => Math.max(
        document.documentElement.scrollWidth - window.innerWidth,
        ...[...document.querySelectorAll('#content *')].map(
            el => ['auto', 'scroll'].includes(getComputedStyle(el).overflowX)
                  ? el.scrollWidth - el.clientWidth : 0))""")


def test_a_reviewer_decides_on_a_phone_without_scrolling_sideways(phone_page, screenshot,
                                                                  web_server, team, requester):
    lead = member(team, "lead", role=Role.MEMBER, groups=("support_leads",))
    lead.set_password("lead-pass-1")
    lead.save()
    approval = support_gate(team, requester)
    page = phone_page

    sign_in(page, web_server, "lead", "lead-pass-1")
    assert overflow(page) <= 0
    screenshot(page, "reviewer-home-390")
    page.click(".waiting-module a")
    page.wait_for_selector("#result_list")
    assert overflow(page) <= 0, "the inbox scrolls sideways"
    assert page.is_visible("text=email.send to dana@example.com")
    screenshot(page, "approvals-inbox-390")

    page.click("text=email.send to dana@example.com")
    page.wait_for_selector("#decision-form")
    assert overflow(page) <= 0, "the decision page scrolls sideways"
    approve = page.locator("button.approve-button").bounding_box()
    preview = page.locator(".message-preview").bounding_box()
    run_input = page.locator("h2", has_text="The run's input").bounding_box()
    assert preview["y"] < approve["y"] < run_input["y"]  # after the action, before the rest
    assert approve["y"] + approve["height"] < 2 * PHONE["height"]
    screenshot(page, "approvals-decision-390")

    page.fill("#id_note", "Fine as it is.")
    page.click("button.approve-button")
    page.wait_for_selector(".messagelist")
    assert "Approved: email.send to dana@example.com" in page.inner_text(".messagelist")
    assert approval.run_id
