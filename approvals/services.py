"""Approval requests' own state changes: open, record a person's decision, amend, escalate,
remind, close, revoke — each with its event (and so its audit entry) and its notification.

These run inside the caller's transaction (the human gate's, with the run row locked); what a
decision does to the run — completing or failing the gate step, moving the run on — is the
gate's (`orchestrator.engine.services.kinds.human_gate`), which also checks the decider's authority
(`approvals.authority`) before calling here. The exception is `approval_refusal_record`, which
writes the audit entry of a refused attempt in a transaction of its own, after the attempt's
was rolled back. Notifications are recorded here and delivered after commit
(`notifications.services`). Nothing here imports an engine service.
"""
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.urls import reverse

from notifications.services import notification_send
from orchestrator.engine.authz import Actor, label
from orchestrator.engine.clock import now
from orchestrator.engine.definitions import TemplateError, render_template
from orchestrator.engine.events import event_record
from orchestrator.engine.states import StepState
from orchestrator.models import Run, StepRun

from .actions import EditedAction, action_summary, gate_action
from .authority import deciders
from .models import ApprovalDecision, ApprovalRequest, ApprovalState, Verdict


def approvals_required(spec: dict, tier: str) -> int:
    """N of N-of-M: the gate's `required_approvals`, a number or one per tier (default 1)."""
    required = spec.get("required_approvals", 1)
    if isinstance(required, dict):
        return int(required.get(tier, 1))
    return int(required)


def _remind_at(spec: dict, deadline_at):
    before = spec.get("remind_before_s")
    return deadline_at - timedelta(seconds=before) if before else None


def approval_request_open(*, run: Run, step: StepRun, spec: dict, record) -> ApprovalRequest:
    """Create the request for a human gate that has just started waiting (its deadline is the
    gate step's), and tell the approvers. Its event joins the scheduler's batch (`record`,
    `services.kinds.Record`)."""
    approval = _request_create(run=run, step=step, spec=spec, record=record)
    approval_notify(approval, reason="requested")
    return approval


def approval_request_sandboxed(*, run: Run, step: StepRun, spec: dict, record, approve: bool,
                               actor: Actor) -> ApprovalRequest:
    """A sandboxed run's gate (orchestrator/engine/sandbox.py): the request it would have
    opened — bound to the same action and hash, so its guarded steps are checked against it as
    a live run's are — decided at once by `actor` (never a person), and nobody told. Its events
    (requested, then approved or rejected) join the scheduler's batch (`record`)."""
    approval = _request_create(run=run, step=step, spec=spec, record=record, sandboxed=True)
    if approve:
        approval.approve(user=None, note="")
    else:
        approval.reject(user=None, note="")
    approval.save()
    payload = {"approval": approval.id, "note": "", "proposal_hash": approval.proposal_hash,
               "sandboxed": True}
    if approve:
        payload["approved_by"] = []
    record(step, f"approval.{approval.state}", payload, actor=label(actor))
    return approval


def _request_create(*, run: Run, step: StepRun, spec: dict, record,
                    sandboxed: bool = False) -> ApprovalRequest:
    try:
        instructions = render_template(spec.get("instructions") or "", step.input or {})
    except TemplateError as exc:
        instructions = f"The instructions could not be rendered ({exc})."
    bound = gate_action(run=run, gate=step, spec=spec)
    deadline_at = step.deadline_at
    approval = ApprovalRequest.objects.create(
        step=step, run=run, approvers=spec["approvers"], instructions=instructions,
        context=(step.input or {}).get("steps", {}), action_kind=bound.kind, action=bound.action,
        action_source=bound.source, guarded_steps=list(bound.guarded),
        explanation=bound.explanation, risk_tier=bound.risk_tier,
        risk_reasons=list(bound.risk_reasons), amount=bound.amount,
        approvals_required=approvals_required(spec, bound.risk_tier),
        self_approval_up_to=spec.get("self_approval_up_to") or "",
        editable=list(spec.get("editable") or []), proposal_hash=bound.hash,
        deadline_at=deadline_at, remind_at=_remind_at(spec, deadline_at),
    )
    payload = {"approval": approval.id, "approvers": approval.approvers,
               "proposal_hash": approval.proposal_hash, "action_kind": approval.action_kind,
               "risk_tier": approval.risk_tier, "approvals_required": approval.approvals_required,
               "deadline_at": approval.deadline_at.isoformat()}
    if sandboxed:
        payload["sandboxed"] = True
    record(step, "approval.requested", payload, actor="service:stepwise")
    return approval


def approval_given_record(*, run: Run, approval: ApprovalRequest, user, note: str) -> int:
    """Record one person's approval of the current hash. Returns how many distinct people have
    approved it (the caller compares with `approvals_required`)."""
    ApprovalDecision.objects.create(request=approval, user=user, verdict=Verdict.APPROVE, note=note,
                                    proposal_hash=approval.proposal_hash,
                                    escalation_level=approval.escalation_level)
    given = (approval.decisions.filter(verdict=Verdict.APPROVE, proposal_hash=approval.proposal_hash)
             .values("user").distinct().count())
    if given < approval.approvals_required:
        event_record(run=run, step=approval.step, kind="approval.given", actor=label(user),
                     payload={"approval": approval.id, "note": note,
                              "proposal_hash": approval.proposal_hash, "given": given,
                              "required": approval.approvals_required})
    return given


def approval_request_decide(*, run: Run, approval: ApprovalRequest, user, note: str,
                            approve: bool, reason: str = "") -> None:
    """Record the outcome of a pending request: approved (enough approvals were given) or
    rejected (by `user`, or with `user` None by the gate's deadline policy, with `reason`)."""
    if approve:
        approval.approve(user=user, note=note)
    else:
        if user is not None:
            ApprovalDecision.objects.create(
                request=approval, user=user, verdict=Verdict.REJECT, note=note,
                proposal_hash=approval.proposal_hash, escalation_level=approval.escalation_level)
        approval.reject(user=user, note=note)
    approval.save()
    payload = {"approval": approval.id, "note": note, "proposal_hash": approval.proposal_hash}
    if reason:
        payload["reason"] = reason
    if approve:
        payload["approved_by"] = approved_by(approval)
    event_record(run=run, step=approval.step, kind=f"approval.{approval.state}",
                 actor=label(user) if user is not None else "service:reaper", payload=payload)


def approved_by(approval: ApprovalRequest) -> list[str]:
    """Usernames of the people whose approvals of the current hash count, first first."""
    names = (approval.decisions.filter(verdict=Verdict.APPROVE, proposal_hash=approval.proposal_hash)
             .order_by("created_at", "id").values_list("user__username", flat=True))
    return list(dict.fromkeys(name for name in names if name))


def approval_request_amend(*, run: Run, approval: ApprovalRequest, user, edited: EditedAction,
                           note: str, spec: dict) -> None:
    """A reviewer changed parameters: the request binds the changed action under its new hash;
    approvals of the old hash no longer count."""
    previous = approval.proposal_hash
    approval.amend(user=user, action=edited.action, proposal_hash=edited.hash, edits=edited.edits,
                   risk_tier=edited.risk_tier, risk_reasons=list(edited.risk_reasons),
                   amount=edited.amount,
                   approvals_required=approvals_required(spec, edited.risk_tier))
    approval.save()
    ApprovalDecision.objects.create(
        request=approval, user=user, verdict=Verdict.EDIT, note=note, proposal_hash=previous,
        escalation_level=approval.escalation_level,
        changes={"params": edited.changes, "new_hash": edited.hash})
    event_record(run=run, step=approval.step, kind="approval.edited", actor=label(user),
                 payload={"approval": approval.id, "note": note,
                          "changed": sorted(edited.changes),  # names only: values stay in the row
                          "previous_hash": previous, "proposal_hash": approval.proposal_hash,
                          "risk_tier": approval.risk_tier})


def approval_request_escalate(*, run: Run, approval: ApprovalRequest, tier: dict, spec: dict,
                              actor: Actor) -> None:
    """The current tier's deadline passed undecided: hand the request to the next tier's group,
    with a deadline of its own, and tell that group."""
    previous = approval.approvers
    deadline_at = now() + timedelta(seconds=tier["timeout_s"])
    approval.escalate(approvers=tier["approvers"], deadline_at=deadline_at,
                      remind_at=_remind_at(spec, deadline_at))
    approval.save()
    event_record(run=run, step=approval.step, kind="approval.escalated", actor=label(actor),
                 payload={"approval": approval.id, "from": previous, "to": approval.approvers,
                          "level": approval.escalation_level,
                          "deadline_at": deadline_at.isoformat(),
                          "proposal_hash": approval.proposal_hash})
    approval_notify(approval, reason="escalated")


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
                 payload={"approval": approval.id, "proposal_hash": approval.proposal_hash})
    return approval


def approval_request_revoke(*, run: Run, approval: ApprovalRequest, user, note: str) -> None:
    """Withdraw an approval whose action has not run: its guarded steps refuse to run."""
    approval.revoke()
    approval.save()
    ApprovalDecision.objects.create(request=approval, user=user, verdict=Verdict.REVOKE, note=note,
                                    proposal_hash=approval.proposal_hash,
                                    escalation_level=approval.escalation_level)
    event_record(run=run, step=approval.step, kind="approval.revoked", actor=label(user),
                 payload={"approval": approval.id, "note": note,
                          "proposal_hash": approval.proposal_hash})


def approval_refusal_record(*, approval_id: int, user: Actor, attempted: str, reason: str,
                            proposal_hash: str = "") -> None:
    """Audit a refused attempt to decide (approve, reject, edit, revoke): who, what, why, with
    the hash they sent. Its own transaction: the attempt's own was rolled back."""
    approval = (ApprovalRequest.objects.select_related("run", "step").filter(id=approval_id)
                .first())
    if approval is None:
        return
    with transaction.atomic():
        event_record(run=approval.run, step=approval.step, kind="approval.refused",
                     actor=label(user),
                     payload={"approval": approval.id, "attempted": attempted, "reason": reason,
                              "sent_hash": proposal_hash, "proposal_hash": approval.proposal_hash,
                              "state": approval.state})


def approval_reminders_send(*, limit: int = 200) -> int:
    """Remind the deciding group of every pending request whose reminder is due (once per
    tier). Called by the reaper; returns how many were sent."""
    due = (ApprovalRequest.objects.filter(state=ApprovalState.PENDING, remind_at__lte=now(),
                                          reminded_at__isnull=True)
           .values_list("id", flat=True)[:limit])
    sent = 0
    for approval_id in list(due):
        with transaction.atomic():
            approval = (ApprovalRequest.objects.select_for_update(of=("self",))
                        .select_related("run__team", "run__version__workflow", "step")
                        .filter(id=approval_id, state=ApprovalState.PENDING,
                                reminded_at__isnull=True).first())
            if approval is None:
                continue
            ApprovalRequest.objects.filter(id=approval.id).update(reminded_at=now())
            event_record(run=approval.run, step=approval.step, kind="approval.reminded",
                         actor="service:reaper",
                         payload={"approval": approval.id, "approvers": approval.approvers,
                                  "deadline_at": approval.deadline_at.isoformat()})
            approval_notify(approval, reason="reminder")
            sent += 1
    return sent


# --- notifications ------------------------------------------------------------------------------


def decision_page_url(approval: ApprovalRequest) -> str:
    path = reverse("admin:approvals_approvalrequest_change", args=[approval.id])
    return settings.STEPWISE_BASE_URL.rstrip("/") + path


def _when(moment) -> str:
    return moment.strftime("%Y-%m-%d %H:%M UTC")


def approval_notify(approval: ApprovalRequest, *, reason: str) -> None:
    """Tell the deciding group (e-mail) and the webhook that a request waits for them:
    `reason` is requested, escalated or reminder."""
    run = approval.run
    workflow = run.version.workflow.name
    where = f"{workflow} / {approval.step.name}"
    subjects = {
        "requested": f"Approval needed: {where} ({approval.risk_tier} risk)",
        "escalated": f"Escalated to {approval.approvers}: {where} ({approval.risk_tier} risk)",
        "reminder": f"Approval due {_when(approval.deadline_at)}: {where}",
    }
    lines = [f"Run {run.id} of {workflow} (team {run.team.slug}) waits for a decision by the "
             f"{approval.approvers} group at step '{approval.step.name}'."]
    if reason == "escalated":
        lines.append("Its previous approvers did not decide before their deadline.")
    lines.append(f"Action: {action_summary(approval, limit=300)}")
    lines.append(f"Risk: {approval.risk_tier}" + (
        f" ({'; '.join(approval.risk_reasons)})" if approval.risk_reasons else ""))
    if approval.approvals_required > 1:
        lines.append(f"Approvals required: {approval.approvals_required} different people.")
    lines.append(f"Decide by {_when(approval.deadline_at)}.")
    notification_send(
        kind=f"approval.{reason}", subject=subjects[reason], body="\n".join(lines),
        link=decision_page_url(approval), team=run.team.slug,
        recipients=[u.email for u in deciders(approval)])

