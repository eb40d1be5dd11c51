"""Retention policies (how long each kind of row of a team or a workflow is kept), legal holds
(a run or a team whose rows retention skips)..

Plain data and invariants only: policies are set and holds placed or released through
`retention.services`, which checks the permission and the deployment's limits and audits.
"""
from django.conf import settings
from django.db import models
from django.db.models import Q

from orchestrator.engine.clock import now
from orchestrator.models import Run, Team, Workflow


class Kind(models.TextChoices):
    """What a policy applies to (docs/operations.md#retention)."""

    RUNS = "runs", "runs and everything under them (steps, attempts, map items, events, ...)"
    NOTIFICATIONS = "notifications", "notifications sent or given up"
    FIRINGS = "firings", "trigger firings"
    DEAD_LETTERS = "dead_letters", "trigger events that were dead-lettered"
    LEDGER = "ledger", "audit ledger entries (the ledger is pruned as one chain)"


# Kinds whose rows name a workflow, so a workflow's own policy can override its team's.
PER_WORKFLOW = frozenset({Kind.RUNS, Kind.FIRINGS, Kind.DEAD_LETTERS})


class RetentionPolicy(models.Model):
    """Rows of `kind` of `team` (or only of `workflow`) are deleted `days` after they ended."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="retention_policies")
    workflow = models.ForeignKey(Workflow, null=True, blank=True, on_delete=models.CASCADE,
                                 related_name="retention_policies",
                                 help_text="Blank: every workflow of the team without its own policy.")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    days = models.PositiveIntegerField(help_text="Kept this many days after the row ended.")
    updated_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    updated_at = models.DateTimeField(default=now)

    class Meta:
        verbose_name_plural = "retention policies"
        ordering = ["team", "kind", "workflow"]
        constraints = [
            models.UniqueConstraint(fields=["team", "kind"], condition=Q(workflow__isnull=True),
                                    name="retention_one_policy_per_team_kind"),
            models.UniqueConstraint(fields=["workflow", "kind"], condition=Q(workflow__isnull=False),
                                    name="retention_one_policy_per_workflow_kind"),
        ]

    def __str__(self) -> str:
        return f"{self.team}/{self.workflow.name if self.workflow_id else '*'}: {self.kind} {self.days} days"


class LegalHold(models.Model):
    """A run, or a whole team, that retention leaves alone while the hold is in force: its rows,
    the artifacts they reference and its ledger entries (the ledger prune stops before them)."""

    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="legal_holds")
    # Retention never deletes a run under a hold in force; a released hold goes with its run
    # (the ledger keeps its placing and release).
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.CASCADE,
                            related_name="legal_holds", help_text="Blank: the whole team.")
    reason = models.TextField()
    placed_by = models.CharField(max_length=200)
    placed_at = models.DateTimeField(default=now)
    released_by = models.CharField(max_length=200, blank=True)
    released_at = models.DateTimeField(null=True, blank=True)
    release_reason = models.TextField(blank=True)

    class Meta:
        ordering = ["-placed_at"]
        indexes = [models.Index(fields=["released_at"], name="legal_hold_in_force")]

    def __str__(self) -> str:
        what = f"run {self.run_id}" if self.run_id else f"team {self.team}"
        return f"hold on {what}{' (released)' if self.released_at else ''}"

    @property
    def in_force(self) -> bool:
        return self.released_at is None

