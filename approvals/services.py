"""Approval requests' own state changes: open, decide, close. The human gate calls these.

A request is bound to the exact data it approves (`proposal_hash`). These functions change the
request row and record its event, inside the caller's transaction (the gate's, with the run
locked); what the decision does to the run — completing or failing the gate step, moving the
run on — is the human gate's (`orchestrator.services.kinds.human_gate`). Nothing here imports
an engine service.
"""
from datetime import timedelta

from orchestrator.authz import Actor, label
from orchestrator.clock import now
from orchestrator.definitions import TemplateError, render_template
from orchestrator.events import event_record
from orchestrator.hashing import digest_of
from orchestrator.models import Run, StepRun
from orchestrator.states import StepState

from .models import ApprovalRequest, ApprovalState


def approval_request_open(*, run: Run, step: StepRun, spec: dict) -> ApprovalRequest:
    """Create the request for a human gate that has just started waiting."""
    context = (step.input or {}).get("steps", {})
    try:
        instructions = render_template(spec.get("instructions") or "", step.input or {})
    except TemplateError as exc:
        instructions = f"(instructions could not be rendered: {exc})"
    approval = ApprovalRequest.objects.create(
        step=step, run=run, approvers=spec["approvers"], instructions=instructions,
        context=context, proposal_hash=digest_of(context),
        deadline_at=now() + timedelta(seconds=spec["timeout_s"]),
    )
    event_record(run=run, step=step, kind="approval.requested",
                 payload={"approval": approval.id, "approvers": spec["approvers"],
                          "proposal_hash": approval.proposal_hash})
    return approval


def approval_request_decide(*, run: Run, approval: ApprovalRequest, user, note: str,
                            approve: bool) -> None:
    """Record a decision on a pending request (the caller checked the decider's authority)."""
    if approve:
        approval.approve(user=user, note=note)
    else:
        approval.reject(user=user, note=note)
    approval.save()
    event_record(run=run, step=approval.step, kind=f"approval.{approval.state}",
                 actor=label(user),
                 payload={"approval": approval.id, "note": note,
                          "proposal_hash": approval.proposal_hash})


def approval_request_close(*, run: Run, step: StepRun, actor: Actor) -> ApprovalRequest | None:
    """Close the gate's pending request because the gate ended without a decision: expired if
    it timed out, cancelled otherwise. None if there was no pending request."""
    approval = ApprovalRequest.objects.filter(step=step, state=ApprovalState.PENDING).first()
    if approval is None:
        return None
    if step.state == StepState.TIMED_OUT:
        approval.expire()
    else:
        approval.cancel()
    approval.save()
    event_record(run=run, step=step, kind=f"approval.{approval.state}", actor=label(actor),
                 payload={"approval": approval.id})
    return approval
