"""The holes found from outside (issue 40), each as it was reproduced, and what closes it:

- self-approval through a trigger: the run a person's webhook (schedule, queue event) starts
  names them in its provenance, and separation of duties refuses them;
- two caps for one idea: the team's cap on unfinished runs is budgets' `max_concurrent_runs`
  on every path, and run starts are rated per person and per token;
- a queued start admitted without its person: `queued_firings_admit` re-checks the person;
- `run_start` checks the permission itself, not only its callers.
"""
import json
from datetime import timedelta

import pytest
from django.db.models import Max

from approvals.models import ApprovalRequest
from audit.chain import seal_pending
from audit.models import AuditEntry
from budgets.services import budget_limit_create
from orchestrator.engine import clock
from orchestrator.engine.errors import Forbidden
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Role, Run, TeamMembership
from tests.approvals.conftest import sent_emails, work
from tests.conftest import client_for
from tests.factories import SETUP, example_definition, member
from triggers.models import Firing
from triggers.services.config import trigger_create, trigger_update, webhook_secret_rotate
from triggers.services.firing import queued_firings_admit
from triggers.signatures import sign

pytestmark = pytest.mark.django_db

TEMPLATE = {"ticket_id": "{{ payload.ticket }}", "body": "{{ payload.text }}",
            "customer_email": "{{ payload.email }}"}
TICKET = {"ticket": "T-40", "text": "My invoice is wrong, I want a refund.",
          "email": "dana@example.com"}


@pytest.fixture
def support(team):
    version, _ = workflow_save(team=team, definition=example_definition("support"), actor=SETUP)
    return version


@pytest.fixture
def gated(team):
    version, _ = workflow_save(team=team, actor=SETUP, definition={
        "name": "gated", "input_schema": {"type": "object"}, "steps": [
            {"name": "approve", "type": "human_gate", "approvers": "support_leads",
             "timeout_s": 3600}]})
    return version


def deliver(trigger_id, secret: str, delivery: str, body: dict):
    raw = json.dumps(body).encode()
    stamp = int(clock.now().timestamp())
    from rest_framework.test import APIClient
    return APIClient().generic("POST", f"/api/v1/hooks/{trigger_id}/", raw,
                               content_type="application/json", HTTP_WEBHOOK_ID=delivery,
                               HTTP_WEBHOOK_TIMESTAMP=str(stamp),
                               HTTP_WEBHOOK_SIGNATURE=sign(secret, delivery, stamp, raw))


# --- self-approval through a trigger ----------------------------------------------------------


def test_an_editor_lead_who_sets_up_a_webhook_cannot_approve_the_run_it_starts(team, support):
    """The issue's first reproduction, step by step through the API: 200 and an e-mail sent
    before; now 403, the gate still waits, and another lead decides."""
    editor = member(team, "editor_lead", role=Role.EDITOR, groups=("support_leads",))
    other = member(team, "other_lead", role=Role.MEMBER, groups=("support_leads",))
    created = client_for(editor).post("/api/v1/triggers/", {
        "team": "support", "kind": "webhook", "name": "inbox", "workflow": "support-reply",
        "input_template": TEMPLATE}, format="json")
    assert created.status_code == 201, created.json()
    fired = deliver(created.json()["id"], created.json()["secret"], "d-1", TICKET)
    assert fired.status_code == 202, fired.json()
    run = work(Run.objects.get(pk=fired.json()["run"]))
    approval = ApprovalRequest.objects.get(run=run)

    response = client_for(editor).post(f"/api/v1/approvals/{approval.id}/approve/",
                                       {"proposal_hash": approval.proposal_hash}, format="json")

    assert response.status_code == 403, response.json()
    message = response.json()["errors"][0]["message"]
    assert "separation of duties" in message and "editor_lead (created the trigger)" in message
    assert ApprovalRequest.objects.get(pk=approval.pk).state == "pending"
    assert sent_emails(run) == []
    assert client_for(other).post(f"/api/v1/approvals/{approval.id}/approve/",
                                  {"proposal_hash": approval.proposal_hash},
                                  format="json").status_code == 200


def test_whoever_last_changed_a_trigger_or_rotated_its_secret_set_its_runs_in_motion(team, gated):
    creator = member(team, "creator", role=Role.EDITOR)
    changer = member(team, "changer", role=Role.EDITOR, groups=("support_leads",))
    trigger, _ = trigger_create(team=team, kind="webhook", name="hook", workflow="gated",
                                input_template={}, actor=creator)
    trigger_update(trigger_id=trigger.id, actor=changer, changes={"description": "tickets"})
    rotator = member(team, "rotator", role=Role.OWNER, groups=("support_leads",))
    _, secret = webhook_secret_rotate(trigger_id=trigger.id, actor=rotator)

    run = Run.objects.get(pk=deliver(trigger.id, secret, "d-1", {}).json()["run"])

    assert run.provenance == {
        "path": "webhook",
        "people": [{"user": creator.pk, "username": "creator", "as": "created the trigger"},
                   {"user": rotator.pk, "username": "rotator", "as": "last changed the trigger"}],
        "trigger": {"id": str(trigger.id), "name": "hook", "kind": "webhook", "revision": 3}}
    approval = ApprovalRequest.objects.get(run=run)
    assert client_for(rotator).post(f"/api/v1/approvals/{approval.id}/approve/", {
        "proposal_hash": approval.proposal_hash}, format="json").status_code == 403


def test_the_provenance_is_in_the_api_the_ledger_and_the_run_page(team, gated):
    owner = member(team, "owner", role=Role.OWNER, staff=True)
    started = client_for(owner).post("/api/v1/workflows/gated/runs/", {"input": {}}, format="json")
    run_id = started.json()["id"]

    listed = client_for(owner).get("/api/v1/runs/").json()["results"][0]
    detail = client_for(owner).get(f"/api/v1/runs/{run_id}/").json()
    seal_pending()
    created = AuditEntry.objects.get(action="run.created", run_id=run_id)
    from django.test import Client
    browser = Client()
    browser.force_login(owner)
    page = browser.get(f"/admin/orchestrator/run/{run_id}/live/").content.decode()

    people = [{"user": owner.pk, "username": "owner", "as": "started it"}]
    assert listed["provenance"]["people"] == detail["provenance"]["people"] == people
    assert detail["provenance"]["path"] == "api"
    assert detail["provenance"]["summary"] == "the API; set in motion by owner (started it)"
    assert json.loads(created.payload)["provenance"] == {"path": "api", "people": people}
    assert "Started by" in page and "set in motion by owner (started it)" in page
    assert listed["created_by"] == "owner"  # kept: the person who started it directly


# --- one cap, and a rate ---------------------------------------------------------------------


@pytest.mark.parametrize("cap", ["setting", "budget limit"])
def test_the_api_and_an_api_trigger_meet_the_same_cap(team, gated, settings, cap):
    """Before: the triggers' team quota (STEPWISE_TEAM_MAX_LIVE_RUNS, or a row of its own)
    answered 429 while the API's start answered 202. Now the team's budget limit sets the one
    cap, the setting being its default."""
    person = member(team, "starter", role=Role.MEMBER)
    trigger, _ = trigger_create(team=team, kind="api", name="prog", workflow="gated",
                                input_template={}, actor=SETUP)
    if cap == "setting":
        settings.STEPWISE_TEAM_MAX_LIVE_RUNS = 1
    else:
        budget_limit_create(team=team, actor=SETUP, max_concurrent_runs=1)
    assert client_for(person).post("/api/v1/workflows/gated/runs/", {"input": {}},
                                   format="json").status_code == 202

    by_api = client_for(person).post("/api/v1/workflows/gated/runs/", {"input": {}}, format="json")
    by_trigger = client_for(person).post(f"/api/v1/triggers/{trigger.id}/fire/", {}, format="json")

    assert by_api.status_code == by_trigger.status_code == 429
    assert by_api["Retry-After"] == by_trigger["Retry-After"] == "30"
    assert by_api.json() == by_trigger.json() == {"errors": [
        {"path": "", "message": "team 'support' has 1 unfinished runs; its limit is 1"}]}


def newest_entry() -> int:
    """The ledger's newest entry: a transactional test's entries stay in the ledger (append-only),
    so a test reads only the ones after it."""
    return AuditEntry.objects.aggregate(newest=Max("id"))["newest"] or 0


def test_a_flood_of_starts_is_refused_and_audited_once_per_window(team, gated, settings,
                                                                   monkeypatch):
    """One member started 818 runs in 90 s. Now past the rate each start is a 429, and the
    ledger has one entry per person and window, the next one counting the refusals."""
    before = newest_entry()
    settings.STEPWISE_RUN_START_RATES = {"run_start.person": "3/min", "run_start.token": "100/min"}
    minute = clock.now().replace(second=1, microsecond=0)  # an audit window's start
    monkeypatch.setattr(clock, "_source", lambda: minute)
    person = member(team, "flooder", role=Role.MEMBER)
    api = client_for(person)
    answers = [api.post("/api/v1/workflows/gated/runs/", {"input": {}}, format="json").status_code
               for _ in range(8)]
    monkeypatch.setattr(clock, "_source", lambda: minute + timedelta(seconds=61))
    later = [api.post("/api/v1/workflows/gated/runs/", {"input": {}}, format="json").status_code
             for _ in range(5)]

    assert answers == [202] * 3 + [429] * 5
    assert later == [202] * 3 + [429] * 2
    seal_pending()
    entries = [json.loads(e.payload) for e in AuditEntry.objects.filter(
        action="admission.refused", id__gt=before).order_by("id")]
    assert [e["limit"] for e in entries] == ["run_start.person", "run_start.person"]
    assert entries[0]["refused_in_previous_window"] == 0
    assert entries[1]["refused_in_previous_window"] == 5
    assert Run.objects.count() == 6


def test_a_token_is_rated_on_its_own(team, gated, settings):
    before = newest_entry()
    settings.STEPWISE_RUN_START_RATES = {"run_start.person": None, "run_start.token": "1/min"}
    person = member(team, "program", role=Role.MEMBER)
    api = client_for(person)
    assert api.post("/api/v1/workflows/gated/runs/", {"input": {}}, format="json").status_code == 202

    refused = api.post("/api/v1/workflows/gated/runs/", {"input": {}}, format="json")

    assert refused.status_code == 429 and refused["Retry-After"]
    assert refused.json()["errors"][0]["message"].startswith("this API token started 1 runs")
    seal_pending()
    entry = AuditEntry.objects.get(action="admission.refused", id__gt=before)
    assert entry.subject_id.startswith("token:") and api._credentials["HTTP_AUTHORIZATION"][6:] not in entry.payload


# --- a queued start and its person ------------------------------------------------------------


def test_a_queued_firing_of_a_person_removed_from_the_team_is_refused_when_admitted(
        team, gated, move_clock):
    person = member(team, "leaver", role=Role.MEMBER)
    trigger, _ = trigger_create(team=team, kind="api", name="prog", workflow="gated",
                                input_template={}, max_per_minute=1, when_limited="queue",
                                actor=SETUP)
    api = client_for(person)
    assert api.post(f"/api/v1/triggers/{trigger.id}/fire/", {}, format="json",
                    HTTP_IDEMPOTENCY_KEY="one").status_code == 202
    queued = api.post(f"/api/v1/triggers/{trigger.id}/fire/", {}, format="json",
                      HTTP_IDEMPOTENCY_KEY="two")
    assert queued.status_code == 202 and queued.json()["status"] == "queued"
    TeamMembership.objects.filter(team=team, user=person).delete()
    move_clock(61)

    assert queued_firings_admit() == 0

    firing = Firing.objects.get(key="request:two")
    assert firing.state == "refused" and firing.run is None
    assert "may no longer start runs in team 'support'" in firing.problems[0]["message"]
    assert Run.objects.count() == 1
    seal_pending()
    assert AuditEntry.objects.filter(action="trigger.refused", outcome="refused_at_admission").count() == 1
    again = client_for(member(team, "stayer", role=Role.MEMBER)).post(
        f"/api/v1/triggers/{trigger.id}/fire/", {}, format="json", HTTP_IDEMPOTENCY_KEY="two")
    assert again.status_code == 409  # the key stays refused, as recorded


def test_run_start_itself_refuses_a_person_without_run_start_in_the_team(team, gated, outsider):
    """Every entry point checks before it calls run_start; run_start must not depend on it."""
    with pytest.raises(Forbidden, match="may not run.start in team 'support'"):
        run_start(version=gated, input={}, actor=outsider)
    assert Run.objects.count() == 0
