"""The retention policy page in a real browser: an owner signs in to the admin, asks for runs to
be kept longer than the deployment allows and is told its limit, then sets 90 days, which the
ledger records. The screenshots in docs/operations.md#retention are taken here."""
import pytest

from audit.models import AuditEntry
from orchestrator.models import Role
from retention.models import RetentionPolicy
from tests.factories import member

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_an_owner_sets_a_policy_in_the_admin_and_is_told_the_deployments_limit(
        browser_page, screenshot, fresh_web_server, team):
    owner = member(team, "owner", role=Role.OWNER, staff=True)
    owner.set_password("owner-pass-1")
    owner.save()
    page = browser_page
    page.goto(f"{fresh_web_server}/admin/login/?next=/admin/retention/retentionpolicy/add/")
    page.fill("#id_username", "owner")
    page.fill("#id_password", "owner-pass-1")
    page.click("input[type=submit]")
    page.wait_for_url(f"{fresh_web_server}/admin/retention/retentionpolicy/add/")

    page.select_option("#id_team", label=team.slug)
    page.select_option("#id_kind", "runs")
    page.fill("#id_days", "5000")
    page.click("input[name=_save]")
    assert "above this deployment's maximum for runs: 3650 days" in page.locator(".errorlist").inner_text()
    assert not RetentionPolicy.objects.exists()
    screenshot(page, "retention-policy-refused")

    page.fill("#id_days", "90")
    page.click("input[name=_save]")
    page.wait_for_url(f"{fresh_web_server}/admin/retention/retentionpolicy/")
    assert RetentionPolicy.objects.get(team=team, kind="runs").days == 90
    assert page.locator("#result_list").inner_text().count("1–3650 days") == 1
    assert AuditEntry.objects.filter(action="retention.policy_set", actor="user:owner").exists()
    screenshot(page, "retention-policies")
