"""Approval requests: a human gate's question, bound to the exact data it approves."""
from django.conf import settings
from django.db import models
from django_fsm import ConcurrentTransitionMixin, FSMField, transition

from orchestrator.clock import now


class ApprovalState(models.TextChoices):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


class ApprovalRequest(ConcurrentTransitionMixin, models.Model):
    step = models.OneToOneField("orchestrator.StepRun", on_delete=models.CASCADE, related_name="approval")
    run = models.ForeignKey("orchestrator.Run", on_delete=models.CASCADE, related_name="approvals")
    state = FSMField(default=ApprovalState.PENDING, choices=ApprovalState.choices, protected=True)
    approvers = models.CharField(max_length=150, help_text="Group whose members may decide.")
    instructions = models.TextField(blank=True)
    context = models.JSONField(default=dict, help_text="The upstream outputs shown to the reviewer.")
    proposal_hash = models.CharField(max_length=64, help_text="SHA-256 of the canonical context.")
    requested_at = models.DateTimeField(default=now)
    deadline_at = models.DateTimeField()
    decided_at = models.DateTimeField(null=True, blank=True)
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL)
    note = models.TextField(blank=True)

    class Meta:
        ordering = ["-requested_at"]
        indexes = [models.Index(fields=["state", "deadline_at"], name="approval_state_deadline")]

    def __str__(self) -> str:
        return f"approval for {self.step} ({self.state})"

    @transition(field=state, source=ApprovalState.PENDING, target=ApprovalState.APPROVED)
    def approve(self, *, user, note: str) -> None:
        self.decided_by, self.note, self.decided_at = user, note, now()

    @transition(field=state, source=ApprovalState.PENDING, target=ApprovalState.REJECTED)
    def reject(self, *, user, note: str) -> None:
        self.decided_by, self.note, self.decided_at = user, note, now()

    @transition(field=state, source=ApprovalState.PENDING, target=ApprovalState.EXPIRED)
    def expire(self) -> None:
        self.decided_at = now()

    @transition(field=state, source=ApprovalState.PENDING, target=ApprovalState.CANCELLED)
    def cancel(self) -> None:
        self.decided_at = now()
