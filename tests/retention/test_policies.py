"""Owners set retention policies within the deployment's limits; owners and auditors place and
release legal holds; members, editors and operators may do neither, through the service or the
admin. Every change is in the ledger."""
import pytest
from django.core.exceptions import ValidationError

from audit.access import AUDITORS_GROUP
from orchestrator.engine.errors import Forbidden, NotAllowed
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Role
from retention.models import Kind, LegalHold, RetentionPolicy
from retention.services import (
    legal_hold_place,
    legal_hold_release,
    retention_policy_clear,
    retention_policy_set,
)
from tests.factories import SETUP, TeamFactory, example_definition, member
from tests.support.ledger import ledger_before, new_entries  # noqa: F401 (the autouse fixture)

pytestmark = pytest.mark.django_db


@pytest.fixture
def owner(team):
    return member(team, "owner", role=Role.OWNER, staff=True)


@pytest.fixture
def workflow(team):
    version, _ = workflow_save(team=team, definition=example_definition("support"), actor=SETUP)
    return version.workflow


@pytest.fixture
def limits(settings):
    settings.STEPWISE_RETENTION_LIMITS = {**settings.STEPWISE_RETENTION_LIMITS,
                                          "runs": {"min_days": 7, "max_days": 400}}


def test_an_owner_sets_a_team_and_a_workflow_policy_and_each_is_audited(team, owner, workflow):
    team_policy = retention_policy_set(team=team, kind=Kind.RUNS, days=30, actor=owner)
    wf_policy = retention_policy_set(team=team, workflow=workflow, kind=Kind.RUNS, days=90, actor=owner)
    again = retention_policy_set(team=team, kind=Kind.RUNS, days=45, actor=owner)

    assert again.pk == team_policy.pk and again.days == 45  # one policy per team and kind
    assert RetentionPolicy.objects.count() == 2 and wf_policy.workflow == workflow
    entries = new_entries().filter(action="retention.policy_set").order_by("id")
    assert [(e.actor, e.team, e.workflow) for e in entries] == [
        ("user:owner", team.slug, ""), ("user:owner", team.slug, workflow.name),
        ("user:owner", team.slug, "")]
    retention_policy_clear(policy=wf_policy, actor=owner)
    assert not RetentionPolicy.objects.filter(workflow=workflow).exists()
    assert new_entries().filter(action="retention.policy_cleared").count() == 1


@pytest.mark.parametrize(("kind", "days", "said"), [
    (Kind.RUNS, 3, "below this deployment's minimum for runs: 7 days"),
    (Kind.RUNS, 401, "above this deployment's maximum for runs: 400 days"),
    (Kind.LEDGER, 30, "below this deployment's minimum for ledger: 365 days"),
])
def test_a_policy_outside_the_deployment_limits_is_refused(team, owner, limits, kind, days, said):
    with pytest.raises(ValidationError) as refused:
        retention_policy_set(team=team, kind=kind, days=days, actor=owner)
    assert said in " ".join(refused.value.messages)
    assert not RetentionPolicy.objects.exists()
    assert not new_entries().filter(action="retention.policy_set").exists()


def test_a_per_team_kind_refuses_a_workflow_and_a_workflow_of_another_team_is_refused(team, owner, workflow):
    with pytest.raises(ValidationError, match="notifications are kept per team"):
        retention_policy_set(team=team, workflow=workflow, kind=Kind.NOTIFICATIONS, days=30, actor=owner)
    other = TeamFactory(slug="other")
    member(other, "owner", role=Role.OWNER)
    with pytest.raises(ValidationError, match="is not a workflow of team 'other'"):
        retention_policy_set(team=other, workflow=workflow, kind=Kind.RUNS, days=30, actor=owner)


@pytest.mark.parametrize("role", [Role.MEMBER, Role.EDITOR, Role.OPERATOR])
def test_a_member_editor_or_operator_may_neither_set_a_policy_nor_hold(team, role, owner):
    person = member(team, f"a-{role}", role=role)
    with pytest.raises(Forbidden):
        retention_policy_set(team=team, kind=Kind.RUNS, days=30, actor=person)
    with pytest.raises(Forbidden):
        legal_hold_place(team=team, reason="litigation", actor=person)
    hold = legal_hold_place(team=team, reason="litigation", actor=owner)
    with pytest.raises(Forbidden):
        legal_hold_release(hold=hold, reason="settled", actor=person)
    assert not RetentionPolicy.objects.exists() and LegalHold.objects.get().in_force


def test_an_owner_of_another_team_may_not_set_this_teams_policy(team):
    stranger = member(TeamFactory(slug="elsewhere"), "stranger", role=Role.OWNER)
    with pytest.raises(Forbidden):
        retention_policy_set(team=team, kind=Kind.RUNS, days=30, actor=stranger)


def test_an_auditor_places_and_releases_a_hold_with_reasons_and_both_are_audited(team):
    auditor = member(TeamFactory(slug="compliance"), "auditor", role=Role.MEMBER,
                     groups=(AUDITORS_GROUP,), staff=True)
    hold = legal_hold_place(team=team, reason="subpoena 2026-113", actor=auditor)
    with pytest.raises(ValidationError, match="needs a reason"):
        legal_hold_release(hold=hold, reason="  ", actor=auditor)
    released = legal_hold_release(hold=hold, reason="case closed", actor=auditor)
    assert not released.in_force and released.released_by == "user:auditor"
    with pytest.raises(NotAllowed):
        legal_hold_release(hold=hold, reason="again", actor=auditor)
    placed, ended = (new_entries().get(action=a) for a in
                     ("retention.hold_placed", "retention.hold_released"))
    assert (placed.team, ended.actor) == (team.slug, "user:auditor")
    assert "subpoena 2026-113" in placed.payload and "case closed" in ended.payload


def test_the_admin_refuses_a_policy_outside_the_limits_with_the_reason(client, team, owner, limits):
    client.force_login(owner)
    page = client.post("/admin/retention/retentionpolicy/add/",
                       {"team": team.pk, "kind": Kind.RUNS, "days": 3})
    assert page.status_code == 200  # the form again, with the error
    assert "below this deployment&#x27;s minimum for runs: 7 days" in page.content.decode()
    assert not RetentionPolicy.objects.exists()

    saved = client.post("/admin/retention/retentionpolicy/add/",
                        {"team": team.pk, "kind": Kind.RUNS, "days": 30})
    assert saved.status_code == 302 and RetentionPolicy.objects.get().days == 30
    assert new_entries().filter(action="retention.policy_set", actor="user:owner").exists()


def test_the_admin_offers_an_editor_no_policy_to_add(client, team):
    client.force_login(member(team, "editor", role=Role.EDITOR, staff=True))
    assert client.get("/admin/retention/retentionpolicy/add/").status_code == 403
    refused = client.post("/admin/retention/retentionpolicy/add/",
                          {"team": team.pk, "kind": Kind.RUNS, "days": 30})
    assert refused.status_code == 403 and not RetentionPolicy.objects.exists()
    assert client.get("/admin/retention/legalhold/add/").status_code == 403


def test_an_owner_holds_a_team_and_releases_it_in_the_admin(client, team, owner):
    client.force_login(owner)
    placed = client.post("/admin/retention/legalhold/add/", {"team": team.pk, "reason": "audit 7"})
    assert placed.status_code == 302
    hold = LegalHold.objects.get()
    assert hold.in_force and hold.run is None and hold.placed_by == "user:owner"
    released = client.post(f"/admin/retention/legalhold/{hold.pk}/change/", {"release_reason": "done"})
    assert released.status_code == 302
    hold.refresh_from_db()
    assert not hold.in_force and hold.release_reason == "done"
