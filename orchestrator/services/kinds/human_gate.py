"""Human gates: a run waits, holding no worker, until a person approves or rejects.

`start` opens the approval request (`approvals`) bound to the data it approves; the decision
services `approval_grant` / `approval_reject` — the ones the API, the admin and any later
entry point call — check the decider's authority, record the decision and end the gate step;
the gate's deadline is the reaper's (`time_out`); a gate that ends without a decision closes
its request (`release`).
"""
from django.db import transaction

from approvals.authority import require_decider
from approvals.models import ApprovalRequest, ApprovalState
from approvals.services import (
    approval_request_close,
    approval_request_decide,
    approval_request_open,
)

from ...authz import Actor, label
from ...errors import NotAllowed
from ...events import event_record
from ...models import Run, StepRun
from ...selectors import lock_run
from ...states import StepKind
from ..step_end import step_ended, waiting_step_time_out
from . import Record, StepKindHandler, register


class HumanGate(StepKindHandler):
    def start(self, run: Run, step: StepRun, spec: dict, record: Record) -> None:
        step.await_event(timeout_s=spec["timeout_s"])
        record(step, "step.waiting", {"for": "approval"})
        step.save()
        approval_request_open(run=run, step=step, spec=spec)

    def time_out(self, *, step_id: int, reason: str) -> bool:
        return waiting_step_time_out(step_id=step_id, reason=reason)

    def release(self, run: Run, step: StepRun, *, actor: Actor) -> None:
        approval_request_close(run=run, step=step, actor=actor)


register(StepKind.HUMAN_GATE, HumanGate())


def _decide(*, approval_id: int, user, note: str, approve: bool) -> ApprovalRequest:
    with transaction.atomic():
        run = lock_run(ApprovalRequest.objects.values_list("run_id", flat=True).get(id=approval_id))
        approval = ApprovalRequest.objects.select_related("step", "run__team").get(id=approval_id)
        require_decider(user, approval)
        if approval.state != ApprovalState.PENDING:
            raise NotAllowed(f"approval {approval.id} is already {approval.state}")
        step = approval.step
        approval_request_decide(run=run, approval=approval, user=user, note=note, approve=approve)
        if approve:
            step.complete(output={"approved": True, "note": note, "decided_by": user.username,
                                  "proposal_hash": approval.proposal_hash})
        else:
            step.fail(error={"class": "rejected", "message": f"rejected by {user.username}",
                             "note": note})
        step.save()
        event_record(run=run, step=step, kind=f"step.{step.state}", actor=label(user))
        step_ended(run, step, actor=user)
    return approval


def approval_grant(*, approval_id: int, user, note: str = "") -> ApprovalRequest:
    """Approve: the gate completes with {approved, note, decided_by}; the run moves on.

    Raises Forbidden unless `user` is one of the request's approvers, NotAllowed if the request
    is no longer pending.
    """
    return _decide(approval_id=approval_id, user=user, note=note, approve=True)


def approval_reject(*, approval_id: int, user, note: str = "") -> ApprovalRequest:
    """Reject: the gate fails (class `rejected`) and the workflow's on_error policy applies.

    Raises Forbidden or NotAllowed like `approval_grant`.
    """
    return _decide(approval_id=approval_id, user=user, note=note, approve=False)
