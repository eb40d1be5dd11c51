"""Which team a new workflow version is saved to, when the request does not say.

Scoping what a caller sees is `authz.visible`; whether the caller may save there is the
service's check (`workflow_save`). Nothing here grants anything.
"""
from rest_framework.exceptions import ValidationError

from orchestrator.engine.authz import teams_visible_to
from orchestrator.models import Team, Workflow

from .errors import error_body


def team_for_write(user, slug: str | None) -> Team:
    """The team a new workflow version is saved to.

    With `slug`, the user must see that team. Without it, the user must belong to exactly one
    team. Raises a 400 ValidationError explaining which applies.
    """
    if slug:
        team = teams_visible_to(user).filter(slug=slug).first()
        if team is None:
            raise ValidationError(error_body(f"you are not a member of team '{slug}'", "team"))
        return team
    mine = list(Team.objects.filter(memberships__user=user).order_by("slug")[:10])
    if len(mine) == 1:
        return mine[0]
    if not mine:
        raise ValidationError(error_body("you are not a member of any team; pass 'team'", "team"))
    slugs = ", ".join(t.slug for t in mine)
    raise ValidationError(
        error_body(f"you belong to several teams ({slugs}); say which with 'team'", "team")
    )


def team_and_workflow_for_write(user, body: dict) -> tuple[Team, Workflow | None]:
    """Pop `team` and `workflow` (a name, optional) from a create body: the team as
    `team_for_write` finds it, and that team's workflow of that name, or None when none is named.
    Raises a 400 ValidationError for a workflow the team does not have."""
    team = team_for_write(user, body.pop("team", None))
    name = body.pop("workflow", None)
    if not name:
        return team, None
    workflow = Workflow.objects.filter(team=team, name=name).first()
    if workflow is None:
        raise ValidationError(error_body(f"team '{team.slug}' has no workflow '{name}'", "workflow"))
    return team, workflow
