"""Who sees what: team scoping of querysets and the approval decision check.

A user sees only objects of the teams they belong to (`Team.members`); staff and superusers
see everything. Objects outside that scope are filtered out of querysets, so a lookup of
one answers 404, never 403: the API does not reveal that it exists. Deciding an approval
is a further check (`MayDecide`), which answers 403 on an object the user can see.
"""
from django.db.models import QuerySet
from rest_framework.exceptions import ValidationError
from rest_framework.permissions import BasePermission

from approvals.services import user_may_decide

from ..models import Team
from ..services.deadletters import user_may_redrive
from .errors import error_body


def sees_everything(user) -> bool:
    return bool(user.is_staff or user.is_superuser)


def teams_of(user) -> QuerySet[Team]:
    """The teams whose objects `user` may see."""
    if sees_everything(user):
        return Team.objects.all()
    return Team.objects.filter(members=user)


def scoped(queryset: QuerySet, user, *, team_field: str = "team") -> QuerySet:
    """`queryset` restricted to objects whose `team_field` is one of the user's teams."""
    if not user.is_authenticated:  # also the OpenAPI generator's fake request
        return queryset.none()
    if sees_everything(user):
        return queryset
    return queryset.filter(**{f"{team_field}__members": user})


class MayDecide(BasePermission):
    """Only staff or members of the approval's approvers group (in the run's team) decide."""

    message = "You are not one of this request's approvers."

    def has_object_permission(self, request, view, obj) -> bool:
        return user_may_decide(request.user, obj)


def team_for_write(user, slug: str | None) -> Team:
    """The team a new workflow version is saved to.

    With `slug`, the user must belong to that team (staff: any team). Without it, the user
    must belong to exactly one team. Raises a 400 ValidationError explaining which applies.
    """
    if slug:
        team = teams_of(user).filter(slug=slug).first()
        if team is None:
            raise ValidationError(error_body(f"you are not a member of team '{slug}'", "team"))
        return team
    mine = list(Team.objects.filter(members=user).order_by("slug")[:10])
    if len(mine) == 1:
        return mine[0]
    if not mine:
        raise ValidationError(error_body("you are not a member of any team; pass 'team'", "team"))
    slugs = ", ".join(t.slug for t in mine)
    raise ValidationError(
        error_body(f"you belong to several teams ({slugs}); say which with 'team'", "team")
    )


class MayOperate(BasePermission):
    """Operator actions (redrive, retry, skip, resume): the redrive permission or superuser."""

    message = "operator actions need the orchestrator.redrive_deadletter permission"

    def has_permission(self, request, view) -> bool:
        return user_may_redrive(request.user)
