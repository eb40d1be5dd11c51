"""Who may decide: the approvers group in the run's team, one service for every entry point;
separation of duties (a step may relax it for low tiers); N-of-M distinct approvers."""
import pytest

from approvals.models import ApprovalRequest
from audit.chain import seal_pending
from audit.models import AuditEntry
from orchestrator.engine.errors import Forbidden, InputInvalid, NotAllowed
from orchestrator.engine.services.kinds.human_gate import (
    approval_edit,
    approval_grant,
    approval_reject,
)
from orchestrator.models import Role, StepRun
from tests.conftest import client_for
from tests.factories import member

from .conftest import refund_gate, support_gate

pytestmark = pytest.mark.django_db


def approve(approval, user, note="ok"):
    return approval_grant(approval_id=approval.id, user=user,
                          proposal_hash=ApprovalRequest.objects.get(pk=approval.pk).proposal_hash,
                          note=note)


def refused(approval) -> list[str]:
    seal_pending()
    return [e.data["reason"] for e in AuditEntry.objects.filter(
        action="approval.refused", subject_id=str(approval.id))]


# --- separation of duties ----------------------------------------------------------------------


def test_whoever_started_the_run_may_not_approve_it_even_as_an_approver(team):
    starter = member(team, "starter_lead", role=Role.EDITOR, groups=("support_leads",))
    approval = support_gate(team, starter)

    response = client_for(starter).post(f"/api/v1/approvals/{approval.id}/approve/", {
        "proposal_hash": approval.proposal_hash}, format="json")

    assert response.status_code == 403
    assert "you started this run" in response.json()["errors"][0]["message"]
    assert ApprovalRequest.objects.get(pk=approval.pk).state == "pending"
    assert any("separation of duties" in reason for reason in refused(approval))


def test_whoever_started_the_run_may_still_reject_it(team):
    starter = member(team, "starter_lead", role=Role.EDITOR, groups=("support_leads",))
    approval = support_gate(team, starter)

    approval_reject(approval_id=approval.id, user=starter, proposal_hash=approval.proposal_hash,
                    note="I sent this by mistake.")

    assert ApprovalRequest.objects.get(pk=approval.pk).state == "rejected"


def test_a_gate_may_relax_separation_of_duties_up_to_a_tier(team):
    starter = member(team, "starter_lead", role=Role.EDITOR, groups=("support_leads",))
    relaxed = support_gate(team, starter, changes={"self_approval_up_to": "medium"})
    strict_above = support_gate(team, starter, changes={"self_approval_up_to": "low"})

    approve(relaxed, starter)

    assert ApprovalRequest.objects.get(pk=relaxed.pk).state == "approved"  # medium <= medium
    with pytest.raises(Forbidden, match="you started this run"):
        approve(strict_above, starter)  # the support gate is medium, above low


def test_whoever_edited_the_parameters_may_not_approve_them(team, requester, lead, second_lead):
    approval = support_gate(team, requester)
    approval_edit(approval_id=approval.id, user=lead, proposal_hash=approval.proposal_hash,
                  params={"subject": "Your refund"}, note="clearer subject")

    with pytest.raises(Forbidden, match="you edited these parameters"):
        approve(approval, lead)
    approve(approval, second_lead)

    assert ApprovalRequest.objects.get(pk=approval.pk).state == "approved"


def test_staff_operators_and_owners_are_not_approvers(team, requester):
    approval = support_gate(team, requester)
    for name, role in (("op", Role.OPERATOR), ("own", Role.OWNER)):
        user = member(team, name, role=role, staff=True)
        with pytest.raises(Forbidden, match="not one of this request's approvers"):
            approve(approval, user)
    assert len(refused(approval)) == 2


# --- N of M ------------------------------------------------------------------------------------


def test_a_tier_may_need_several_distinct_approvers(team, requester, lead, second_lead):
    # The refund exceeds the order total: critical, and the example asks two approvers for it.
    approval = refund_gate(team, requester, message="My order never arrived", order_id="ORD-1001")
    assert (approval.risk_tier, approval.approvals_required) == ("critical", 2)

    approve(approval, lead, note="checked the carrier")
    first = ApprovalRequest.objects.get(pk=approval.pk)
    assert first.state == "pending"
    assert StepRun.objects.get(pk=approval.step_id).state == "waiting"
    with pytest.raises(NotAllowed, match="you already approved this"):
        approve(approval, lead)

    approve(approval, second_lead, note="agreed")

    decided = ApprovalRequest.objects.get(pk=approval.pk)
    gate = StepRun.objects.get(pk=approval.step_id)
    assert decided.state == "approved" and gate.state == "completed"
    assert gate.output["approved_by"] == ["lead", "lead2"]


def test_approvals_of_an_edited_action_start_again(team, requester, lead, second_lead):
    third = member(team, "lead3", role=Role.MEMBER, groups=("support_leads",))
    approval = refund_gate(team, requester, message="My order never arrived", order_id="ORD-1001")
    approve(approval, lead)

    approval_edit(approval_id=approval.id, user=second_lead, proposal_hash=approval.proposal_hash,
                  params={"amount_usd": 30}, note="the order was 40 USD")
    edited = ApprovalRequest.objects.get(pk=approval.pk)
    # 30 USD of a 40 USD order: no longer above the total, so no longer critical: one approver.
    assert edited.risk_tier == "low" and edited.approvals_required == 1
    assert edited.proposal_hash != approval.proposal_hash

    approve(edited, third)
    assert ApprovalRequest.objects.get(pk=approval.pk).state == "approved"


def test_a_single_rejection_is_enough(team, requester, lead):
    approval = refund_gate(team, requester, message="My order never arrived", order_id="ORD-1001")

    approval_reject(approval_id=approval.id, user=lead, proposal_hash=approval.proposal_hash,
                    note="Carrier shows it delivered.")

    assert ApprovalRequest.objects.get(pk=approval.pk).state == "rejected"
    assert StepRun.objects.get(pk=approval.step_id).error["class"] == "rejected"


def test_rejecting_needs_a_note(team, requester, lead):
    approval = support_gate(team, requester)

    response = client_for(lead).post(f"/api/v1/approvals/{approval.id}/reject/", {
        "proposal_hash": approval.proposal_hash, "note": "  "}, format="json")

    assert response.status_code == 400  # the published schema asks for a note: the API refuses it
    assert response.json()["errors"][0]["path"] == "note"
    assert ApprovalRequest.objects.get(pk=approval.pk).state == "pending"
    with pytest.raises(InputInvalid):  # any other caller of the service: refused and audited
        approval_reject(approval_id=approval.id, user=lead, proposal_hash=approval.proposal_hash,
                        note="  ")
    assert ApprovalRequest.objects.get(pk=approval.pk).state == "pending"
    assert refused(approval)


def test_deciding_a_request_that_is_no_longer_pending_is_refused_and_audited(team, requester, lead):
    approval = support_gate(team, requester)
    client_for(requester).post(f"/api/v1/runs/{approval.run_id}/cancel/")

    response = client_for(lead).post(f"/api/v1/approvals/{approval.id}/approve/", {
        "proposal_hash": approval.proposal_hash}, format="json")

    assert response.status_code == 409
    assert "already cancelled" in response.json()["errors"][0]["message"]
    assert refused(approval) == [response.json()["errors"][0]["message"]]
