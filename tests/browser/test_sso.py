"""A reviewer signs in through the OpenID Connect provider in a real browser: the login page
offers the provider beside the local form, the provider asks for the password and the consent,
and the reviewer lands in the support team and the approver group the mapping names, then
decides the support e-mail's approval; real workers finish the run."""
import json

import pytest
from django.contrib.auth.models import User

from audit.models import AuditEntry
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Role, TeamMembership
from tests.factories import SETUP, example_definition, member
from tests.support.oidc import Provider

from .conftest import Server, wait_for_run

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]

TICKET = {"ticket_id": "T-2001", "customer_email": "kim@example.com",
          "body": "Hello, my invoice INV-3100 was charged twice. Could you refund one? Kim"}
MAPPING = {"idp-support-reviewers": {"team": "support", "role": "member",
                                     "groups": ["support_leads"]}}


@pytest.fixture
def provider(tmp_path):
    started = Provider(tmp_path)
    started.start()
    yield started
    started.stop()


@pytest.fixture
def sso_web_server(django_db_setup, provider):
    """A web process signing in through `provider`, creating accounts at first sign-in."""
    server = Server("sso-web")
    server.env.update(provider.env_for_stepwise(), STEPWISE_OIDC_PROVIDER_NAME="Example IdP",
                      STEPWISE_OIDC_GROUPS=json.dumps(MAPPING), STEPWISE_OIDC_CREATE_USERS="1")
    provider.allow_redirect(f"{server.url}/sso/callback/")
    server.start()
    yield server.url
    server.stop()


def test_a_reviewer_signs_in_through_the_provider_and_approves(
        browser_page, screenshot, workers, sso_web_server, provider, team):
    web = sso_web_server
    starter = member(team, "agent_smith", role=Role.EDITOR)
    support, _ = workflow_save(team=team, definition=example_definition("support"), actor=SETUP)
    run = run_start(version=support, input=TICKET, actor=starter)
    provider.person("rita", "idp-pass-1", groups=["idp-support-reviewers", "idp-all-staff"])
    wait_for_run(run.id, states=("waiting",), timeout=60)
    page = browser_page

    page.goto(f"{web}/admin/login/?next=/admin/")
    assert page.is_visible("#login-form")  # local accounts still sign in here
    screenshot(page, "sso-login")
    page.click("text=Sign in with Example IdP")
    page.wait_for_url(f"{provider.url}/accounts/login/**")
    page.fill("#id_username", "rita")
    page.fill("#id_password", "idp-pass-1")
    screenshot(page, "sso-provider-login")
    page.click("#sign-in")
    page.wait_for_selector("#authorizationForm")
    assert "The groups you are in" in page.inner_text("#authorizationForm")
    screenshot(page, "sso-provider-consent")
    page.click("input[name=allow]")
    page.wait_for_url(f"{web}/admin/")

    rita = User.objects.get(username="rita")
    assert TeamMembership.objects.get(user=rita, team=team).role == Role.MEMBER
    assert list(rita.groups.values_list("name", flat=True)) == ["support_leads"]
    assert AuditEntry.objects.filter(action="sso.access_changed", subject_id="rita",
                                     outcome="created").exists()
    assert page.inner_text(".waiting-count") == "1"

    page.click(".waiting-module a")  # the inbox
    page.wait_for_selector("#result_list")
    page.click("text=email.send to kim@example.com: Re: ticket T-2001")
    page.wait_for_selector("#decision-form")
    page.click("button.approve-button")
    page.wait_for_selector(".messagelist")
    assert "Approved: email.send to kim@example.com" in page.inner_text(".messagelist")

    finished = wait_for_run(run.id, states=("completed", "failed"), timeout=60)
    assert finished.state == "completed", finished.error
    assert finished.steps.get(name="approve").output["approved_by"] == ["rita"]
