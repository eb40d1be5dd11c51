"""Opening and deciding approval requests. The API, the admin and the reaper call these."""
import hashlib
import json
from datetime import timedelta

from django.db import transaction

from orchestrator.clock import now
from orchestrator.definitions import TemplateError, render_template
from orchestrator.events import event_record
from orchestrator.models import Run, StepRun, StepState
from orchestrator.services.advance import lock_run, run_advance
from orchestrator.services.errors import NotAllowed

from .models import ApprovalRequest, ApprovalState


def user_may_decide(user, approval: ApprovalRequest) -> bool:
    """Staff, or members of the approvers group who belong to the run's team."""
    if not user.is_authenticated:
        return False
    if user.is_superuser or user.is_staff:
        return True
    in_team = approval.run.team.members.filter(pk=user.pk).exists()
    return in_team and user.groups.filter(name=approval.approvers).exists()


def approval_open(*, run: Run, step: StepRun, spec: dict) -> ApprovalRequest:
    """Create the request for a human gate that has just started waiting (inside its txn)."""
    context = (step.input or {}).get("steps", {})
    proposal_hash = hashlib.sha256(
        json.dumps(context, sort_keys=True, separators=(",", ":"), default=str).encode()
    ).hexdigest()
    try:
        instructions = render_template(spec.get("instructions") or "", step.input or {})
    except TemplateError as exc:
        instructions = f"(instructions could not be rendered: {exc})"
    approval = ApprovalRequest.objects.create(
        step=step, run=run, approvers=spec["approvers"], instructions=instructions,
        context=context, proposal_hash=proposal_hash,
        deadline_at=now() + timedelta(seconds=spec["timeout_s"]),
    )
    event_record(run=run, step=step, kind="approval.requested",
                 payload={"approval": approval.id, "approvers": spec["approvers"],
                          "proposal_hash": proposal_hash})
    return approval


def _decide(*, approval_id: int, user, note: str, approve: bool) -> ApprovalRequest:
    with transaction.atomic():
        run_id = ApprovalRequest.objects.values_list("run_id", flat=True).get(id=approval_id)
        run = lock_run(run_id)
        approval = ApprovalRequest.objects.select_related("step").get(id=approval_id)
        if approval.state != ApprovalState.PENDING:
            raise NotAllowed(f"approval {approval.id} is already {approval.state}")
        step = approval.step
        actor = f"user:{user.username}"
        if approve:
            approval.approve(user=user, note=note)
            step.complete(output={"approved": True, "note": note, "decided_by": user.username,
                                  "proposal_hash": approval.proposal_hash})
        else:
            approval.reject(user=user, note=note)
            step.fail(error={"class": "rejected", "message": f"rejected by {user.username}",
                             "note": note})
        approval.save()
        step.save()
        event_record(run=run, step=step, kind=f"approval.{approval.state}", actor=actor,
                     payload={"approval": approval.id, "note": note,
                              "proposal_hash": approval.proposal_hash})
        event_record(run=run, step=step, kind=f"step.{step.state}", actor=actor)
        run_advance(run, actor=actor)
    return approval


def approval_grant(*, approval_id: int, user, note: str = "") -> ApprovalRequest:
    """Approve: the gate completes with {approved, note, decided_by}; the run moves on.

    Raises NotAllowed if the request is no longer pending.
    """
    return _decide(approval_id=approval_id, user=user, note=note, approve=True)


def approval_reject(*, approval_id: int, user, note: str = "") -> ApprovalRequest:
    """Reject: the gate fails (class `rejected`) and the workflow's on_error policy applies."""
    return _decide(approval_id=approval_id, user=user, note=note, approve=False)


def approvals_cancel_for_run(*, run: Run, actor: str) -> None:
    """Cancel a run's pending requests (inside the run's cancel transaction)."""
    for approval in ApprovalRequest.objects.filter(run=run, state=ApprovalState.PENDING):
        approval.cancel()
        approval.save()
        event_record(run=run, step=approval.step, kind="approval.cancelled", actor=actor,
                     payload={"approval": approval.id})


def approval_expire_for_step(*, step: StepRun) -> None:
    """The gate timed out (inside the reaper's transaction)."""
    approval = ApprovalRequest.objects.filter(step=step, state=ApprovalState.PENDING).first()
    if approval is not None and step.state == StepState.TIMED_OUT:
        approval.expire()
        approval.save()
        event_record(run=step.run, step=step, kind="approval.expired", actor="service:reaper",
                     payload={"approval": approval.id})
