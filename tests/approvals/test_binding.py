"""One hash per request, of the action that will run; deciding requires the hash the reviewer
saw; right before the guarded step runs, the approval, its hash and its approvers are checked
again, and a stale or revoked approval does not run."""
import pytest
from django.contrib.auth.models import Group
from django.test import Client

from approvals.models import ApprovalRequest
from audit.chain import seal_pending
from audit.models import AuditEntry
from orchestrator.engine.definitions.proposals import proposal_hash
from orchestrator.engine.hashing import digest_of
from orchestrator.engine.retry import StepError
from orchestrator.engine.services.kinds.human_gate import approval_grant, approval_revoke
from orchestrator.engine.services.kinds.worker import Usage, step_claim, step_fail, step_succeed
from orchestrator.engine.services.operators import dead_letter_redrive
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import DeadLetter, Role, Run, StepRun
from orchestrator.tasks import execute_step
from tests.conftest import client_for
from tests.factories import SETUP, member

from .conftest import SUPPORT_INPUT, refund_gate, sent_emails, support_gate, work

pytestmark = pytest.mark.django_db


def refusals(approval) -> list[AuditEntry]:
    seal_pending()
    return list(AuditEntry.objects.filter(action="approval.refused", subject_id=str(approval.id)))


def unchanged(approval) -> bool:
    fresh = ApprovalRequest.objects.get(pk=approval.pk)
    gate = StepRun.objects.get(pk=approval.step_id)
    return fresh.state == "pending" and not fresh.decisions.exists() and gate.state == "waiting"


# --- the hash ---------------------------------------------------------------------------------


def test_a_plain_gate_binds_the_email_the_send_step_will_send(team, requester, lead):
    approval = support_gate(team, requester)

    assert approval.action_kind == "step" and approval.guarded_steps == ["send"]
    assert approval.action == {"step": "send", "tool": "email.send", "params": {
        "to": "dana@example.com", "subject": "Re: ticket T-9",
        "body": "Thanks for reaching out. Known issue; the policy allows a fix or a refund within 30 days."}}
    assert approval.proposal_hash == digest_of(approval.action)
    body = client_for(lead).get(f"/api/v1/approvals/{approval.id}/").json()
    assert body["proposal_hash"] == approval.proposal_hash and body["action"] == approval.action


def test_a_proposal_gate_binds_the_proposal_hash_of_the_action(team, requester):
    approval = refund_gate(team, requester, message="My order never arrived")
    propose = StepRun.objects.get(run=approval.run, name="propose")

    assert approval.action_kind == "proposal" and approval.action_source == "propose"
    assert approval.action == {"action_type": "refund",
                               "params": {"order_id": "ORD-1002", "amount_usd": 1200.0}}
    assert approval.proposal_hash == propose.output["proposal_hash"] == proposal_hash(approval.action)
    assert approval.risk_tier == "high" and approval.amount == 1200
    assert approval.explanation["rationale"] == "The order was not delivered; a full refund is due."
    assert sorted(approval.guarded_steps) == ["refund", "reply"]


@pytest.mark.parametrize("sent, why", [({}, "missing"), ({"proposal_hash": "0" * 64}, "stale")])
def test_deciding_without_the_reviewed_hash_is_a_409_that_changes_nothing(team, requester, lead, sent, why):
    approval = support_gate(team, requester)

    response = client_for(lead).post(f"/api/v1/approvals/{approval.id}/approve/",
                                     {"note": "ok", **sent}, format="json")

    assert response.status_code == 409, why
    [error] = response.json()["errors"]
    assert error["path"] == "proposal_hash"
    assert unchanged(approval)
    [refusal] = refusals(approval)
    assert refusal.actor == "user:lead" and refusal.data["attempted"] == "approve"
    assert refusal.data["sent_hash"] == sent.get("proposal_hash", "")


def test_a_stale_hash_in_the_admin_is_a_form_error_that_changes_nothing(team, requester, lead):
    approval = support_gate(team, requester)
    client = Client()
    client.force_login(lead)

    response = client.post(f"/admin/approvals/approvalrequest/{approval.id}/change/", {
        "form": "decision", "decision": "approve", "note": "ok", "proposal_hash": "f" * 64})

    assert response.status_code == 409
    assert "review it again" in response.content.decode()
    assert unchanged(approval)
    assert len(refusals(approval)) == 1


def test_the_run_completes_with_the_reviewers_note_in_the_email(team, requester, lead):
    approval = support_gate(team, requester)

    approval_grant(approval_id=approval.id, user=lead, proposal_hash=approval.proposal_hash,
                   note="We will refund the difference today.")
    run = work(approval.run)

    assert run.state == "completed"
    [email] = sent_emails(run)
    assert email["to"] == "dana@example.com"
    assert email["body"].endswith("P.S. We will refund the difference today.")
    gate = StepRun.objects.get(pk=approval.step_id)
    assert gate.output["proposal_hash"] == approval.proposal_hash
    assert gate.output["approved_by"] == ["lead"]


# --- right before the guarded step runs ---------------------------------------------------------


def approved_and_send_queued(team, requester, lead) -> tuple[ApprovalRequest, StepRun]:
    approval = support_gate(team, requester)
    approval_grant(approval_id=approval.id, user=lead, proposal_hash=approval.proposal_hash,
                   note="ok")
    send = StepRun.objects.get(run=approval.run, name="send")
    assert send.state == "queued"
    return approval, send


def assert_refused(send: StepRun, why: str) -> None:
    execute_step(send.id)
    send.refresh_from_db()
    assert send.state == "failed"
    assert send.error["class"] == "policy" and why in send.error["message"]
    assert sent_emails(send.run) == []
    assert Run.objects.get(pk=send.run_id).state == "failed"


def test_a_revoked_approval_does_not_run(team, requester, lead, second_lead):
    approval, send = approved_and_send_queued(team, requester, lead)

    approval_revoke(approval_id=approval.id, user=second_lead, note="The customer wrote again.")

    assert_refused(send, "is revoked")


def test_an_approval_whose_approver_left_the_group_does_not_run(team, requester, lead):
    approval, send = approved_and_send_queued(team, requester, lead)

    lead.groups.remove(Group.objects.get(name="support_leads"))

    assert_refused(send, "0 of its 1 approver(s) may still approve")


def test_an_action_that_changed_after_approval_does_not_run(team, requester, lead):
    approval, send = approved_and_send_queued(team, requester, lead)
    # What the step would send differs from what was approved (a changed upstream output).
    changed = {**send.input}
    changed["steps"]["draft"]["output"]["reply"] = "Send us your card number."
    StepRun.objects.filter(pk=send.pk).update(input=changed)

    assert_refused(send, "not the one that was approved")


def test_a_tampered_approval_hash_does_not_run(team, requester, lead):
    approval, send = approved_and_send_queued(team, requester, lead)
    ApprovalRequest.objects.filter(pk=approval.pk).update(action={**approval.action, "tool": "x"})

    assert_refused(send, "no longer matches its hash")


def test_an_untouched_approval_runs_and_a_replayed_message_sends_once(team, requester, lead):
    approval, send = approved_and_send_queued(team, requester, lead)

    execute_step(send.id)
    execute_step(send.id)  # a replay: the step is no longer queued

    assert len(sent_emails(send.run)) == 1
    assert SUPPORT_INPUT["customer_email"] == sent_emails(send.run)[0]["to"]


def test_revoking_after_the_action_started_is_refused(team, requester, lead, second_lead):
    approval, send = approved_and_send_queued(team, requester, lead)
    execute_step(send.id)

    response = client_for(second_lead).post(f"/api/v1/approvals/{approval.id}/revoke/",
                                            {"note": "too late?"}, format="json")

    assert response.status_code == 409
    assert "already started" in response.json()["errors"][0]["message"]
    assert ApprovalRequest.objects.get(pk=approval.pk).state == "approved"


def test_a_gate_run_again_after_a_redrive_asks_again(team, requester, lead):
    version, _ = workflow_save(team=team, actor=SETUP, definition={
        "name": "gated", "input_schema": {"type": "object"}, "steps": [
            {"name": "gate", "type": "human_gate", "approvers": "support_leads"},
            {"name": "boom", "type": "tool", "tool": "core.echo"},
            {"name": "after", "type": "tool", "tool": "core.echo", "after": ["gate", "boom"]}]})
    run = run_start(version=version, input={}, actor=requester)
    boom = run.steps.get(name="boom")
    claim = step_claim(step_id=boom.id, worker="test")
    step_fail(step_id=boom.id, attempt=claim.attempt, error=StepError("permanent", "down"),
              usage=Usage(), worker="test")
    first = ApprovalRequest.objects.get(run=run)
    assert (Run.objects.get(pk=run.pk).state, first.state) == ("failed", "cancelled")

    operator = member(team, "op", role=Role.OPERATOR)
    dead_letter_redrive(dead_letter_id=DeadLetter.objects.get(step=boom).id, actor=operator)
    claim = step_claim(step_id=boom.id, worker="test")
    step_succeed(step_id=boom.id, attempt=claim.attempt, output={}, usage=Usage(), worker="test")

    requests = list(ApprovalRequest.objects.filter(run=run).order_by("id"))
    assert [r.state for r in requests] == ["cancelled", "pending"]
    assert requests[1].step_id == first.step_id
    body = client_for(lead).get(f"/api/v1/runs/{run.id}/").json()
    [gate] = [s for s in body["steps"] if s["name"] == "gate"]
    assert gate["approval"]["id"] == requests[1].id and gate["approval"]["state"] == "pending"
