import pytest

from approvals.models import ApprovalRequest
from orchestrator.models import Run, StepState

from .driving import drive_to_gate, support_run


@pytest.fixture
def gate(team, requester):
    """A support run whose approval gate is waiting, with its pending request."""
    run = drive_to_gate(support_run(team, requester))
    return ApprovalRequest.objects.get(run=run)


@pytest.mark.django_db
def test_pending_approvals_are_listed_for_the_team(approver_api, gate):
    response = approver_api.get("/api/v1/approvals/?state=pending")

    assert response.status_code == 200
    [approval] = response.json()["results"]
    assert (approval["id"], approval["step"], approval["approvers"]) == (
        gate.id, "approve", "support_leads")
    assert approval["run"] == str(gate.run_id)
    assert "Your refund is on its way." in approval["instructions"]
    assert approval["context"]["draft"]["output"]["subject"] == "Re: ticket T-1"
    assert approval["proposal_hash"] == gate.proposal_hash
    assert approver_api.get("/api/v1/approvals/?state=approved").json()["results"] == []


@pytest.mark.django_db
def test_approving_completes_the_gate_with_the_note_and_queues_send(approver_api, gate):
    response = approver_api.post(f"/api/v1/approvals/{gate.id}/approve/",
                                 {"note": "ship it", "proposal_hash": gate.proposal_hash},
                                 format="json")

    assert response.status_code == 200, response.json()
    assert (response.json()["state"], response.json()["decided_by"],
            response.json()["note"]) == ("approved", "approver", "ship it")
    steps = {s.name: s for s in Run.objects.get(pk=gate.run_id).steps.all()}
    assert steps["approve"].state == StepState.COMPLETED
    assert steps["approve"].output["note"] == "ship it"
    assert steps["send"].state == StepState.QUEUED


@pytest.mark.django_db
def test_deciding_twice_is_a_409(approver_api, gate):
    bound = {"proposal_hash": gate.proposal_hash}
    approver_api.post(f"/api/v1/approvals/{gate.id}/approve/", bound, format="json")

    response = approver_api.post(f"/api/v1/approvals/{gate.id}/reject/",
                                 {**bound, "note": "changed my mind"}, format="json")

    assert response.status_code == 409
    assert "already approved" in response.json()["errors"][0]["message"]


@pytest.mark.django_db
def test_rejecting_fails_the_gate_and_the_run(approver_api, gate):
    response = approver_api.post(f"/api/v1/approvals/{gate.id}/reject/",
                                 {"note": "wrong tone", "proposal_hash": gate.proposal_hash},
                                 format="json")

    assert response.status_code == 200
    assert response.json()["state"] == "rejected"
    run = Run.objects.get(pk=gate.run_id)
    assert run.state == "failed"
    assert run.steps.get(name="approve").error["class"] == "rejected"
    assert run.steps.get(name="send").state == StepState.CANCELLED


@pytest.mark.django_db
def test_team_member_outside_the_approvers_group_gets_403(api, gate):
    assert api.get(f"/api/v1/approvals/{gate.id}/").status_code == 200

    response = api.post(f"/api/v1/approvals/{gate.id}/approve/",
                        {"note": "me", "proposal_hash": gate.proposal_hash}, format="json")

    assert response.status_code == 403
    gate.refresh_from_db()
    assert gate.state == "pending"


@pytest.mark.django_db
def test_outsider_gets_404_and_an_empty_list(outsider_api, gate):
    assert outsider_api.get("/api/v1/approvals/").json()["results"] == []
    assert outsider_api.get(f"/api/v1/approvals/{gate.id}/").status_code == 404
    assert outsider_api.post(f"/api/v1/approvals/{gate.id}/approve/").status_code == 404


@pytest.mark.django_db
def test_run_detail_links_the_gate_to_its_approval(approver_api, gate):
    body = approver_api.get(f"/api/v1/runs/{gate.run_id}/").json()

    [step] = [s for s in body["steps"] if s["name"] == "approve"]
    assert step["approval"]["id"] == gate.id
    assert step["approval"]["url"].endswith(f"/api/v1/approvals/{gate.id}/")


@pytest.mark.django_db
@pytest.mark.parametrize("note", ["", "   ", None])
def test_a_rejection_without_a_reason_is_a_400_naming_the_note(approver_api, gate, note):
    body = {"proposal_hash": gate.proposal_hash} | ({} if note is None else {"note": note})
    response = approver_api.post(f"/api/v1/approvals/{gate.id}/reject/", body, format="json")

    assert response.status_code == 400
    assert [e["path"] for e in response.json()["errors"]] == ["note"]
    gate.refresh_from_db()
    assert gate.state == "pending"
