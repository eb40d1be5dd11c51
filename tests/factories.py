"""factory_boy factories and the named personas tests use instead of ad-hoc setup."""
from pathlib import Path

import factory
import yaml
from django.contrib.auth.models import Group, User

from orchestrator.engine.authz import System
from orchestrator.models import Role, Team, TeamMembership

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
# The actor for what a test sets up without a person behind it (saving a fixture workflow,
# starting a run the test then drives): the engine acting on its own.
SETUP = System("test-setup")


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = User
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.com")


class TeamFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Team
        django_get_or_create = ("slug",)

    slug = factory.Sequence(lambda n: f"team{n}")
    name = factory.LazyAttribute(lambda t: t.slug.title())


def example_definition(name: str) -> dict:
    """An example workflow from examples/<name>.yaml, as a dict."""
    return yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())


def member(team: Team, username: str, *, role: str = Role.EDITOR, groups: tuple[str, ...] = (),
           staff: bool = False) -> User:
    """A user with `role` in `team` (and in the named groups)."""
    user = UserFactory(username=username, is_staff=staff)
    TeamMembership.objects.update_or_create(team=team, user=user, defaults={"role": role})
    for name in groups:
        user.groups.add(Group.objects.get_or_create(name=name)[0])
    return user
