"""The admin cost page in a real browser: real workers run the examples (the support workflow to
its gate, a spam ticket to its end, a document digest's map, a warm lead), then an owner opens
Budgets > Costs and sees the day's spend charted and tabled per workflow and per model — the
same figures the API gives. The screenshot in docs/budgets.md is taken here."""
import pytest

from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Role
from tests.factories import SETUP, example_definition, member

from .conftest import wait_for_run

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]

SUPPORT = {"ticket_id": "T-1001", "customer_email": "sam@example.com",
           "body": "Hello, I was charged twice for my March invoice (INV-2291). Could you refund it?"}


def test_the_cost_page_shows_the_days_spend_by_workflow_and_model(browser_page, screenshot, workers,
                                                                   web_server, team):
    owner = member(team, "owner", role=Role.OWNER, staff=True)
    owner.set_password("owner-pass-1")
    owner.save()
    runs = []
    for name, run_input, until in [
        ("support", SUPPORT, "waiting"),
        ("support", {**SUPPORT, "ticket_id": "T-1002", "body": "WIN A PRIZE now"}, "completed"),
        ("document-digest", {"documents": [{"id": f"d{i}", "text": f"document number {i}"}
                                           for i in range(4)]}, "completed"),
        ("lead-routing", {"company": "ACME", "score": 0.6}, "completed"),
    ]:
        version, _ = workflow_save(team=team, definition=example_definition(name), actor=SETUP)
        run = run_start(version=version, input=run_input, actor=SETUP)
        runs.append(wait_for_run(run.id, states=(until, "failed"), timeout=90))
    assert [r.state for r in runs] == ["waiting", "completed", "completed", "completed"]
    page = browser_page

    page.goto(f"{web_server}/admin/login/?next=/admin/budgets/costreport/")
    page.fill("#id_username", "owner")
    page.fill("#id_password", "owner-pass-1")
    page.click("input[type=submit]")
    page.wait_for_url(f"{web_server}/admin/budgets/costreport/")

    assert page.evaluate("Chart.getChart('cost-per-day').data.datasets[0].data.some(v => v > 0)")
    workflows = page.locator(".module", has_text="Per workflow").locator("tbody td:first-child").all_inner_texts()
    assert set(workflows) == {"support-reply", "document-digest", "lead-routing"}
    models = page.locator(".module", has_text="Per model").locator("tbody td:first-child").all_inner_texts()
    assert set(models) <= {"fast", "deep"} and models
    screenshot(page, "budgets-costs")
