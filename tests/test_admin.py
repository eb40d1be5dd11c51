import pytest
from django.contrib.auth.models import User

from approvals.models import ApprovalRequest
from orchestrator.models import Run, WorkflowVersion
from tests.api.driving import drive_to_gate, support_run


@pytest.fixture
def admin_user(db):
    return User.objects.create_superuser("root", "root@example.com", "pw")


@pytest.fixture
def staff(client, admin_user):
    client.force_login(admin_user)
    return client


@pytest.fixture
def gate(team, requester):
    return ApprovalRequest.objects.get(run=drive_to_gate(support_run(team, requester)))


@pytest.mark.django_db
def test_run_changelist_and_change_page_open(staff, gate):
    changelist = staff.get("/admin/orchestrator/run/?state__exact=waiting")
    change = staff.get(f"/admin/orchestrator/run/{gate.run_id}/change/")

    assert changelist.status_code == 200
    assert str(gate.run_id) in changelist.content.decode()
    assert change.status_code == 200
    assert "classify" in change.content.decode()  # the steps inline
    assert "step.completed" in change.content.decode()  # the events inline


@pytest.mark.django_db
def test_run_admin_allows_no_add_or_delete(staff, gate):
    assert staff.get("/admin/orchestrator/run/add/").status_code == 403
    assert staff.get(f"/admin/orchestrator/run/{gate.run_id}/delete/").status_code == 403


@pytest.mark.django_db
@pytest.mark.parametrize("url", [
    "/admin/orchestrator/workflow/", "/admin/orchestrator/workflowversion/",
    "/admin/orchestrator/steprun/", "/admin/orchestrator/event/", "/admin/orchestrator/team/",
    "/admin/orchestrator/workerheartbeat/", "/admin/approvals/approvalrequest/",
])
def test_changelists_open(staff, gate, url):
    assert staff.get(url).status_code == 200


@pytest.mark.django_db
def test_version_and_workflow_pages_show_the_definition(staff, gate):
    version = WorkflowVersion.objects.get()

    workflow_page = staff.get(f"/admin/orchestrator/workflow/{version.workflow_id}/change/")
    version_page = staff.get(f"/admin/orchestrator/workflowversion/{version.id}/change/")

    assert workflow_page.status_code == 200
    assert version_page.status_code == 200
    assert "support_leads" in version_page.content.decode()


@pytest.mark.django_db
def test_step_and_event_pages_open(staff, gate):
    step = Run.objects.get(pk=gate.run_id).steps.get(name="classify")
    event = step.event_set.first()

    assert staff.get(f"/admin/orchestrator/steprun/{step.id}/change/").status_code == 200
    assert staff.get(f"/admin/orchestrator/event/{event.id}/change/").status_code == 200


@pytest.mark.django_db
def test_approval_change_page_opens(staff, gate):
    response = staff.get(f"/admin/approvals/approvalrequest/{gate.id}/change/")

    assert response.status_code == 200
    assert gate.proposal_hash in response.content.decode()


@pytest.mark.django_db
def test_cancel_selected_runs_action_cancels_through_the_service(staff, gate):
    response = staff.post("/admin/orchestrator/run/", {
        "action": "cancel_runs", "_selected_action": [str(gate.run_id)],
    }, follow=True)

    assert response.status_code == 200
    assert Run.objects.get(pk=gate.run_id).state in ("cancelled", "cancelling")
    gate.refresh_from_db()
    assert gate.state == "cancelled"


def test_admin_pages_carry_stepwise_branding_links_and_stylesheet(staff, gate):
    page = staff.get("/admin/").content.decode()
    assert "Stepwise operations" in page
    assert "stepwise/admin.css" in page
    assert 'href="/admin/orchestrator/deadletter/"' in page and 'href="/api/v1/docs/"' in page


def test_states_are_shown_as_badges_that_set_what_needs_a_person_apart(staff, gate):
    runs = staff.get("/admin/orchestrator/run/").content.decode()
    approvals = staff.get("/admin/approvals/approvalrequest/").content.decode()
    assert '<span class="state-badge state-attention">waiting</span>' in runs
    assert '<span class="state-badge state-attention">pending</span>' in approvals


def test_the_admin_stylesheet_is_served(client):
    from django.contrib.staticfiles import finders

    assert finders.find("stepwise/admin.css")
