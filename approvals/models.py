"""Approval requests: a human gate's question, bound to the exact action that will run.

A request holds the canonical action its approval authorizes (`action`) and that action's
SHA-256 (`proposal_hash`): one hash per request, shown to the reviewer, required to decide, and
checked again right before the action runs. Each person's verdict is an `ApprovalDecision`
(several approvers may be required); the request's state machine records the outcome.

Rows and transitions only: a transition body touches its own row; the services wrap it with
`save()`, the decision rows and the event in one transaction.
"""
from django.conf import settings
from django.db import models
from django_fsm import ConcurrentTransitionMixin, FSMField, transition

from orchestrator.engine.clock import now
from orchestrator.engine.definitions.format import RISK_TIERS


class ApprovalState(models.TextChoices):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"
    CANCELLED = "cancelled"
    REVOKED = "revoked"


class ActionKind(models.TextChoices):
    """What the approval binds (orchestrator/engine/definitions/gates.py)."""

    PROPOSAL = "proposal", "a typed proposal of an agent step"
    STEP = "step", "the call a tool step will make"
    CONTEXT = "context", "the upstream steps' outputs"


RISK_TIER_CHOICES = [(tier, tier) for tier in RISK_TIERS]


class ApprovalRequest(ConcurrentTransitionMixin, models.Model):
    # A gate step reopened by an operator's redrive asks again: one request per time it waits,
    # at most one of them pending (the constraint below).
    step = models.ForeignKey("orchestrator.StepRun", on_delete=models.CASCADE, related_name="approvals")
    run = models.ForeignKey("orchestrator.Run", on_delete=models.CASCADE, related_name="approvals")
    state = FSMField(default=ApprovalState.PENDING, choices=ApprovalState.choices, protected=True)
    approvers = models.CharField(max_length=150, help_text="The group that decides now.")
    escalation_level = models.PositiveSmallIntegerField(
        default=0, help_text="0: the gate's own approvers; n: its n-th escalation tier.")
    instructions = models.TextField(blank=True)
    context = models.JSONField(default=dict, help_text="The upstream outputs the gate has seen.")
    action_kind = models.CharField(max_length=16, choices=ActionKind.choices,
                                   default=ActionKind.CONTEXT)
    action = models.JSONField(default=dict, help_text="The canonical action that will run.")
    action_source = models.CharField(max_length=64, blank=True,
                                     help_text="The step that proposed or will perform it.")
    guarded_steps = models.JSONField(default=list,
                                     help_text="Steps that run only while this approval holds.")
    edits = models.JSONField(default=dict, blank=True,
                             help_text="Parameters reviewers changed: name -> value.")
    explanation = models.JSONField(default=dict, blank=True,
                                   help_text="The model's evidence, rationale and confidence.")
    risk_tier = models.CharField(max_length=16, choices=RISK_TIER_CHOICES, default="medium")
    risk_reasons = models.JSONField(default=list, blank=True)
    amount = models.DecimalField(max_digits=14, decimal_places=2, null=True, blank=True)
    approvals_required = models.PositiveSmallIntegerField(default=1)
    self_approval_up_to = models.CharField(max_length=16, blank=True,
                                           help_text="Separation of duties is relaxed up to here.")
    editable = models.JSONField(default=list, blank=True)
    proposal_hash = models.CharField(max_length=64, help_text="SHA-256 of the canonical action.")
    edited_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                  on_delete=models.SET_NULL, related_name="+")
    requested_at = models.DateTimeField(default=now)
    deadline_at = models.DateTimeField()
    remind_at = models.DateTimeField(null=True, blank=True)
    reminded_at = models.DateTimeField(null=True, blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL)
    note = models.TextField(blank=True)

    class Meta:
        ordering = ["-requested_at"]
        indexes = [
            models.Index(fields=["state", "deadline_at"], name="approval_state_deadline"),
            models.Index(fields=["state", "remind_at"], name="approval_state_remind"),
            # The approval list: a keyset page, newest first, by state or not.
            models.Index(fields=["requested_at", "id"], name="approval_requested_id"),
            models.Index(fields=["state", "requested_at", "id"], name="approval_state_requested"),
        ]
        constraints = [
            models.UniqueConstraint(fields=["step"], condition=models.Q(state="pending"),
                                    name="one_pending_approval_per_step"),
        ]

    def __str__(self) -> str:
        return f"approval {self.pk} for {self.step.name} ({self.state})"

    @transition(field=state, source=ApprovalState.PENDING, target=ApprovalState.APPROVED)
    def approve(self, *, user, note: str) -> None:
        self.decided_by, self.note, self.decided_at = user, note, now()

    @transition(field=state, source=ApprovalState.PENDING, target=ApprovalState.REJECTED)
    def reject(self, *, user, note: str) -> None:
        """`user` None: rejected by policy (the deadline passed), with no note."""
        self.decided_by, self.note, self.decided_at = user, note, now()

    @transition(field=state, source=ApprovalState.PENDING, target=ApprovalState.EXPIRED)
    def expire(self) -> None:
        self.decided_at = now()

    @transition(field=state, source=ApprovalState.PENDING, target=ApprovalState.CANCELLED)
    def cancel(self) -> None:
        self.decided_at = now()

    @transition(field=state, source=ApprovalState.PENDING, target=ApprovalState.PENDING)
    def escalate(self, *, approvers: str, deadline_at, remind_at) -> None:
        """The deadline passed undecided: the next tier's group decides, by a new deadline."""
        self.approvers = approvers
        self.escalation_level += 1
        self.deadline_at, self.remind_at, self.reminded_at = deadline_at, remind_at, None

    @transition(field=state, source=ApprovalState.PENDING, target=ApprovalState.PENDING)
    def amend(self, *, user, action: dict, proposal_hash: str, edits: dict, risk_tier: str,
              risk_reasons: list, amount, approvals_required: int) -> None:
        """A reviewer changed parameters: the request now binds the changed action."""
        self.action, self.proposal_hash, self.edits = action, proposal_hash, edits
        self.risk_tier, self.risk_reasons, self.amount = risk_tier, risk_reasons, amount
        self.approvals_required = approvals_required
        self.edited_by = user

    @transition(field=state, source=ApprovalState.APPROVED, target=ApprovalState.REVOKED)
    def revoke(self) -> None:
        """Withdrawn before the action ran: the guarded steps refuse to run."""


class Verdict(models.TextChoices):
    APPROVE = "approve"
    REJECT = "reject"
    EDIT = "edit"
    REVOKE = "revoke"


class ApprovalDecision(models.Model):
    """One person's act on a request, with the hash they saw: the history a reviewer reads and
    what N-of-M counts (distinct approvers of the current hash)."""

    request = models.ForeignKey(ApprovalRequest, on_delete=models.CASCADE, related_name="decisions")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL,
                             related_name="approval_decisions")
    verdict = models.CharField(max_length=16, choices=Verdict.choices)
    note = models.TextField(blank=True)
    proposal_hash = models.CharField(max_length=64, help_text="The hash the person decided on.")
    escalation_level = models.PositiveSmallIntegerField(default=0)
    changes = models.JSONField(default=dict, blank=True,
                               help_text="For an edit: name -> {from, to}, and the new hash.")
    created_at = models.DateTimeField(default=now)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["request", "user", "proposal_hash"],
                                    condition=models.Q(verdict="approve"),
                                    name="one_approval_per_person_and_hash"),
        ]

    def __str__(self) -> str:
        return f"{self.verdict} by {self.user} on approval {self.request_id}"


class InputState(models.TextChoices):
    OPEN = "open"
    ANSWERED = "answered"
    ABSTAINED = "abstained"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


class InputTask(ConcurrentTransitionMixin, models.Model):
    """A `human_input` step's question to a group (or one assignee): the evidence rendered when
    the step started, the form (a JSON Schema) the answer must satisfy, and, once answered, the
    answer and who gave it. One task per time the step waits; at most one of them open."""

    step = models.ForeignKey("orchestrator.StepRun", on_delete=models.CASCADE, related_name="input_tasks")
    run = models.ForeignKey("orchestrator.Run", on_delete=models.CASCADE, related_name="input_tasks")
    version = models.ForeignKey("orchestrator.WorkflowVersion", on_delete=models.PROTECT,
                                related_name="+", help_text="The version the run ran when asked.")
    state = FSMField(default=InputState.OPEN, choices=InputState.choices, protected=True)
    group = models.CharField(max_length=150, help_text="The group that answers now.")
    assignee = models.CharField(max_length=150, blank=True,
                                help_text="The one person who answers before any escalation.")
    escalation_level = models.PositiveSmallIntegerField(default=0,
                                                        help_text="1 once escalated.")
    escalate_at = models.DateTimeField(null=True, blank=True)
    instructions = models.TextField(blank=True)
    evidence = models.JSONField(default=list, help_text="[{name, value}], rendered at start.")
    form = models.JSONField(default=dict, help_text="The JSON Schema the answer must satisfy.")
    allow_abstain = models.BooleanField(default=False)
    separation_of_duties = models.BooleanField(default=False)
    requested_at = models.DateTimeField(default=now)
    deadline_at = models.DateTimeField()
    answer = models.JSONField(null=True, blank=True)
    note = models.TextField(blank=True)
    answered_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                    on_delete=models.SET_NULL, related_name="+")
    answered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-requested_at"]
        indexes = [
            models.Index(fields=["state", "deadline_at"], name="input_state_deadline"),
            # The input-task list: a keyset page by deadline, by state or not.
            models.Index(fields=["deadline_at", "id"], name="input_deadline_id"),
            models.Index(fields=["state", "deadline_at", "id"], name="input_state_deadline_id"),
        ]
        constraints = [
            models.UniqueConstraint(fields=["step"], condition=models.Q(state="open"),
                                    name="one_open_input_task_per_step"),
        ]

    def __str__(self) -> str:
        return f"input task {self.pk} for {self.step.name} ({self.state})"

    @transition(field=state, source=InputState.OPEN, target=InputState.ANSWERED)
    def give(self, *, user, answer: dict, note: str) -> None:
        self.answer, self.note, self.answered_by, self.answered_at = answer, note, user, now()

    @transition(field=state, source=InputState.OPEN, target=InputState.ABSTAINED)
    def abstain(self, *, user, note: str) -> None:
        """The person cannot decide: an answer of its own, which the definition routes on."""
        self.answer, self.note, self.answered_by, self.answered_at = None, note, user, now()

    @transition(field=state, source=InputState.OPEN, target=InputState.OPEN)
    def escalate(self, *, group: str) -> None:
        """Unanswered at `escalate_after_s`: the escalation group answers from now on."""
        self.group, self.assignee, self.escalation_level, self.escalate_at = group, "", 1, None

    @transition(field=state, source=InputState.OPEN, target=InputState.EXPIRED)
    def expire(self) -> None:
        self.answered_at = now()

    @transition(field=state, source=InputState.OPEN, target=InputState.CANCELLED)
    def cancel(self) -> None:
        self.answered_at = now()
