"""Authority over approvals as a departed, deactivated or wrong-team person meets it: who may
decide, who is told, whether an approval still holds when its step runs, and what the admin's
home page counts (approvals/authority.py). From the survivors of `make mutate` over that module.
"""
import pytest
from django.contrib.auth.models import Group

from approvals.authority import ON_THE_WAY_LIMIT, inbox, is_reviewer, on_the_way
from approvals.models import ApprovalRequest
from notifications.models import Notification
from orchestrator.engine.errors import Forbidden
from orchestrator.engine.retry import StepError
from orchestrator.engine.services.kinds.human_gate import (
    approval_edit,
    approval_grant,
    approval_reject,
)
from orchestrator.engine.services.kinds.worker import Usage, step_claim, step_fail
from orchestrator.engine.services.reaper import reap
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Role, Run, StepRun
from orchestrator.tasks import execute_step
from tests.conftest import client_for
from tests.factories import SETUP, TeamFactory, example_definition, member

from .conftest import INBOX, SUPPORT_INPUT, refund_gate, sent_emails, signed_in, support_gate

pytestmark = pytest.mark.django_db


def home(user) -> str:
    return signed_in(user).get("/admin/").content.decode()


def approve(approval, user, note="ok") -> ApprovalRequest:
    current = ApprovalRequest.objects.get(pk=approval.pk)
    return approval_grant(approval_id=approval.id, user=user, proposal_hash=current.proposal_hash,
                          note=note)


def deactivate(user) -> None:
    user.is_active = False
    user.save()


def state(approval) -> str:
    return ApprovalRequest.objects.get(pk=approval.pk).state


def critical_refund(team, requester) -> ApprovalRequest:
    """A refund above the order's total: critical, so two approvers are asked for."""
    approval = refund_gate(team, requester, message="My order never arrived", order_id="ORD-1001")
    assert (approval.risk_tier, approval.approvals_required) == ("critical", 2)
    return approval


def approved_by_two(team, requester, first, second) -> StepRun:
    """A support reply two leads must approve, approved by both: its send step is queued."""
    approval = support_gate(team, requester, changes={"required_approvals": {"medium": 2}})
    assert approval.approvals_required == 2
    approve(approval, first)
    approve(approval, second)
    send = StepRun.objects.get(run=approval.run_id, name="send")
    assert send.state == "queued"
    return send


# --- who may decide -------------------------------------------------------------------------


def test_a_deactivated_approver_can_no_longer_decide(team, requester, lead):
    approval = support_gate(team, requester)
    deactivate(lead)

    for decide in (lambda: approve(approval, lead),
                   lambda: approval_reject(approval_id=approval.id, user=lead, note="no",
                                           proposal_hash=approval.proposal_hash)):
        with pytest.raises(Forbidden, match="not one of this request's approvers"):
            decide()
    assert state(approval) == "pending"


def test_a_deactivated_person_has_nothing_waiting_and_is_no_reviewer(team, requester, lead):
    # The admin signs no inactive person in; a service asked about one answers "nothing".
    version, _ = workflow_save(team=team, definition=example_definition("support"), actor=SETUP)
    run_start(version=version, input=SUPPORT_INPUT, actor=requester)  # on its way to the gate
    support_gate(team, requester)  # and one waiting at it
    assert (inbox(lead).count(), on_the_way(lead), is_reviewer(lead)) == (1, 1, True)

    deactivate(lead)

    assert (inbox(lead).count(), on_the_way(lead), is_reviewer(lead)) == (0, 0, False)


def test_a_refusal_by_separation_of_duties_says_why_in_full(team, requester, lead, second_lead):
    starter = member(team, "starter_lead", role=Role.EDITOR, groups=("support_leads",))
    started = support_gate(team, starter)
    edited = support_gate(team, requester)
    approval_edit(approval_id=edited.id, user=lead, proposal_hash=edited.proposal_hash,
                  params={"subject": "Your refund"})

    def refusal(user, approval) -> str:
        response = client_for(user).post(f"/api/v1/approvals/{approval.id}/approve/", {
            "proposal_hash": ApprovalRequest.objects.get(pk=approval.pk).proposal_hash},
            format="json")
        assert response.status_code == 403
        return response.json()["errors"][0]["message"]

    # The reason names the path and the person that set the run in motion.
    assert refusal(starter, started) == (
        "you started this run or set it in motion (the API; set in motion by starter_lead "
        "(started it)), so someone else must approve it (separation of duties)")
    assert refusal(lead, edited) == (
        "you edited these parameters, so someone else must approve them (separation of duties)")


def test_a_run_without_provenance_is_refused_to_its_starter_without_an_empty_aside(team, lead):
    starter = member(team, "starter_lead", role=Role.EDITOR, groups=("support_leads",))
    approval = support_gate(team, starter)
    Run.objects.filter(pk=approval.run_id).update(provenance={})  # a run from before provenance was kept (migration 0017)

    with pytest.raises(Forbidden) as refused:
        approve(approval, starter)

    assert str(refused.value) == ("you started this run or set it in motion, so someone else "
                                  "must approve it (separation of duties)")


# --- N of M -----------------------------------------------------------------------------------


def test_an_approval_of_an_earlier_hash_does_not_count_toward_several(team, requester, lead,
                                                                      second_lead):
    third = member(team, "lead3", role=Role.MEMBER, groups=("support_leads",))
    approval = critical_refund(team, requester)
    approve(approval, lead)
    # Still above the order's total: still critical, still two approvers, under a new hash.
    approval_edit(approval_id=approval.id, user=second_lead, proposal_hash=approval.proposal_hash,
                  params={"amount_usd": 1000})

    approve(approval, third)

    assert state(approval) == "pending"  # the lead approved another amount
    approve(approval, lead)  # and may approve this one
    assert state(approval) == "approved"


def test_a_rejected_request_shows_no_approval_given(team, requester, lead):
    approval = support_gate(team, requester)
    approval_reject(approval_id=approval.id, user=lead, proposal_hash=approval.proposal_hash,
                    note="Not this reply.")

    html = signed_in(lead).get(f"{INBOX}{approval.id}/change/").content.decode()

    assert "approvals <strong>0 of 1</strong>" in html


# --- whether an approval still holds when its step runs ----------------------------------------


def test_an_approval_of_two_holds_while_both_approvers_may_still_approve(team, requester, lead,
                                                                        second_lead):
    send = approved_by_two(team, requester, lead, second_lead)

    execute_step(send.id)

    send.refresh_from_db()
    assert send.state == "completed", send.error
    assert len(sent_emails(send.run)) == 1


@pytest.mark.parametrize("departs", ["deactivated", "deleted"])
def test_an_approval_of_two_lapses_when_one_approver_is_gone(team, requester, lead, second_lead,
                                                           departs):
    send = approved_by_two(team, requester, lead, second_lead)
    if departs == "deactivated":
        deactivate(lead)
    else:
        lead.delete()

    execute_step(send.id)

    send.refresh_from_db()
    assert send.state == "failed" and send.error["class"] == "policy"
    assert "1 of its 2 approver(s) may still approve" in send.error["message"]
    assert sent_emails(send.run) == []


def test_an_approval_given_at_the_escalated_tier_holds(team, requester, lead, manager,
                                                       frozen_clock):
    approval = support_gate(team, requester)
    frozen_clock.advance(hours=4, seconds=1)
    reap()  # the leads' deadline passed: the managers decide now
    assert ApprovalRequest.objects.get(pk=approval.pk).approvers == "support_managers"

    approve(approval, manager)
    send = StepRun.objects.get(run=approval.run_id, name="send")
    execute_step(send.id)

    send.refresh_from_db()
    assert send.state == "completed", send.error
    assert len(sent_emails(send.run)) == 1


# --- who is told, who sees ----------------------------------------------------------------------


def test_only_the_active_leads_of_the_runs_team_with_an_address_are_told(team, requester, lead):
    no_address = member(team, "no_address", role=Role.MEMBER, groups=("support_leads",))
    no_address.email = ""
    no_address.save()
    deactivate(member(team, "departed", role=Role.MEMBER, groups=("support_leads",)))
    member(TeamFactory(slug="other"), "their_lead", role=Role.MEMBER, groups=("support_leads",))

    support_gate(team, requester)

    [notice] = Notification.objects.filter(kind="approval.requested")
    assert notice.recipients == ["lead@example.com"]


def test_a_person_who_decided_a_request_still_sees_it_after_leaving_its_group(team, requester,
                                                                              lead):
    approval = support_gate(team, requester)
    approve(approval, lead)
    lead.groups.remove(Group.objects.get(name="support_leads"))
    lead.groups.add(Group.objects.get_or_create(name="finance")[0])  # a reviewer still

    response = signed_in(lead).get(f"{INBOX}{approval.id}/change/")

    assert response.status_code == 200


def test_the_home_page_counts_only_pending_requests_of_my_groups(team, requester, lead, manager):
    approval = support_gate(team, requester)
    assert "1 pending approval request" in home(lead)
    assert "No approval request waits for your groups." in home(manager)  # the leads' request

    approve(approval, lead)

    assert "No approval request waits for your groups." in home(lead)


def test_nothing_is_on_its_way_to_a_person_in_no_group(team, requester, operator):
    version, _ = workflow_save(team=team, definition=example_definition("support"), actor=SETUP)
    run_start(version=version, input=SUPPORT_INPUT, actor=requester)

    assert "on the way" not in home(operator)


def test_only_my_teams_runs_are_on_their_way_to_my_gate(team, requester):
    other = TeamFactory(slug="other")
    their_lead = member(other, "their_lead", role=Role.MEMBER, groups=("support_leads",))
    version, _ = workflow_save(team=team, definition=example_definition("support"), actor=SETUP)
    run_start(version=version, input=SUPPORT_INPUT, actor=requester)

    assert "on the way" not in home(their_lead)


def test_a_gate_passed_is_no_longer_on_its_way(team, requester, lead):
    approval = support_gate(team, requester)
    approve(approval, lead)  # the run runs on: its send step is queued

    assert Run.objects.get(pk=approval.run_id).state == "running"
    assert "on the way" not in home(lead)


def test_a_paused_run_is_not_on_its_way_to_its_gate(team, requester, lead):
    version, _ = workflow_save(team=team, actor=SETUP, definition={
        "name": "paused", "input_schema": {"type": "object"}, "on_error": "pause", "steps": [
            {"name": "call", "type": "tool", "tool": "core.echo"},
            {"name": "gate", "type": "human_gate", "approvers": "support_leads",
             "after": ["call"]}]})
    run = run_start(version=version, input={}, actor=requester)
    assert "1 running run is on the way" in home(lead)
    call = run.steps.get(name="call")
    claim = step_claim(step_id=call.id, worker="test")
    step_fail(step_id=call.id, attempt=claim.attempt, error=StepError("permanent", "down"),
              usage=Usage(), worker="test")

    assert Run.objects.get(pk=run.pk).state == "paused"
    assert "on the way" not in home(lead)


def test_a_gate_behind_many_newer_steps_is_still_on_its_way(team, requester, lead):
    # The count looks at the newest gates only (ON_THE_WAY_LIMIT): steps of other kinds must
    # not take their places.
    version, _ = workflow_save(team=team, actor=SETUP, definition={
        "name": "wide", "input_schema": {"type": "object"}, "steps": [
            {"name": "call", "type": "tool", "tool": "core.echo"},
            {"name": "gate", "type": "human_gate", "approvers": "support_leads",
             "after": ["call"]},
            *({"name": f"after_{i}", "type": "tool", "tool": "core.echo", "after": ["gate"]}
              for i in range(ON_THE_WAY_LIMIT))]})
    run_start(version=version, input={}, actor=requester)

    assert "1 running run is on the way" in home(lead)
