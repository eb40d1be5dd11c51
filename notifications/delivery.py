"""Delivering a notification: e-mail through Django's mail framework, and an outgoing webhook
with a Slack-compatible payload through the egress policy (`orchestrator.integrations.egress`).

Runs on a worker, outside any transaction. Each channel's success is recorded, so a retry
(the task's, or the reaper's `notifications_resend`) never sends a channel twice; a failure is
retried with a growing delay, up to `MAX_ATTEMPTS`.
"""
import logging
from datetime import timedelta

from django.conf import settings
from django.core.mail import EmailMessage, get_connection

from orchestrator.engine.clock import now
from orchestrator.integrations.egress import policy_for, request

from .models import Notification
from .services import MAX_ATTEMPTS

log = logging.getLogger(__name__)
WEBHOOK_DEADLINE_S = 10


def notification_deliver(*, notification_id: int) -> bool:
    """Send one notification. True once every channel went out (or it had been sent)."""
    notification = Notification.objects.filter(id=notification_id).first()
    if notification is None or notification.status != Notification.Status.PENDING:
        return notification is not None and notification.status == Notification.Status.SENT
    errors = []
    if notification.recipients and notification.email_sent_at is None:
        try:
            _send_email(notification)
            notification.email_sent_at = now()
        except Exception as exc:  # SMTP and backends raise many kinds; all mean "try later"
            errors.append(f"e-mail: {type(exc).__name__}: {exc}")
    if notification.webhook and notification.webhook_sent_at is None:
        try:
            _post_webhook(notification)
            notification.webhook_sent_at = now()
        except Exception as exc:  # egress refusals, timeouts, HTTP errors: all "try later"
            errors.append(f"webhook: {type(exc).__name__}: {exc}")
    notification.attempts += 1
    if errors:
        notification.error = "; ".join(errors)[:2000]
        if notification.attempts >= MAX_ATTEMPTS:
            notification.status = Notification.Status.FAILED
        notification.next_attempt_at = now() + timedelta(seconds=30 * 2 ** notification.attempts)
        log.warning("notification %s not delivered (attempt %s): %s", notification.id,
                    notification.attempts, notification.error)
    else:
        notification.status, notification.sent_at, notification.error = (
            Notification.Status.SENT, now(), "")
    notification.save()
    return not errors


def _text(notification: Notification) -> str:
    return f"{notification.body}\n\n{notification.link}\n" if notification.link else notification.body


def _send_email(notification: Notification) -> None:
    """One message per recipient: no recipient sees who else was told."""
    with get_connection() as connection:
        for address in notification.recipients:
            EmailMessage(notification.subject, _text(notification),
                         settings.DEFAULT_FROM_EMAIL, [address], connection=connection).send()


def webhook_payload(notification: Notification) -> dict:
    """Slack's incoming-webhook shape ({"text"} with mrkdwn links); Mattermost, Rocket.Chat and
    most chat tools accept it too."""
    text = f"*{notification.subject}*\n{notification.body}"
    if notification.link:
        text += f"\n<{notification.link}|Open in Stepwise>"
    return {"text": text}


def _post_webhook(notification: Notification) -> None:
    url = settings.STEPWISE_NOTIFY_WEBHOOK_URL
    policy = policy_for(tool="notify.webhook", team=notification.team)
    response = request("POST", url, policy=policy, deadline_s=WEBHOOK_DEADLINE_S,
                       json=webhook_payload(notification))
    if not 200 <= response.status_code < 300:
        raise RuntimeError(f"the webhook answered {response.status_code}")
