"""Who may do what: the one place the permission rules of Stepwise are written.

Services call `require(actor, action, team=...)` before they change state for a person, and
entry points (API views, admin screens, websocket consumers) use `visible(...)` to scope what a
person sees; none of them writes a rule of its own, so they can never disagree. The matrix is
docs/permissions.md; tests/test_permissions.py checks it through the API and the admin.

Rules:
- a person acts in a team through a membership whose role grants actions (`GRANTS`); being
  staff grants nothing by itself (it only opens the admin), a superuser may do everything;
- whoever started a run may cancel it, whatever their role;
- deciding an approval is a matter of the approvers group as well (`approvals.authority`);
- the engine's own actors (`System`: the scheduler, the reaper, ...) act on every team.

Reads only; raises `Forbidden`. Imports models, never services.
"""
from dataclasses import dataclass
from enum import StrEnum

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import QuerySet

from orchestrator.models import Role, Run, Team, TeamMembership, Workflow
from orchestrator.store import Read

from .errors import Forbidden


class Action(StrEnum):
    VIEW = "view"  # the team's workflows, runs, approvals and dead letters
    WORKFLOW_SAVE = "workflow.save"
    WORKFLOW_PUBLISH = "workflow.publish"  # make a version the one runs and triggers start
    WORKFLOW_ARCHIVE = "workflow.archive"  # archive (no new runs) or restore a workflow
    # Publish a version that drops or weakens a mandatory gate (definitions/mandatory_gates.py).
    WORKFLOW_WAIVE_GATE = "workflow.waive_gate"
    # Whether saving a version publishes it; the mandatory gate policies (services/gate_policies).
    WORKFLOW_POLICY = "workflow.policy"
    RUN_START = "run.start"
    RUN_CANCEL = "run.cancel"
    RUN_SIGNAL = "run.signal"  # send a signal a wait step of the run waits for
    RUN_RESUME = "run.resume"
    # Move unfinished runs to another version of their workflow (services/moves.py).
    RUN_MOVE = "run.move"
    STEP_RETRY = "step.retry"
    STEP_SKIP = "step.skip"
    DEAD_LETTER_REDRIVE = "dead_letter.redrive"
    TRIGGER_MANAGE = "trigger.manage"  # create, change, enable, disable; rotate a webhook secret
    ALERT_HANDLE = "alert.handle"  # acknowledge or resolve an alert (alerts/)
    BUDGET_RAISE = "budget.raise"  # raise one run's cost limit (an override on the run)
    BUDGET_MANAGE = "budget.manage"  # set the team's and its workflows' budget limits
    # Create a workflow's evaluation datasets and add, replace or remove their cases (evaluation/).
    DATASET_EDIT = "dataset.edit"
    # Add a finished run, its outcome corrected, to a dataset as a case.
    DATASET_ADD_RUN = "dataset.add_run"
    # Start or cancel an evaluation of a version over a dataset (sandboxed runs that cost money).
    EVALUATION_RUN = "evaluation.run"
    # Set or clear how long the team's rows are kept (retention/); owners only.
    RETENTION_MANAGE = "retention.manage"
    # Place or release a legal hold on a run or the team (retention/); owners (and auditors).
    LEGAL_HOLD = "legal_hold.manage"


_OPERATE = {Action.RUN_CANCEL, Action.RUN_RESUME, Action.RUN_MOVE, Action.STEP_RETRY,
            Action.STEP_SKIP, Action.DEAD_LETTER_REDRIVE, Action.ALERT_HANDLE, Action.BUDGET_RAISE,
            Action.DATASET_ADD_RUN}
GRANTS: dict[str, frozenset[Action]] = {
    Role.MEMBER: frozenset({Action.VIEW, Action.RUN_START, Action.RUN_SIGNAL}),
    Role.EDITOR: frozenset({Action.VIEW, Action.RUN_START, Action.RUN_SIGNAL, Action.WORKFLOW_SAVE,
                            Action.WORKFLOW_PUBLISH, Action.WORKFLOW_ARCHIVE,
                            Action.TRIGGER_MANAGE, Action.DATASET_EDIT, Action.DATASET_ADD_RUN,
                            Action.EVALUATION_RUN}),
    Role.OPERATOR: frozenset({Action.VIEW, Action.RUN_START, Action.RUN_SIGNAL, *_OPERATE}),
    Role.OWNER: frozenset(Action),
}


@dataclass(frozen=True)
class System:
    """The engine acting by itself (no person): `System("reaper")` is "service:reaper", a
    worker process `System("host:42", kind="worker")` is "worker:host:42"."""

    name: str
    kind: str = "service"

    def __str__(self) -> str:
        return f"{self.kind}:{self.name}"


def worker_actor(worker: str) -> "System":
    return System(worker, kind="worker")


Actor = AbstractBaseUser | AnonymousUser | System
SCHEDULER = System("scheduler")
REAPER = System("reaper")
# Decides a sandboxed run's gates and answers its inputs (orchestrator/engine/sandbox.py):
# never a person.
SANDBOX = System("evaluation")


def label(actor: Actor) -> str:
    """How the ledger and the events name an actor: "user:<username>" or "service:<name>"."""
    if isinstance(actor, System):
        return str(actor)
    return f"user:{actor.get_username()}"


def is_person(actor: Actor) -> bool:
    return not isinstance(actor, System)


def person(actor: Actor):
    """The user behind `actor` (to store as who did it), or None for the engine."""
    return None if isinstance(actor, System) else actor


def role_in(user: Actor, team: Team) -> str | None:
    """The user's role in `team`, or None for a non-member."""
    if isinstance(user, System) or not user.is_authenticated:
        return None
    found = _ROLE.rows(team.pk, user.pk)
    return found[0].role if found else None


# Read at every check of a person's permission (each API request): defined once, so the fast
# store compiles it once per connection.
_ROLE = Read(lambda team_id, user_id: TeamMembership.objects.only("role").filter(
    team_id=team_id, user_id=user_id)[:1], 0, 0)


def may(actor: Actor, action: Action, *, team: Team, run: Run | None = None) -> bool:
    """Whether `actor` may perform `action` on an object of `team` (`run`: the run acted on)."""
    if isinstance(actor, System):
        return True
    if not actor.is_authenticated or not actor.is_active:
        return False
    if actor.is_superuser:
        return True
    role = role_in(actor, team)
    if role is None:
        return False
    if action == Action.RUN_CANCEL and run is not None and run.created_by_id == actor.pk:
        return True
    return action in GRANTS[role]


def require(actor: Actor, action: Action, *, team: Team, run: Run | None = None) -> None:
    """Raise Forbidden unless `may(actor, action, team=team, run=run)`."""
    if not may(actor, action, team=team, run=run):
        # `may` refuses only people (never the engine): a person signed in, or anonymous.
        who = label(actor) if actor.is_authenticated else "an anonymous user"
        raise Forbidden(f"{who} may not {action.value} in team '{team.slug}' (docs/permissions.md)")


def teams_visible_to(user: Actor) -> QuerySet[Team]:
    """The teams whose objects `user` may see."""
    if isinstance(user, System) or (user.is_authenticated and user.is_superuser):
        return Team.objects.all()
    if not user.is_authenticated or not user.is_active:
        return Team.objects.none()
    return Team.objects.filter(memberships__user=user)


def teams_where(user: Actor, action: Action) -> QuerySet[Team]:
    """The teams in which `user` may perform `action` by role (not counting own runs)."""
    if isinstance(user, System) or (user.is_authenticated and user.is_superuser):
        return Team.objects.all()
    if not user.is_authenticated or not user.is_active:
        return Team.objects.none()
    roles = [role for role, actions in GRANTS.items() if action in actions]
    return Team.objects.filter(memberships__user=user, memberships__role__in=roles)


def operates_somewhere(user: Actor) -> bool:
    """An operator (or owner) of some team, or a superuser: who may see the deployment's
    health details and operations pages."""
    if isinstance(user, System) or not user.is_authenticated or not user.is_active:
        return False
    return user.is_superuser or teams_where(user, Action.DEAD_LETTER_REDRIVE).exists()


def visible(queryset: QuerySet, user: Actor, *, team_field: str = "team") -> QuerySet:
    """`queryset` restricted to objects whose `team_field` is a team `user` may see."""
    if isinstance(user, System) or (user.is_authenticated and user.is_superuser):
        return queryset
    if not user.is_authenticated or not user.is_active:  # also the OpenAPI generator's request
        return queryset.none()
    return queryset.filter(**{f"{team_field}__memberships__user": user})


def visible_workflows_named(user: Actor, name: str, *, team_slug: str | None = None) -> list[Workflow]:
    """`visible(Workflow.objects...)` named `name` (in team `team_slug` when given), each with
    its team and published version, in name and team order, at most 10: the lookup of every
    run started through the API, compiled once per connection (`compiled`) under the same
    rule as `visible`."""
    if isinstance(user, System) or (user.is_authenticated and user.is_superuser):
        member = []
    elif not user.is_authenticated or not user.is_active:
        return []
    else:
        member = [user.pk]
    team = [] if team_slug is None else [team_slug]
    return _WORKFLOWS_NAMED[bool(member), bool(team)].rows(*member, *team, name)


def _workflows_named(member: bool, team: bool) -> Read:
    def build(*values) -> QuerySet[Workflow]:
        given = iter(values)
        workflows = Workflow.objects.select_related("team", "active_version")
        if member:
            workflows = workflows.filter(team__memberships__user_id=next(given))
        if team:
            workflows = workflows.filter(team__slug=next(given))
        return workflows.filter(name=next(given)).order_by("name", "team__slug")[:10]

    return Read(build, *([0] if member else []), *([""] if team else []), "")


_WORKFLOWS_NAMED = {(member, team): _workflows_named(member, team)
                    for member in (False, True) for team in (False, True)}


def visible_listed(queryset: QuerySet, user: Actor, *, team_field: str = "team") -> QuerySet:
    """`visible`, for a list read a page at a time: the user's teams are read first and the rows
    filtered by those ids, so the planner knows the teams and reads a page along the list's
    index, rather than joining every row of the teams from the memberships and sorting them."""
    if isinstance(user, System) or (user.is_authenticated and user.is_superuser):
        return queryset
    if not user.is_authenticated or not user.is_active:
        return queryset.none()
    teams = list(TeamMembership.objects.filter(user=user).values_list("team_id", flat=True))
    return queryset.filter(**{f"{team_field}__in": teams})
