"""The API's per-request reads, compiled (`orchestrator.store`), give what the ORM gives.

The token and its user (`CompiledTokenAuthentication`), a person's role in a team
(`authz.role_in`) and the workflow a run is started from (`authz.visible_workflows_named`)
are read at every request; each is compared here with the queryset it replaces, for every
kind of person the rules tell apart.
"""
import pytest
from django.contrib.auth.models import AnonymousUser
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from orchestrator.engine.authz import System, role_in, visible, visible_workflows_named
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Role, TeamMembership, Workflow
from tests.factories import SETUP, TeamFactory, UserFactory, example_definition, member

pytestmark = pytest.mark.django_db


def the_orms(user, name, team_slug=None) -> list[Workflow]:
    workflows = visible(Workflow.objects.select_related("team", "active_version"), user)
    if team_slug is not None:
        workflows = workflows.filter(team__slug=team_slug)
    return list(workflows.filter(name=name).order_by("name", "team__slug")[:10])


@pytest.fixture
def shared_name(team):
    """Two teams with a workflow of the same name; a member of one, of both, and of neither."""
    other = TeamFactory(slug="billing")
    definition = example_definition("lead-routing")
    for owner in (team, other):
        workflow_save(team=owner, definition=definition, actor=SETUP)
    both = member(team, "both")
    TeamMembership.objects.create(team=other, user=both, role=Role.MEMBER)
    return definition["name"], {
        "one team": member(team, "one"),
        "both teams": both,
        "no team": UserFactory(username="nobody"),
        "superuser": UserFactory(username="root", is_superuser=True),
        "inactive member": member(team, "gone"),
        "anonymous": AnonymousUser(),
        "the engine": System("test"),
    }


@pytest.mark.parametrize("team_slug", [None, "support", "billing", "elsewhere"])
def test_the_workflows_a_person_may_start_are_the_visible_querysets(shared_name, team_slug):
    name, people = shared_name
    people["inactive member"].is_active = False
    people["inactive member"].save()
    for who, user in people.items():
        for asked in (name, "missing"):
            ours = visible_workflows_named(user, asked, team_slug=team_slug)
            theirs = the_orms(user, asked, team_slug)
            assert [(w.pk, w.team.slug, w.active_version_id) for w in ours] == \
                   [(w.pk, w.team.slug, w.active_version_id) for w in theirs], (who, asked)
            if ours:
                assert ours[0].active_version.number == theirs[0].active_version.number


def test_a_persons_role_is_the_memberships(shared_name, team):
    _, people = shared_name
    for who, user in people.items():
        expected = (TeamMembership.objects.filter(team=team, user=user).values_list("role", flat=True).first()
                    if getattr(user, "pk", None) and not isinstance(user, System) else None)
        assert role_in(user, team) == expected, who


def test_a_token_authenticates_its_user_and_a_wrong_or_inactive_one_is_refused(requester):
    client = APIClient()
    token = Token.objects.create(user=requester)

    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    assert client.get("/api/v1/workflows/").status_code == 200

    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key[:-1]}x")
    refused = client.get("/api/v1/workflows/")
    assert refused.status_code == 401
    assert "Invalid token." in refused.content.decode()

    requester.is_active = False
    requester.save()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    refused = client.get("/api/v1/workflows/")
    assert refused.status_code == 401
    assert "User inactive or deleted." in refused.content.decode()
