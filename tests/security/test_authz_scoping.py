"""Which teams a person acts in (`authz.teams_where`) and sees (`authz.visible`), who may act at
all (`authz.may`: never a deactivated person) and how a refusal names them: from the survivors
of `make mutate` over orchestrator/engine/authz.py. The admin's forms and lists are built from
these, so a wrong scope shows another team's objects or a form the person may not use."""
import pytest
from django.contrib.auth.models import AnonymousUser

from orchestrator.engine.authz import (
    Action,
    System,
    operates_somewhere,
    teams_visible_to,
    teams_where,
    visible,
)
from orchestrator.engine.errors import Forbidden
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Role, Run, Workflow
from tests.factories import SETUP, TeamFactory, UserFactory, member
from tests.test_permissions import admin_client

pytestmark = pytest.mark.django_db


@pytest.fixture
def teams(team):
    other = TeamFactory(slug="other", name="Other")
    return team, other


def echo_version(team):
    version, _ = workflow_save(team=team, actor=SETUP, definition={
        "name": "echo", "input_schema": {"type": "object"},
        "steps": [{"name": "call", "type": "tool", "tool": "core.echo"}]})
    return version


def test_teams_where_is_the_teams_of_a_role_that_grants_the_action(teams):
    team, other = teams
    owner = member(team, "owner", role=Role.OWNER)
    member(other, "owner", role=Role.EDITOR)  # an editor elsewhere: not a policy setter there
    editor = member(team, "editor", role=Role.EDITOR)
    assert list(teams_where(owner, Action.WORKFLOW_POLICY)) == [team]
    assert list(teams_where(editor, Action.WORKFLOW_POLICY)) == []
    assert list(teams_where(editor, Action.WORKFLOW_SAVE)) == [team]


def test_an_inactive_person_acts_and_sees_in_no_team(teams):
    team, _ = teams
    owner = member(team, "owner", role=Role.OWNER)
    owner.is_active = False
    owner.save()
    Workflow.objects.create(team=team, name="reply")
    assert not teams_where(owner, Action.WORKFLOW_POLICY).exists()
    assert not visible(Workflow.objects.all(), owner).exists()
    assert not teams_visible_to(owner).exists()
    owner.is_active = True
    owner.save()
    assert visible(Workflow.objects.all(), owner).count() == 1


def test_the_gate_policy_form_offers_only_the_teams_one_owns(teams):
    team, other = teams
    owner = member(team, "owner", role=Role.OWNER, staff=True)
    member(other, "owner", role=Role.EDITOR)
    editor = member(team, "editor", role=Role.EDITOR, staff=True)
    assert admin_client(editor).get("/admin/orchestrator/gatepolicy/add/").status_code == 403
    page = admin_client(owner).get("/admin/orchestrator/gatepolicy/add/")
    assert page.status_code == 200
    choices = [team_id for team_id, _ in page.context["adminform"].form.fields["team"].choices if team_id]
    assert [int(str(c)) for c in choices] == [team.id]


def test_a_deactivated_owner_may_no_longer_start_a_run(teams):
    # The API and the admin sign no inactive person in; a service acting for one (a queued
    # firing, a session that outlived the account) refuses them itself.
    team, _ = teams
    owner = member(team, "owner", role=Role.OWNER)
    version = echo_version(team)
    owner.is_active = False
    owner.save()

    with pytest.raises(Forbidden, match="user:owner may not run.start in team 'support'"):
        run_start(version=version, input={}, actor=owner)
    assert not Run.objects.exists()


def test_a_refusal_names_who_was_refused(teams):
    team, _ = teams
    version = echo_version(team)
    outsider = member(TeamFactory(slug="elsewhere"), "outsider", role=Role.OWNER)

    for actor, message in ((outsider, "user:outsider may not run.start in team 'support'"),
                           (AnonymousUser(), "an anonymous user may not run.start in team 'support'")):
        with pytest.raises(Forbidden) as refused:
            run_start(version=version, input={}, actor=actor)
        assert str(refused.value) == f"{message} (docs/permissions.md)"


def test_only_an_active_operator_or_superuser_operates_somewhere(teams):
    team, _ = teams
    operator = member(team, "operator", role=Role.OPERATOR)
    root = UserFactory(username="root", is_superuser=True)
    assert operates_somewhere(operator) and operates_somewhere(root)
    assert not operates_somewhere(member(team, "editor", role=Role.EDITOR))
    for user in (operator, root):
        user.is_active = False
        user.save()

    for nobody in (operator, root, AnonymousUser(), System("reaper")):
        assert not operates_somewhere(nobody), nobody
