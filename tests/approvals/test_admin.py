"""The reviewer's admin: a reviewer who is not staff signs in, finds their groups' requests in
the inbox, reads the decision page, and decides through the same services as the API."""
import re
from decimal import Decimal

import pytest
from django.test import Client

from approvals.models import ApprovalRequest
from orchestrator.models import Role, Run, StepRun
from tests.factories import TeamFactory, member

from .conftest import INBOX, SUPPORT_INPUT, refund_gate, signed_in, support_gate

pytestmark = pytest.mark.django_db


def page(approval) -> str:
    return f"{INBOX}{approval.id}/change/"


def test_a_reviewer_who_is_not_staff_signs_in_and_sees_what_waits(team, requester, lead):
    lead.set_password("pw")
    lead.save()
    approval = support_gate(team, requester)
    client = Client()

    response = client.post("/admin/login/?next=/admin/", {"username": "lead", "password": "pw"})

    assert not lead.is_staff
    assert response.status_code == 302 and response["Location"] == "/admin/"
    home = client.get("/admin/").content.decode()
    assert "Waiting for your decision" in home
    assert f'href="{INBOX}">1 pending approval request</a>' in home
    assert ('<span class="waiting-count" title="pending requests and input tasks waiting for '
            'you">1</span>') in home
    assert approval.run_id  # the inbox lists it (below)
    assert str(approval.id) in client.get(INBOX).content.decode()


def test_a_person_in_no_group_and_not_staff_cannot_sign_in(team):
    plain = member(team, "plain", role=Role.OWNER)
    plain.set_password("pw")
    plain.save()

    response = Client().post("/admin/login/?next=/admin/", {"username": "plain", "password": "pw"})

    assert response.status_code == 200
    assert "Please enter the correct username and password" in response.content.decode()


def test_the_inbox_lists_my_groups_pending_requests_oldest_deadline_first(team, requester, lead, frozen_clock):
    later = support_gate(team, requester, changes={"timeout_s": 7200, "escalation": [],
                                                   "remind_before_s": 60})
    sooner = support_gate(team, requester, changes={"timeout_s": 3600, "escalation": [],
                                                    "remind_before_s": 60})
    managers = support_gate(team, requester, changes={"approvers": "support_managers"})
    decided = support_gate(team, requester)
    second = member(team, "lead2", groups=("support_leads",))
    signed_in(second).post(page(decided), {"form": "decision", "decision": "approve",
                                           "proposal_hash": decided.proposal_hash})

    html = signed_in(lead).get(INBOX).content.decode()

    rows = [f'href="{page(a)}' for a in (sooner, later)]
    assert rows[0] in html and rows[1] in html
    assert html.index(rows[0]) < html.index(rows[1])  # the oldest deadline first
    assert page(managers) not in html  # another group's
    assert page(decided) not in html  # not pending
    for column in ("Workflow", "Risk", "Amount", "Requester", "Age", "Deadline", "Approvals"):
        assert f">{column}</a></div>" in html or f"<span>{column}</span>" in html, column
    assert '<span class="tier-badge tier-medium">medium</span>' in html
    assert "email.send to dana@example.com: Re: ticket T-9" in html
    assert page(decided) in signed_in(lead).get(f"{INBOX}?state=all").content.decode()


def test_a_reviewer_sees_only_their_teams_runs_and_requests(team, requester, lead):
    mine = support_gate(team, requester)
    other = TeamFactory(slug="other")
    theirs = support_gate(other, member(other, "their_editor", role=Role.EDITOR))
    client = signed_in(lead)

    runs = client.get("/admin/orchestrator/run/").content.decode()
    inbox = client.get(f"{INBOX}?state=all&for=all").content.decode()

    assert str(mine.run_id) in runs and str(theirs.run_id) not in runs
    assert page(mine) in inbox and page(theirs) not in inbox
    assert client.get(page(theirs)).status_code == 404


def test_the_decision_page_shows_the_action_for_a_person(team, requester, lead):
    approval = support_gate(team, requester)

    html = signed_in(lead).get(page(approval)).content.decode()

    assert "Approve the reply to ticket T-9" in html  # the instructions
    assert SUPPORT_INPUT["body"] in html  # the customer's message: the run's input
    assert '<span class="label">To</span> dana@example.com' in html  # the e-mail as it will be sent
    assert "Re: ticket T-9" in html and "the policy allows a fix or a refund within 30 days" in html
    assert approval.proposal_hash in html  # the one hash, shown
    assert f'name="proposal_hash" value="{approval.proposal_hash}"' in html  # and sent back
    assert "a gate that approves no typed proposal is medium risk" in html
    assert 'value="approve"' in html and 'value="reject"' in html
    assert "Edit the parameters" in html and "(decided in the admin)" not in html
    assert "the workflow puts your note into what send sends" in html


def test_the_decision_page_shows_the_email_once_the_cost_so_far_and_the_live_page(team, requester, lead):
    approval = support_gate(team, requester)
    Run.objects.filter(pk=approval.run_id).update(cost_usd=Decimal("0.004215"))

    html = signed_in(lead).get(page(approval)).content.decode()

    assert html.count('<span class="label">To</span> dana@example.com') == 1  # one preview
    assert html.count('class="message-preview"') == 1
    assert "What step &#x27;send&#x27; will do" not in html  # the action is that step's call
    assert f'href="/admin/orchestrator/run/{approval.run_id}/live/"' in html
    assert f"/admin/orchestrator/run/{approval.run_id}/change/" not in html
    assert "cost so far <strong>$0.0042</strong> of $2.00" in html


def test_the_decision_page_of_a_proposal_shows_its_evidence_and_rationale(team, requester, lead):
    approval = refund_gate(team, requester, message="My order never arrived")

    html = signed_in(lead).get(page(approval)).content.decode()

    assert "refund, proposed by step &#x27;propose&#x27;" in html
    assert "The order was not delivered; a full refund is due." in html  # rationale
    assert "<blockquote>My order never arrived</blockquote>" in html  # evidence
    assert "0.80" in html  # confidence
    assert "amount_usd 1200.0 &gt;= 500 (high threshold)" in html  # each risk reason
    assert "It will not run: its condition is false" in html  # the decline reply will not happen
    assert "explanation" not in html.split("Edit the parameters")[1]  # the decline's parameter
    assert "I have read this high-risk action" in html  # confirmation for high and critical
    assert "this workflow does not pass it on" in html  # the note stays with the decision


def test_approving_with_a_note_from_the_page(team, requester, lead):
    approval = support_gate(team, requester)
    client = signed_in(lead)

    response = client.post(page(approval), {"form": "decision", "decision": "approve",
                                            "note": "Refund approved.",
                                            "proposal_hash": approval.proposal_hash})

    assert response.status_code == 302 and response["Location"] == INBOX
    decided = ApprovalRequest.objects.get(pk=approval.pk)
    assert (decided.state, decided.note, decided.decided_by) == ("approved", "Refund approved.", lead)
    assert StepRun.objects.get(pk=approval.step_id).output["note"] == "Refund approved."
    assert "Approved: email.send to dana@example.com" in client.get(INBOX).content.decode()


def test_rejecting_from_the_page_needs_a_note(team, requester, lead):
    approval = support_gate(team, requester)

    response = signed_in(lead).post(page(approval), {
        "form": "decision", "decision": "reject", "note": "",
        "proposal_hash": approval.proposal_hash})

    assert response.status_code == 400
    assert "a note is required to reject" in response.content.decode()
    assert ApprovalRequest.objects.get(pk=approval.pk).state == "pending"


def test_a_high_risk_approval_needs_the_confirmation(team, requester, lead):
    approval = refund_gate(team, requester, message="My order never arrived")  # high
    client = signed_in(lead)
    form = {"form": "decision", "decision": "approve", "proposal_hash": approval.proposal_hash}

    unconfirmed = client.post(page(approval), form)
    confirmed = client.post(page(approval), {**form, "confirm": "on"})

    assert unconfirmed.status_code == 400
    assert "confirm you have read it" in unconfirmed.content.decode()
    assert confirmed.status_code == 302
    assert ApprovalRequest.objects.get(pk=approval.pk).state == "approved"


def test_editing_from_the_page_rehashes_and_is_shown_as_the_reviewers_change(team, requester, lead):
    approval = support_gate(team, requester)
    client = signed_in(lead)

    response = client.post(page(approval), {
        "form": "edit", "proposal_hash": approval.proposal_hash, "note": "friendlier",
        "param_subject": "Your refund", "param_body": approval.action["params"]["body"]})

    assert response.status_code == 302
    edited = ApprovalRequest.objects.get(pk=approval.pk)
    assert edited.action["params"]["subject"] == "Your refund"
    assert edited.proposal_hash != approval.proposal_hash
    html = client.get(page(approval)).content.decode()
    assert '<span class="edited">edited</span>' in html
    assert "subject: Re: ticket T-9 → Your refund" in html
    assert "you edited these parameters" in html  # and may not approve them
    assert 'value="approve"' not in html


def test_revoking_an_approval_from_the_page(team, requester, lead, second_lead):
    approval = support_gate(team, requester)
    signed_in(lead).post(page(approval), {"form": "decision", "decision": "approve",
                                          "proposal_hash": approval.proposal_hash})

    response = signed_in(second_lead).post(page(approval), {"form": "revoke", "note": "Wrong customer."})

    assert response.status_code == 302
    assert ApprovalRequest.objects.get(pk=approval.pk).state == "revoked"


def test_a_decided_request_shows_its_history_and_no_decision(team, requester, lead, second_lead):
    approval = support_gate(team, requester)
    signed_in(lead).post(page(approval), {"form": "edit", "proposal_hash": approval.proposal_hash,
                                          "param_subject": "Your refund",
                                          "param_body": approval.action["params"]["body"]})
    edited = ApprovalRequest.objects.get(pk=approval.pk)
    signed_in(second_lead).post(page(approval), {
        "form": "decision", "decision": "reject", "note": "Wrong customer.",
        "proposal_hash": edited.proposal_hash})

    response = signed_in(lead).get(page(approval))

    html = response.content.decode()
    assert response.status_code == 200
    assert '<span class="state-badge state-bad">rejected</span>' in html
    assert "<strong>lead</strong> edited" in html and "<strong>lead2</strong> rejected" in html
    assert "<blockquote>Wrong customer.</blockquote>" in html
    assert 'id="decision-form"' not in html and 'id="edit-form"' not in html


def test_a_reviewer_who_is_not_staff_is_offered_only_the_reviewers_pages(team, lead, operator):
    html = signed_in(lead).get("/admin/").content.decode()

    linked = set(re.findall(r'href="(/admin/[a-z_]+/[a-z_]+/)"', html))
    # The index, the sidebar and the header: the inbox and the input tasks only.
    assert linked == {INBOX, "/admin/approvals/inputtask/"}, linked
    offered = signed_in(operator).get("/admin/").content.decode()
    assert "/admin/orchestrator/run/" in offered and "/admin/orchestrator/deadletter/" in offered


def test_the_home_page_counts_a_run_on_its_way_to_my_gate_until_the_gate_opens(team, requester, lead):
    from orchestrator.engine.services.runs import run_start
    from orchestrator.engine.services.workflows import workflow_save
    from tests.factories import SETUP, example_definition

    from .conftest import work
    version, _ = workflow_save(team=team, definition=example_definition("support"), actor=SETUP)
    run = run_start(version=version, input=SUPPORT_INPUT, actor=requester)
    client = signed_in(lead)

    home = client.get("/admin/").content.decode()
    assert "No approval request waits for your groups." in home
    assert "1 running run is on the way to a gate for your groups" in home  # not "nothing"
    assert "on the way" not in signed_in(member(team, "other", groups=("finance",))).get(
        "/admin/").content.decode()  # not their group's gate

    work(run)
    home = client.get("/admin/").content.decode()
    assert "1 pending approval request" in home and "on the way" not in home
