"""What the run page and the operations page hand their scripts and the admin's frame, and the
retry warning's words (tests/live/test_pages.py reads their JSON state)."""
import pytest
from django.urls import reverse

from approvals.models import ApprovalRequest
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import StepRun
from orchestrator.web.live.views import retry_warning
from tests.factories import SETUP

from .conftest import GATED
from .test_pages import signed_in

pytestmark = pytest.mark.django_db


def test_the_run_page_names_the_run_and_hands_its_script_the_state_url_and_the_socket(client, team, operator):
    version, _ = workflow_save(team=team, definition=GATED, actor=SETUP)
    run = run_start(version=version, input={}, actor=operator)

    page = signed_in(client, operator).get(reverse("admin:orchestrator_run_live", args=[run.id])).content.decode()

    assert f"<title>gated v{version.number} | Run {run.id} | Stepwise</title>" in page
    assert f"<h1>Run {run.id}</h1>" in page and f"<h2>gated v{version.number}</h2>" in page
    assert f"&rsaquo; gated {run.id}" in page  # the breadcrumb
    state_url = reverse("admin:orchestrator_run_state", args=[run.id])
    assert f'data-state-url="{state_url}" data-socket-path="/ws/runs/{run.id}/"' in page
    assert f'<span id="run-state" class="state-badge">{run.state}</span>' in page
    assert f'<a href="{reverse("admin:orchestrator_run_change", args=[run.id])}">Input, output and events</a>' in page
    assert f'<a href="{reverse("admin:audit_run_timeline", args=[run.id])}">Audit timeline</a>' in page
    assert "<strong>operator</strong>" in page  # rendered with the request: the person's own frame
    assert 'name="csrfmiddlewaretoken"' in page  # its logout form


def test_the_operations_page_hands_its_script_the_state_url_and_the_run_list_socket(client, operator):
    response = signed_in(client, operator).get(reverse("admin:orchestrator_operations"))

    page = response.content.decode()
    assert response.status_code == 200
    assert "<title>Operations | Stepwise</title>" in page and "<h1>Operations</h1>" in page
    state_url = reverse("admin:orchestrator_operations_state")
    assert f'data-state-url="{state_url}" data-socket-path="/ws/runs/"' in page
    assert "<strong>operator</strong>" in page and 'name="csrfmiddlewaretoken"' in page


def test_the_retry_warning_names_the_error_class_and_its_message_cut_at_300_characters():
    long = "x" * 300
    assert retry_warning(StepRun(error={"class": "permanent", "message": long + "y"})) == (
        f"This step failed with a permanent error ({long}), which is never retried automatically: "
        "run again unchanged it will most likely fail the same way. Retry once its cause is fixed "
        "(the data, a credential, a policy, the service it calls); otherwise skip the step or "
        "cancel the run.")


def test_the_retry_warning_of_an_error_without_a_message_names_only_its_class():
    for error in ({"class": "policy"}, {"class": "policy", "message": ""}, {"class": "policy", "message": None}):
        assert retry_warning(StepRun(error=error)).startswith(
            "This step failed with a policy error, which is never retried automatically"), error
    assert retry_warning(StepRun(error=None)) == ""


def test_the_run_state_links_each_step_and_each_approval_to_its_admin_page(client, team, operator):
    version, _ = workflow_save(team=team, definition=GATED, actor=SETUP)
    run = run_start(version=version, input={}, actor=operator)
    approval = ApprovalRequest.objects.get(run=run)

    state = signed_in(client, operator).get(reverse("admin:orchestrator_run_state", args=[run.id])).json()

    assert {step["name"]: step["url"] for step in state["steps"]} == {
        step.name: reverse("admin:orchestrator_steprun_change", args=[step.id]) for step in run.steps.all()}
    assert [a["url"] for a in state["approvals"]] == [
        reverse("admin:approvals_approvalrequest_change", args=[approval.id])]
