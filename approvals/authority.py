"""Who may decide an approval request: members of its approvers group in the run's team.

Being staff is not enough; a superuser may decide (and is audited like anyone). Reads only;
the decision services (`orchestrator.services.kinds.human_gate`) call `require_decider`.
"""
from orchestrator.authz import Actor, System, role_in
from orchestrator.errors import Forbidden

from .models import ApprovalRequest


def may_decide(user: Actor, approval: ApprovalRequest) -> bool:
    if isinstance(user, System) or not user.is_authenticated or not user.is_active:
        return False
    if user.is_superuser:
        return True
    if role_in(user, approval.run.team) is None:
        return False
    return user.groups.filter(name=approval.approvers).exists()


def require_decider(user: Actor, approval: ApprovalRequest) -> None:
    """Raise Forbidden unless `user` may decide `approval`."""
    if not may_decide(user, approval):
        raise Forbidden(f"you are not one of this request's approvers ({approval.approvers})")
