"""A notification: what to tell whom, and how far its delivery got.

Written by `notifications.services.notification_send` in the transaction of the change it
reports; delivered after commit by `notifications.delivery`, which records each channel's
success so a retry never repeats a channel that already went out.
"""
from django.db import models

from orchestrator.engine.clock import now


class Notification(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending"
        SENT = "sent"
        FAILED = "failed"

    kind = models.CharField(max_length=64, help_text="What happened, e.g. approval.requested.")
    subject = models.CharField(max_length=200)
    body = models.TextField(help_text="Plain text.")
    link = models.URLField(max_length=500, blank=True, help_text="Where to act on it.")
    recipients = models.JSONField(default=list, help_text="E-mail addresses.")
    webhook = models.BooleanField(default=True, help_text="Also post to the outgoing webhook.")
    team = models.CharField(max_length=50, blank=True,
                            help_text="The team whose egress policy the webhook call follows.")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    created_at = models.DateTimeField(default=now)
    next_attempt_at = models.DateTimeField(default=now, help_text="When the sweep sends it again.")
    email_sent_at = models.DateTimeField(null=True, blank=True)
    webhook_sent_at = models.DateTimeField(null=True, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["status", "next_attempt_at"], name="notification_due")]

    def __str__(self) -> str:
        return f"{self.kind}: {self.subject}"


class RunCallback(models.Model):
    """Where to tell a client that its run waits, completed or failed: the `callback_url` given
    when the run was started (checked against the egress policy then), and the secret each
    delivery is signed with (HMAC-SHA256; docs/live.md#callbacks), sealed like webhook secrets."""

    run = models.OneToOneField("orchestrator.Run", on_delete=models.CASCADE, related_name="callback")
    url = models.URLField(max_length=2000)
    sealed_secret = models.TextField(help_text="The client's signing secret, sealed "
                                     "(orchestrator.engine.sealing.CALLBACK_SECRETS).")
    team = models.CharField(max_length=50, help_text="The team whose egress policy applies.")
    created_at = models.DateTimeField(default=now)

    def __str__(self) -> str:
        return f"{self.run_id} -> {self.url}"


class CallbackDelivery(models.Model):
    """One POST owed to a run's callback: one per outbox event it reports (unique), delivered
    at least once; the receiver tells repeats apart by `X-Stepwise-Delivery`."""

    class Status(models.TextChoices):
        PENDING = "pending"
        DELIVERED = "delivered"
        FAILED = "failed"

    callback = models.ForeignKey(RunCallback, on_delete=models.CASCADE, related_name="deliveries")
    event = models.OneToOneField("orchestrator.Event", on_delete=models.CASCADE,
                                 related_name="callback_delivery")
    kind = models.CharField(max_length=64, help_text="The run's event: run.waiting, run.completed...")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    created_at = models.DateTimeField(default=now)
    next_attempt_at = models.DateTimeField(default=now, help_text="When the sweep sends it again.")
    delivered_at = models.DateTimeField(null=True, blank=True)
    response_status = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["status", "next_attempt_at"], name="callback_due")]

    def __str__(self) -> str:
        return f"{self.kind} -> {self.callback.url} ({self.status})"
