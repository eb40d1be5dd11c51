"""Deadlines on beat (the reaper), with a controlled clock: a reminder before the deadline,
escalation to the next tier, then expiry or rejection per the gate's policy."""
from datetime import timedelta

import pytest
from django.core import mail

from approvals.models import ApprovalRequest
from audit.chain import seal_pending
from audit.models import AuditEntry
from notifications.delivery import notification_deliver
from notifications.models import Notification
from orchestrator.engine.errors import Forbidden
from orchestrator.engine.services.kinds import handler_for
from orchestrator.engine.services.kinds.human_gate import approval_grant
from orchestrator.engine.services.reaper import reap
from orchestrator.models import Run, StepRun

from .conftest import support_gate

pytestmark = pytest.mark.django_db

# The support example: 4 h for support_leads, a reminder 30 min before each deadline, then
# 4 h for support_managers, then the request expires.


def fresh(approval) -> ApprovalRequest:
    return ApprovalRequest.objects.select_related("step").get(pk=approval.pk)


def notices(kind: str) -> list[Notification]:
    return list(Notification.objects.filter(kind=kind).order_by("id"))


def test_a_reminder_goes_out_once_before_the_deadline(team, requester, lead, frozen_clock):
    approval = support_gate(team, requester)
    assert fresh(approval).remind_at == approval.deadline_at - timedelta(minutes=30)

    frozen_clock.advance(hours=3, minutes=29)
    reap()
    assert notices("approval.reminder") == []

    frozen_clock.advance(minutes=2)
    reap()
    reap()

    [reminder] = notices("approval.reminder")
    assert reminder.recipients == ["lead@example.com"]
    assert reminder.subject.startswith("Approval due ")
    assert fresh(approval).reminded_at is not None


def test_the_deadline_escalates_to_the_next_tier(team, requester, lead, manager, frozen_clock):
    approval = support_gate(team, requester)
    deadline = approval.deadline_at

    frozen_clock.advance(hours=4, seconds=1)
    report = reap()

    escalated = fresh(approval)
    assert report["timed_out"] == 1
    assert (escalated.state, escalated.approvers, escalated.escalation_level) == (
        "pending", "support_managers", 1)
    assert escalated.deadline_at == deadline + timedelta(hours=4, seconds=1)
    assert escalated.step.state == "waiting"
    assert escalated.step.deadline_at == escalated.deadline_at
    [notice] = notices("approval.escalated")
    assert notice.recipients == ["manager@example.com"]
    assert notice.subject.startswith("Escalated to support_managers")
    seal_pending()
    assert AuditEntry.objects.filter(action="approval.escalated", actor="service:reaper").count() == 1

    with pytest.raises(Forbidden):  # the leads handed it on
        approval_grant(approval_id=approval.id, user=lead, proposal_hash=approval.proposal_hash)
    approval_grant(approval_id=approval.id, user=manager, proposal_hash=approval.proposal_hash,
                   note="approved on escalation")
    assert fresh(approval).state == "approved"


def test_after_the_last_tier_the_request_expires_by_default(team, requester, frozen_clock):
    approval = support_gate(team, requester)

    frozen_clock.advance(hours=4, seconds=1)
    reap()
    frozen_clock.advance(hours=4, seconds=1)
    reap()

    expired = fresh(approval)
    assert expired.state == "expired"
    assert expired.step.state == "timed_out"
    assert Run.objects.get(pk=approval.run_id).state == "failed"


def test_a_gate_may_auto_reject_on_its_deadline(team, requester, frozen_clock):
    approval = support_gate(team, requester, changes={"escalation": [], "on_deadline": "reject"})

    frozen_clock.advance(hours=4, seconds=1)
    reap()

    rejected = fresh(approval)
    assert rejected.state == "rejected"
    assert (rejected.decided_by, rejected.note) == (None, "")  # no invented note or reviewer
    gate = StepRun.objects.get(pk=approval.step_id)
    assert gate.error == {"class": "rejected",
                          "message": "the approval deadline passed; the gate's policy rejects it"}
    seal_pending()
    entry = AuditEntry.objects.get(action="approval.rejected", subject_id=str(approval.id))
    assert entry.actor == "service:reaper" and "deadline passed" in entry.data["reason"]
    assert Run.objects.get(pk=approval.run_id).state == "failed"


def test_a_sweep_before_the_deadline_changes_nothing(team, requester, frozen_clock):
    approval = support_gate(team, requester)

    frozen_clock.advance(hours=3)
    reap()

    assert fresh(approval).state == "pending" and fresh(approval).escalation_level == 0


def test_the_notification_is_an_email_with_a_link_to_the_decision_page(team, requester, lead, settings):
    settings.STEPWISE_BASE_URL = "https://stepwise.example"
    approval = support_gate(team, requester)
    [notice] = notices("approval.requested")

    assert notification_deliver(notification_id=notice.id)

    [message] = mail.outbox
    assert message.to == ["lead@example.com"]
    assert message.subject == "Approval needed: support-reply / approve (medium risk)"
    assert f"https://stepwise.example/admin/approvals/approvalrequest/{approval.id}/change/" in message.body
    assert "email.send to dana@example.com: Re: ticket T-9" in message.body


def test_a_sweep_that_listed_the_gate_before_another_escalated_it_does_nothing(
        team, requester, lead, manager, frozen_clock):
    approval = support_gate(team, requester)
    frozen_clock.advance(hours=4, seconds=1)
    assert reap()["timed_out"] == 1

    # The second sweep read the step as due before the first one's commit moved its deadline on.
    assert handler_for("human_gate").time_out(step_id=approval.step_id, reason="again") is False

    escalated = fresh(approval)
    assert (escalated.state, escalated.approvers, escalated.escalation_level) == (
        "pending", "support_managers", 1)
    assert len(notices("approval.escalated")) == 1
