"""Who may decide an approval request, which requests a person sees, and whether an approval
still holds — the one place these rules are written (docs/permissions.md#approvals).

* Deciding (approve, reject, edit the parameters, revoke) is for members of the request's
  current approvers group who belong to the run's team, in any role; a superuser may decide too.
  Being staff, an operator or an owner is not enough.
* Separation of duties: whoever set the run in motion (every person of its provenance:
  `orchestrator.engine.provenance`), or last edited the parameters, may not approve it — unless the
  gate relaxes that up to the request's tier (`self_approval_up_to`). It binds superusers like
  anyone.
* An approval holds while enough of its approvers still could approve (active, in the team, in
  the group they approved for); the guarded steps check it right before they run.

Reads only; raises `Forbidden`. The decision services
(`orchestrator.engine.services.kinds.human_gate`) and the admin's and API's scoping call it.
"""
from django.contrib.auth import get_user_model
from django.db.models import Q, QuerySet

from orchestrator.engine.authz import Actor, System, role_in, teams_visible_to, visible
from orchestrator.engine.errors import Forbidden
from orchestrator.engine.provenance import describe, people_ids
from orchestrator.engine.risk import RANK
from orchestrator.engine.selectors import spec_of
from orchestrator.engine.states import RunState, StepKind, StepState
from orchestrator.models import StepRun

from .models import ApprovalDecision, ApprovalRequest, ApprovalState, InputState, InputTask, Verdict


def _is_person(user: Actor) -> bool:
    return not isinstance(user, System) and user.is_authenticated and user.is_active


def in_group(user, group: str) -> bool:
    return user.groups.filter(name=group).exists()


def may_decide(user: Actor, approval: ApprovalRequest) -> bool:
    """A member of the current approvers group in the run's team, or a superuser."""
    if not _is_person(user):
        return False
    if user.is_superuser:
        return True
    return role_in(user, approval.run.team) is not None and in_group(user, approval.approvers)


def require_decider(user: Actor, approval: ApprovalRequest) -> None:
    """Raise Forbidden unless `user` may decide `approval`."""
    if not may_decide(user, approval):
        raise Forbidden(f"you are not one of this request's approvers (group {approval.approvers} "
                        f"in team {approval.run.team.slug})")


def self_approval_allowed(approval: ApprovalRequest) -> bool:
    """Whether the gate relaxes separation of duties at the request's tier."""
    relaxed = approval.self_approval_up_to
    return bool(relaxed) and RANK[approval.risk_tier] <= RANK[relaxed]


def require_separation(user: Actor, approval: ApprovalRequest) -> None:
    """Raise Forbidden if `user` set the run in motion — started it, or is one of the people
    of its provenance (who fired, created or last changed the trigger that started it, or set
    its parent in motion) — or last edited the parameters (and the gate does not relax that at
    this tier)."""
    if self_approval_allowed(approval):
        return
    run = approval.run
    if run.created_by_id == user.pk or user.pk in people_ids(run.provenance):
        how = describe(run.provenance)
        raise Forbidden(f"you started this run or set it in motion{f' ({how})' if how else ''}, "
                        "so someone else must approve it (separation of duties)")
    if approval.edited_by_id == user.pk:
        raise Forbidden("you edited these parameters, so someone else must approve them "
                        "(separation of duties)")


def approvers_of(approval: ApprovalRequest) -> QuerySet[ApprovalDecision]:
    """The approve decisions that count: on the current hash."""
    return approval.decisions.filter(verdict=Verdict.APPROVE, proposal_hash=approval.proposal_hash)


def group_at(approval: ApprovalRequest, level: int) -> str:
    """The approvers group of escalation tier `level` (0: the gate's own)."""
    tiers = approval_tiers(approval)
    return tiers[min(level, len(tiers) - 1)]["approvers"]


def approval_tiers(approval: ApprovalRequest) -> list[dict]:
    """[{approvers, timeout_s}, ...]: the gate's own group, then its escalation tiers."""
    spec = spec_of(approval.run, approval.step.name)
    return [{"approvers": spec["approvers"], "timeout_s": spec["timeout_s"]},
            *spec.get("escalation", [])]


def approval_lapse(approval: ApprovalRequest) -> str | None:
    """Why an approved request no longer authorizes its action, or None while it holds."""
    if approval.state != ApprovalState.APPROVED:
        return f"approval {approval.id} is {approval.state}"
    holding = 0
    for decision in approvers_of(approval).select_related("user"):
        user = decision.user
        if user is None or not user.is_active:
            continue
        if user.is_superuser or (role_in(user, approval.run.team) is not None
                                 and in_group(user, group_at(approval, decision.escalation_level))):
            holding += 1
    if holding < approval.approvals_required:
        return (f"approval {approval.id}: {holding} of its {approval.approvals_required} "
                "approver(s) may still approve")
    return None


def deciders(approval: ApprovalRequest) -> QuerySet:
    """Who is told a request waits for them: the current group's members in the run's team."""
    return (get_user_model().objects.filter(
        is_active=True, groups__name=approval.approvers,
        team_memberships__team_id=approval.run.team_id).exclude(email="").distinct()
        .order_by("username"))


# --- what a person sees -------------------------------------------------------------------------


def requests_visible_to(user: Actor, queryset: QuerySet[ApprovalRequest]
                        ) -> QuerySet[ApprovalRequest]:
    """`queryset` narrowed to the requests a person sees in the admin: a superuser all; anyone
    else the requests of their teams that wait for (or waited for) one of their groups, or that
    they acted on."""
    if isinstance(user, System) or (user.is_authenticated and user.is_superuser):
        return queryset
    scoped = visible(queryset, user, team_field="run__team")
    if not _is_person(user):
        return scoped
    groups = list(user.groups.values_list("name", flat=True))
    acted = ApprovalDecision.objects.filter(user=user).values("request_id")
    return scoped.filter(Q(approvers__in=groups) | Q(id__in=acted)).distinct()


def inbox(user: Actor) -> QuerySet[ApprovalRequest]:
    """Pending requests waiting for one of `user`'s groups, in their teams (superusers: in any
    team): what the header and the admin home count."""
    if not _is_person(user):
        return ApprovalRequest.objects.none()
    groups = list(user.groups.values_list("name", flat=True))
    pending = ApprovalRequest.objects.filter(state=ApprovalState.PENDING, approvers__in=groups)
    if user.is_superuser:
        return pending
    return pending.filter(run__team__in=teams_visible_to(user))


# How many not-yet-reached gates `on_the_way` looks at: enough for a home page's count.
ON_THE_WAY_LIMIT = 200


def on_the_way(user: Actor) -> int:
    """How many gates for one of `user`'s groups, in their teams, belong to a running run that
    has not reached them yet: a run just started shows here until its gate opens a request
    (and the inbox counts it), so "nothing waits" is never said of work about to wait."""
    if not _is_person(user):
        return 0
    groups = set(user.groups.values_list("name", flat=True))
    if not groups:
        return 0
    # A sandboxed run's gates never wait for anyone (orchestrator/engine/sandbox.py).
    gates = (StepRun.objects.filter(kind=StepKind.HUMAN_GATE, run__state=RunState.RUNNING,
                                    run__sandbox__isnull=True,
                                    state__in=[StepState.BLOCKED, StepState.READY, StepState.QUEUED])
             .select_related("run__version").order_by("-id"))
    if not user.is_superuser:
        gates = gates.filter(run__team__in=teams_visible_to(user))
    return sum(1 for gate in gates[:ON_THE_WAY_LIMIT]
               if spec_of(gate.run, gate.name).get("approvers") in groups)


def is_reviewer(user: Actor) -> bool:
    """A person who may open the admin to decide or answer: in a team and in a group, or the
    assignee of an open input task (staff or not)."""
    return (_is_person(user) and teams_visible_to(user).exists()
            and (user.groups.exists() or InputTask.objects.filter(
                state=InputState.OPEN, assignee=user.get_username()).exists()))


# --- input tasks (human_input steps) --------------------------------------------------------------


def may_answer(user: Actor, task: InputTask) -> bool:
    """The task's assignee while it has one, else a member of its current group, in the run's
    team; or a superuser."""
    if not _is_person(user):
        return False
    if user.is_superuser:
        return True
    if role_in(user, task.run.team) is None:
        return False
    if task.assignee:
        return user.get_username() == task.assignee
    return in_group(user, task.group)


def require_answerer(user: Actor, task: InputTask) -> None:
    """Raise Forbidden unless `user` may answer `task`."""
    if may_answer(user, task):
        return
    if task.assignee:
        raise Forbidden(f"this task is assigned to {task.assignee}; only they may answer it")
    raise Forbidden(f"you are not in the group that answers this task ({task.group} in team "
                    f"{task.run.team.slug})")


def require_input_separation(user: Actor, task: InputTask) -> None:
    """Raise Forbidden if the step asks for separation of duties and `user` set the run in
    motion (started it, or is one of the people of its provenance). It binds superusers too."""
    if not task.separation_of_duties:
        return
    run = task.run
    if run.created_by_id == user.pk or user.pk in people_ids(run.provenance):
        how = describe(run.provenance)
        raise Forbidden(f"you started this run or set it in motion{f' ({how})' if how else ''}, "
                        "so someone else must answer (separation of duties)")


def input_tasks_visible_to(user: Actor, queryset: QuerySet[InputTask]) -> QuerySet[InputTask]:
    """`queryset` narrowed to the tasks a person sees: a superuser all; anyone else the tasks of
    their teams for one of their groups, assigned to them, or answered by them."""
    if isinstance(user, System) or (user.is_authenticated and user.is_superuser):
        return queryset
    scoped = visible(queryset, user, team_field="run__team")
    if not _is_person(user):
        return scoped
    groups = list(user.groups.values_list("name", flat=True))
    return scoped.filter(Q(group__in=groups) | Q(assignee=user.get_username())
                         | Q(answered_by=user)).distinct()


def input_inbox(user: Actor) -> QuerySet[InputTask]:
    """Open tasks `user` may answer, in their teams (superusers: those of their groups in any
    team): what the inbox lists and the header counts."""
    if not _is_person(user):
        return InputTask.objects.none()
    groups = list(user.groups.values_list("name", flat=True))
    mine = Q(assignee=user.get_username()) | (Q(assignee="") & Q(group__in=groups))
    open_tasks = InputTask.objects.filter(mine, state=InputState.OPEN)
    if user.is_superuser:
        return open_tasks
    return open_tasks.filter(run__team__in=teams_visible_to(user))


def answerers(task: InputTask) -> QuerySet:
    """Who is told a task waits for them: its assignee, else its group's members in the team."""
    people = get_user_model().objects.filter(
        is_active=True, team_memberships__team_id=task.run.team_id).exclude(email="")
    if task.assignee:
        people = people.filter(username=task.assignee)
    else:
        people = people.filter(groups__name=task.group)
    return people.distinct().order_by("username")
