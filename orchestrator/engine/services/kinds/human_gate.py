"""Human gates: a run waits, holding no worker, until people approve or reject.

`start` opens the approval request (`approvals`), bound to the exact action that will run. The
decision services — `approval_grant`, `approval_reject`, `approval_edit`, `approval_revoke`, the
ones the API, the admin and any later entry point call — check the decider's authority
(`approvals.authority`), require the hash the decider reviewed, record the decision and, once it
is final, end the gate step. A refused attempt changes nothing and is audited
(`approval.refused`). The gate's deadline is the reaper's (`time_out`): escalate to the next
tier, or reject or expire per the gate's policy; a gate that ends without a decision closes its
request (`release`).

In a sandboxed run (`orchestrator.engine.sandbox`) a gate asks nobody: it starts (it *would
have asked*: `started_at` is set) and ends at once as the sandbox's `decisions` say, the request
it would have opened recorded as decided by `SANDBOX` ("service:evaluation"), with the output
a person's approval gives (`gate_output`), so the steps after it read it the same way.
"""
from collections.abc import Callable
from contextlib import contextmanager

from django.db import transaction

from approvals.actions import ActionInvalid, action_edited, gate_output
from approvals.authority import (
    approval_tiers,
    approvers_of,
    require_decider,
    require_separation,
)
from approvals.models import ApprovalRequest, ApprovalState
from approvals.services import (
    approval_given_record,
    approval_refusal_record,
    approval_request_amend,
    approval_request_close,
    approval_request_decide,
    approval_request_escalate,
    approval_request_open,
    approval_request_revoke,
    approval_request_sandboxed,
    approved_by,
)
from orchestrator.engine.definitions.format import DEFAULT_GATE_DEADLINE
from orchestrator.models import Run, StepRun

from ...authz import REAPER, SANDBOX, Actor, label
from ...clock import now
from ...errors import InputInvalid, NotAllowed, ServiceError
from ...events import event_record
from ...sandbox import gate_decision
from ...selectors import lock_run, lock_run_of_step, spec_of
from ...states import StepKind, StepState
from ..step_end import step_ended, waiting_step_time_out
from . import Record, StepKindHandler, register

MAX_NOTE = 10000
# A guarded step in one of these states has not acted (nor will it, for the last two).
NOT_STARTED = (StepState.BLOCKED, StepState.READY, StepState.QUEUED, StepState.SKIPPED,
               StepState.CANCELLED)


class HumanGate(StepKindHandler):
    def start(self, run: Run, step: StepRun, spec: dict, record: Record) -> None:
        step.await_event(timeout_s=spec["timeout_s"])
        record(step, "step.waiting", {"for": "approval"})  # saved with the scheduler's batch
        if run.sandbox is not None:
            _decide_sandboxed(run, step, spec, record)
            return
        approval_request_open(run=run, step=step, spec=spec, record=record)

    def time_out(self, *, step_id: int, reason: str) -> bool:
        """The current tier's deadline passed: escalate to the next tier, or reject or expire
        per the gate's `on_deadline`."""
        with transaction.atomic():
            run, step = lock_run_of_step(step_id)
            # Re-read under the lock: a sweep that listed the step before another one escalated
            # it finds its deadline moved on, and does nothing.
            due = step.deadline_at is not None and step.deadline_at <= now()
            if step.state != StepState.WAITING or not due:
                return False
            approval = (ApprovalRequest.objects.select_related("run__team", "run__version__workflow", "step")
                        .filter(step=step, state=ApprovalState.PENDING).first())
            if approval is not None:
                spec = spec_of(run, step.name)
                tiers = approval_tiers(approval)
                if approval.escalation_level + 1 < len(tiers):
                    approval_request_escalate(run=run, approval=approval, spec=spec, actor=REAPER,
                                              tier=tiers[approval.escalation_level + 1])
                    step.deadline_at = approval.deadline_at
                    step.save()
                    return True
                if spec.get("on_deadline", DEFAULT_GATE_DEADLINE) == "reject":
                    why = "the approval deadline passed; the gate's policy rejects it"
                    approval_request_decide(run=run, approval=approval, user=None, note="",
                                            approve=False, reason=why)
                    _end_gate(run, step, approved=False, actor=REAPER,
                              error={"class": "rejected", "message": why})
                    return True
        return waiting_step_time_out(step_id=step_id, reason=reason)

    def release(self, run: Run, step: StepRun, *, actor: Actor) -> None:
        approval_request_close(run=run, step=step, actor=actor)


register(StepKind.HUMAN_GATE, HumanGate())


def _decide_sandboxed(run: Run, step: StepRun, spec: dict, record: Record) -> None:
    """End a sandboxed run's gate as it starts, as its sandbox decides (in the scheduler's
    batch: it plans again, as after any control step that ends as it starts)."""
    decision = gate_decision(run.sandbox, step.name)
    approval = approval_request_sandboxed(run=run, step=step, spec=spec, record=record,
                                          approve=decision == "approve", actor=SANDBOX)
    if decision == "approve":
        step.complete(output=gate_output(approval, note="", decided_by=SANDBOX.name,
                                         approved_by=[]))
        record(step, "step.completed", {"sandboxed": True}, actor=label(SANDBOX))
    else:
        step.fail(error={"class": "rejected", "message": "rejected by the run's sandbox "
                         f"(sandbox.decisions.{step.name})", "note": ""})
        record(step, "step.failed", {**step.error, "sandboxed": True}, actor=label(SANDBOX))


def _end_gate(run: Run, step: StepRun, *, approved: bool, actor: Actor, output: dict | None = None,
              error: dict | None = None) -> None:
    if approved:
        step.complete(output=output)
    else:
        step.fail(error=error)
    step.save()
    event_record(run=run, step=step, kind=f"step.{step.state}", actor=label(actor),
                 payload=error or {})
    step_ended(run, step, actor=actor)


@contextmanager
def _audited_refusal(*, approval_id: int, user, attempted: str, proposal_hash: str):
    """Let a refusal propagate after writing its audit entry (the attempt was rolled back)."""
    try:
        yield
    except ServiceError as exc:
        approval_refusal_record(approval_id=approval_id, user=user, attempted=attempted,
                                reason=str(exc), proposal_hash=proposal_hash)
        raise


def _act(*, approval_id: int, user, attempted: str, proposal_hash: str,
         body: Callable[[Run, ApprovalRequest], None], pending: bool = True) -> ApprovalRequest:
    """Lock the run, load the request, check the common rules, then run `body`; a refusal is
    audited and re-raised."""
    with _audited_refusal(approval_id=approval_id, user=user, attempted=attempted,
                          proposal_hash=proposal_hash), transaction.atomic():
        run = lock_run(ApprovalRequest.objects.values_list("run_id", flat=True).get(id=approval_id))
        approval = (ApprovalRequest.objects.select_related("step", "run__team", "run__version__workflow")
                    .get(id=approval_id))
        require_decider(user, approval)
        if pending:
            if approval.state != ApprovalState.PENDING:
                raise NotAllowed(f"approval {approval.id} is already {approval.state}")
            if approval.step.state != StepState.WAITING:
                raise NotAllowed(f"the gate step is {approval.step.state}, not waiting")
            _require_hash(approval, proposal_hash)
        body(run, approval)
    return approval


def _require_hash(approval: ApprovalRequest, proposal_hash: str) -> None:
    """The decider must name the hash of the action they reviewed, and it must be current."""
    if not proposal_hash:
        raise NotAllowed("proposal_hash is required: send the hash of the action you reviewed",
                         [{"path": "proposal_hash", "message": "send the hash of the action you "
                           "reviewed (the request's proposal_hash)"}])
    if proposal_hash != approval.proposal_hash:
        message = (f"the request now binds action {approval.proposal_hash[:12]}…, not the "
                   f"{proposal_hash[:12]}… you sent; review it again")
        raise NotAllowed(message, [{"path": "proposal_hash", "message": message}])


def _note(note: str, *, required: bool, verb: str) -> str:
    note = (note or "").strip()
    if required and not note:
        raise InputInvalid(f"a note is required to {verb}: say why",
                           [{"path": "note", "message": f"a note is required to {verb}: say why"}])
    if len(note) > MAX_NOTE:
        raise InputInvalid(f"the note is longer than {MAX_NOTE} characters",
                           [{"path": "note", "message": f"at most {MAX_NOTE} characters"}])
    return note


def approval_grant(*, approval_id: int, user, proposal_hash: str, note: str = "") -> ApprovalRequest:
    """Approve the action with hash `proposal_hash` (the one the decider reviewed). Once the
    request has its required number of distinct approvers, the gate completes with
    {approved, note, decided_by, approved_by, proposal_hash[, proposal]} and the run moves on.

    Raises Forbidden unless `user` is one of the current approvers and not barred by separation
    of duties; NotAllowed if the request is no longer pending, the hash is missing or stale, or
    `user` approved it already; InputInvalid for a note that is too long. A refusal is audited.
    """
    def body(run: Run, approval: ApprovalRequest) -> None:
        text = _note(note, required=False, verb="approve")
        require_separation(user, approval)
        if approvers_of(approval).filter(user=user).exists():
            raise NotAllowed(f"you already approved this; {approval.approvals_required} "
                             "different people must approve it")
        given = approval_given_record(run=run, approval=approval, user=user, note=text)
        if given < approval.approvals_required:
            return
        approval_request_decide(run=run, approval=approval, user=user, note=text, approve=True)
        output = gate_output(approval, note=text, decided_by=user.get_username(),
                             approved_by=approved_by(approval))
        _end_gate(run, approval.step, approved=True, actor=user, output=output)

    return _act(approval_id=approval_id, user=user, attempted="approve",
                proposal_hash=proposal_hash, body=body)


def approval_reject(*, approval_id: int, user, proposal_hash: str, note: str) -> ApprovalRequest:
    """Reject (a note saying why is required): the gate fails (class `rejected`) and the
    workflow's on_error policy applies. One rejection is enough.

    Raises Forbidden, NotAllowed like `approval_grant`; InputInvalid without a note.
    """
    def body(run: Run, approval: ApprovalRequest) -> None:
        text = _note(note, required=True, verb="reject")
        approval_request_decide(run=run, approval=approval, user=user, note=text, approve=False)
        _end_gate(run, approval.step, approved=False, actor=user, error={
            "class": "rejected", "message": f"rejected by {user.get_username()}", "note": text})

    return _act(approval_id=approval_id, user=user, attempted="reject",
                proposal_hash=proposal_hash, body=body)


def approval_edit(*, approval_id: int, user, proposal_hash: str, params: dict,
                  note: str = "") -> ApprovalRequest:
    """Change parameters the gate lets reviewers edit: re-validated against the action's schema,
    re-hashed (a proposal's risk re-assessed), recorded as `user`'s change. The request stays
    pending under the new hash; approvals of the old one no longer count, and `user` may not
    approve their own edit.

    Raises Forbidden, NotAllowed like `approval_grant`; InputInvalid naming every parameter the
    schema rejects, or one that is not editable.
    """
    def body(run: Run, approval: ApprovalRequest) -> None:
        text = _note(note, required=False, verb="edit")
        try:
            edited = action_edited(approval, params)
        except ActionInvalid as exc:
            raise InputInvalid(str(exc), exc.problems) from None
        approval_request_amend(run=run, approval=approval, user=user, edited=edited, note=text,
                               spec=spec_of(run, approval.step.name))

    return _act(approval_id=approval_id, user=user, attempted="edit",
                proposal_hash=proposal_hash, body=body)


def approval_revoke(*, approval_id: int, user, note: str) -> ApprovalRequest:
    """Withdraw an approval before its action ran (a note saying why is required): the guarded
    steps refuse to run, and the run fails under its on_error policy when they do.

    Raises Forbidden unless `user` is one of the approvers; NotAllowed if the request is not
    approved or a guarded step has started; InputInvalid without a note.
    """
    def body(run: Run, approval: ApprovalRequest) -> None:
        text = _note(note, required=True, verb="revoke")
        if approval.state != ApprovalState.APPROVED:
            raise NotAllowed(f"approval {approval.id} is {approval.state}, not approved")
        started = list(StepRun.objects.filter(run=run, name__in=approval.guarded_steps)
                       .exclude(state__in=NOT_STARTED).values_list("name", flat=True))
        if started:
            raise NotAllowed(f"too late: {', '.join(started)} has already started")
        approval_request_revoke(run=run, approval=approval, user=user, note=text)

    return _act(approval_id=approval_id, user=user, attempted="revoke", proposal_hash="",
                body=body, pending=False)
