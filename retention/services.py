"""Setting retention policies and placing or releasing legal holds: one service per change,
each checking the permission (owners; auditors may also hold and release) and the deployment's
limits, and recording the change in the audit ledger in its transaction.

The sweeps that apply the policies are `retention.sweep` (rows) and `retention.artifacts`
(unreferenced artifacts).
"""
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction

from audit.access import can_read_ledger
from audit.models import SubjectType
from audit.services import audit_record
from orchestrator.engine.authz import Action, Actor, label, may, require
from orchestrator.engine.clock import now
from orchestrator.engine.errors import NotAllowed
from orchestrator.models import Run, Team, Workflow

from .models import PER_WORKFLOW, Kind, LegalHold, RetentionPolicy


def limits_of(kind: str) -> tuple[int, int | None]:
    """(min_days, max_days or None) the deployment allows a policy of `kind`
    (`STEPWISE_RETENTION_LIMITS`)."""
    limits = settings.STEPWISE_RETENTION_LIMITS.get(kind, {})
    return int(limits.get("min_days", 1)), limits.get("max_days")


def policy_problems(*, kind: str, days: int, workflow: Workflow | None) -> list[str]:
    """Why a policy of `days` for `kind` (and `workflow`) is refused; empty when it is not."""
    if kind not in Kind.values:
        return [f"'{kind}' is not a kind of row retention applies to ({', '.join(Kind.values)})"]
    problems = []
    low, high = limits_of(kind)
    if days < low:
        problems.append(f"{days} days is below this deployment's minimum for {kind}: {low} days "
                        "(STEPWISE_RETENTION_LIMITS)")
    if high is not None and days > int(high):
        problems.append(f"{days} days is above this deployment's maximum for {kind}: {high} days "
                        "(STEPWISE_RETENTION_LIMITS)")
    if workflow is not None and kind not in PER_WORKFLOW:
        problems.append(f"{kind} are kept per team, not per workflow")
    return problems


def retention_policy_set(*, team: Team, kind: str, days: int, actor: Actor,
                         workflow: Workflow | None = None) -> RetentionPolicy:
    """Keep `team`'s rows of `kind` (only `workflow`'s, with one) for `days` after they ended,
    replacing the policy in force. Raises Forbidden (not an owner), ValidationError (outside the
    deployment's limits, or a workflow of another team)."""
    require(actor, Action.RETENTION_MANAGE, team=team)
    problems = policy_problems(kind=kind, days=days, workflow=workflow)
    if workflow is not None and workflow.team_id != team.pk:
        problems.append(f"workflow '{workflow.name}' is not a workflow of team '{team.slug}'")
    if problems:
        raise ValidationError(problems)
    with transaction.atomic():
        policy, _ = RetentionPolicy.objects.update_or_create(
            team=team, workflow=workflow, kind=kind,
            defaults={"days": days, "updated_at": now(),
                      "updated_by": actor if getattr(actor, "pk", None) else None})
        audit_record(action="retention.policy_set", actor=label(actor), subject_type=SubjectType.WORKFLOW
                     if workflow else "team", subject_id=workflow.pk if workflow else team.slug,
                     team=team.slug, workflow=workflow.name if workflow else "",
                     payload={"kind": kind, "days": days})
    return policy


def retention_policy_clear(*, policy: RetentionPolicy, actor: Actor) -> None:
    """Remove a policy: the team's (or the deployment's default) applies again. Raises Forbidden."""
    require(actor, Action.RETENTION_MANAGE, team=policy.team)
    with transaction.atomic():
        audit_record(action="retention.policy_cleared", actor=label(actor),
                     subject_type=SubjectType.WORKFLOW if policy.workflow_id else "team",
                     subject_id=policy.workflow_id or policy.team.slug, team=policy.team.slug,
                     payload={"kind": policy.kind, "days": policy.days})
        policy.delete()


def _require_hold_right(actor: Actor, team: Team) -> None:
    if may(actor, Action.LEGAL_HOLD, team=team) or can_read_ledger(actor):
        return
    require(actor, Action.LEGAL_HOLD, team=team)  # raises Forbidden with the usual message


def legal_hold_place(*, reason: str, actor: Actor, team: Team | None = None,
                     run: Run | None = None) -> LegalHold:
    """Hold `run` (or all of `team`) out of retention until released. Raises Forbidden (neither
    an owner of the team nor an auditor), ValidationError (no reason, or not one of run/team)."""
    if (team is None) == (run is None):
        raise ValidationError("A legal hold is on a run or on a team: name one of them.")
    team = run.team if run is not None else team
    _require_hold_right(actor, team)
    if not reason.strip():
        raise ValidationError("A legal hold needs a reason.")
    with transaction.atomic():
        hold = LegalHold.objects.create(team=team, run=run, reason=reason.strip(),
                                        placed_by=label(actor), placed_at=now())
        audit_record(action="retention.hold_placed", actor=label(actor),
                     subject_type=SubjectType.RUN if run else "team",
                     subject_id=run.pk if run else team.slug, run=run, team=team.slug,
                     payload={"hold": hold.pk, "reason": hold.reason})
    return hold


def legal_hold_release(*, hold: LegalHold, reason: str, actor: Actor) -> LegalHold:
    """End a hold: retention applies to its rows again from the next sweep. Raises Forbidden,
    NotAllowed (released already), ValidationError (no reason)."""
    _require_hold_right(actor, hold.team)
    if not reason.strip():
        raise ValidationError("Releasing a legal hold needs a reason.")
    with transaction.atomic():
        hold = LegalHold.objects.select_for_update().get(pk=hold.pk)
        if hold.released_at is not None:
            raise NotAllowed(f"{hold} was released already")
        hold.released_at, hold.released_by, hold.release_reason = now(), label(actor), reason.strip()
        hold.save(update_fields=["released_at", "released_by", "release_reason"])
        audit_record(action="retention.hold_released", actor=label(actor),
                     subject_type=SubjectType.RUN if hold.run_id else "team",
                     subject_id=hold.run_id or hold.team.slug, run=hold.run, team=hold.team.slug,
                     payload={"hold": hold.pk, "reason": hold.release_reason})
    return hold

