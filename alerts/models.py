"""Alert rules an operator overrides, and the alerts raised: one row per condition per run.

`AlertRule` rows override the defaults in `alerts.rules` for a team or one workflow.
`Alert.key` is unique: whatever reports a condition twice (a replayed event, a second scan,
two beats) finds the row and raises nothing new. `AlertCursor` is where the outbox reader
stopped. Written only by `alerts.services`.
"""
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models

from orchestrator.engine.clock import now
from orchestrator.models import Run, Team, Workflow

from .rules import RuleKind, Severity


class AlertRule(models.Model):
    """An override of one rule's default for a team, or for one workflow (more specific wins)."""

    kind = models.CharField(max_length=32, choices=[(k.value, k.value) for k in RuleKind])
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="alert_rules")
    workflow = models.ForeignKey(Workflow, null=True, blank=True, on_delete=models.CASCADE,
                                 related_name="alert_rules",
                                 help_text="Empty: the rule for every workflow of the team.")
    enabled = models.BooleanField(default=True)
    threshold = models.FloatField(null=True, blank=True,
                                  help_text="Empty: the default threshold (docs/operations.md).")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["kind", "team", "workflow"], name="alert_rule_per_scope"),
            models.UniqueConstraint(fields=["kind", "team"], condition=models.Q(workflow__isnull=True),
                                    name="alert_rule_per_team"),
        ]
        ordering = ["team", "kind"]

    def __str__(self) -> str:
        scope = self.workflow.name if self.workflow_id else "every workflow"
        return f"{self.kind} for {self.team} ({scope})"

    def clean(self) -> None:
        if self.workflow_id and self.workflow.team_id != self.team_id:
            raise ValidationError({"workflow": "the workflow belongs to another team"})
        if self.threshold is not None and self.threshold < 0:
            raise ValidationError({"threshold": "a threshold is never negative"})


class AlertState(models.TextChoices):
    OPEN = "open"
    ACKNOWLEDGED = "acknowledged"
    RESOLVED = "resolved"


class Alert(models.Model):
    key = models.CharField(max_length=255, unique=True,
                           help_text="The condition: one alert per key, ever.")
    rule = models.CharField(max_length=32, choices=[(k.value, k.value) for k in RuleKind])
    severity = models.CharField(max_length=16, choices=[(s.value, s.value) for s in Severity])
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="alerts")
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.CASCADE,
                            related_name="alerts")
    subject = models.CharField(max_length=200)
    body = models.TextField()
    state = models.CharField(max_length=16, choices=AlertState.choices, default=AlertState.OPEN)
    notification = models.ForeignKey("notifications.Notification", null=True, blank=True,
                                     on_delete=models.SET_NULL)
    created_at = models.DateTimeField(default=now, db_index=True)
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    acknowledged_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                        on_delete=models.SET_NULL, related_name="+")
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolved_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                    on_delete=models.SET_NULL, related_name="+")

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["state", "created_at"], name="alert_state_created")]

    def __str__(self) -> str:
        return f"{self.rule}: {self.subject}"


class AlertCursor(models.Model):
    """How far a reader of the outbox got: the id of the last `Event` it handled."""

    name = models.CharField(max_length=64, unique=True)
    last_event_id = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(default=now)

    def __str__(self) -> str:
        return f"{self.name} at event {self.last_event_id}"
