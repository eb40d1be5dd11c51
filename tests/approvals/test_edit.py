"""Edited parameters: only those the gate allows, re-validated against the action's schema,
re-hashed, recorded as the reviewer's change — and what runs is what was edited."""
import pytest

from approvals.models import ApprovalRequest
from orchestrator.engine.definitions.proposals import proposal_hash
from orchestrator.engine.hashing import digest_of
from orchestrator.engine.services.kinds.human_gate import approval_grant
from tests.conftest import client_for

from .conftest import refund_gate, sent_emails, support_gate, work

pytestmark = pytest.mark.django_db


def edit(user, approval, params, *, proposal_hash=None, note="fixing it"):
    return client_for(user).post(f"/api/v1/approvals/{approval.id}/edit/", {
        "proposal_hash": proposal_hash or approval.proposal_hash, "params": params, "note": note},
        format="json")


def test_an_edit_rehashes_and_what_is_sent_is_the_edited_email(team, requester, lead, second_lead):
    approval = support_gate(team, requester)
    body = "Dear Dana,\n\nwe refunded the difference.\n\nSupport"

    response = edit(lead, approval, {"body": body})

    assert response.status_code == 200, response.json()
    edited = response.json()
    assert edited["state"] == "pending" and edited["edits"] == {"body": body}
    assert edited["action"]["params"]["body"] == body
    assert edited["proposal_hash"] == digest_of(edited["action"]) != approval.proposal_hash
    [change] = [d for d in edited["decisions"] if d["verdict"] == "edit"]
    assert change["user"] == "lead" and change["proposal_hash"] == approval.proposal_hash
    assert change["changes"]["params"]["body"]["to"] == body

    stale = client_for(second_lead).post(f"/api/v1/approvals/{approval.id}/approve/", {
        "proposal_hash": approval.proposal_hash}, format="json")
    assert stale.status_code == 409  # the hash the reviewer saw before the edit

    approval_grant(approval_id=approval.id, user=second_lead,
                   proposal_hash=edited["proposal_hash"], note="thanks")
    run = work(approval.run)
    assert run.state == "completed"
    [email] = sent_emails(run)
    assert email["body"] == body  # an edited parameter is sent exactly as written
    assert email["subject"] == "Re: ticket T-9"


@pytest.mark.parametrize("params, path, message", [
    ({"to": "someone@else.example"}, "params.to", "may not be edited"),
    ({"body": 42}, "params.body", "is not of type 'string'"),
    ({}, "params", "no parameter was changed"),
    ({"subject": "Re: ticket T-9"}, "params", "already approved"),
])
def test_a_bad_edit_is_a_400_naming_the_parameter_and_changes_nothing(team, requester, lead, params, path, message):
    approval = support_gate(team, requester)

    response = edit(lead, approval, params)

    assert response.status_code == 400, response.json()
    [error] = response.json()["errors"]
    assert error["path"] == path and message in error["message"]
    fresh = ApprovalRequest.objects.get(pk=approval.pk)
    assert (fresh.proposal_hash, fresh.edits, fresh.decisions.count()) == (approval.proposal_hash, {}, 0)


def test_a_proposal_edit_is_checked_against_the_actions_params_schema(team, requester, lead):
    approval = refund_gate(team, requester, message="My order never arrived")

    zero = edit(lead, approval, {"amount_usd": 0})
    text = edit(lead, approval, {"amount_usd": "lots"})

    assert zero.status_code == text.status_code == 400
    assert zero.json()["errors"][0]["path"] == "params.amount_usd"
    assert "less than or equal to the minimum of 0" in zero.json()["errors"][0]["message"]
    assert text.json()["errors"][0]["path"] == "params.amount_usd"


def test_an_edited_refund_is_reassessed_and_the_refund_tool_gets_the_edited_amount(team, requester, lead, second_lead):
    approval = refund_gate(team, requester, message="My order never arrived")  # 1200 USD: high

    response = edit(lead, approval, {"amount_usd": 100})

    edited = response.json()
    assert response.status_code == 200, edited
    assert edited["action"] == {"action_type": "refund",
                                "params": {"order_id": "ORD-1002", "amount_usd": 100.0}}
    assert edited["proposal_hash"] == proposal_hash(edited["action"])
    assert edited["risk_tier"] == "medium"  # 100 >= the 50 USD medium threshold, below 500
    approval_grant(approval_id=approval.id, user=second_lead,
                   proposal_hash=edited["proposal_hash"], note="partial refund agreed")
    run = work(approval.run)
    assert run.state == "completed"
    refund = run.steps.get(name="refund").output
    assert refund["amount_usd"] == 100.0
    assert run.steps.get(name="approve").output["proposal"]["params"]["amount_usd"] == 100.0


def test_a_gate_that_allows_no_edits_refuses_them(team, requester, lead):
    approval = support_gate(team, requester, changes={"editable": []})

    response = edit(lead, approval, {"body": "x"})

    assert response.status_code == 400
    assert "editable: none" in response.json()["errors"][0]["message"]
