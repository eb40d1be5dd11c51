"""factory_boy factories and the named personas tests use instead of ad-hoc setup."""
from pathlib import Path

import factory
import yaml
from django.contrib.auth.models import Group, User

from orchestrator.models import Team

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


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


def member(team: Team, username: str, *, groups: tuple[str, ...] = (), staff: bool = False) -> User:
    user = UserFactory(username=username, is_staff=staff)
    team.members.add(user)
    for name in groups:
        user.groups.add(Group.objects.get_or_create(name=name)[0])
    return user
