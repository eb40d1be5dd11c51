"""Which teams a person acts in (`authz.teams_where`) and sees (`authz.visible`): from the
survivors of `make mutate` over orchestrator/authz.py. The admin's forms and lists are built
from these, so a wrong scope shows another team's objects or a form the person may not use."""
import pytest

from orchestrator.authz import Action, teams_where, visible
from orchestrator.models import Role, Workflow
from tests.factories import TeamFactory, member
from tests.test_permissions import admin_client

pytestmark = pytest.mark.django_db


@pytest.fixture
def teams(team):
    other = TeamFactory(slug="other", name="Other")
    return team, other


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
