"""The one notification service: record a notification, deliver it after commit.

`notification_send` runs inside the caller's transaction, so a notification exists exactly when
the change it reports committed; its delivery is sent to a worker (by name,
`notifications.tasks.deliver`) only after that commit. `notifications_resend` is the backstop
the reaper calls for deliveries whose message was lost or that failed and are due again.

Nothing here makes a network call.
"""
from datetime import timedelta

from celery import current_app
from django.conf import settings
from django.db import transaction

from orchestrator.clock import now

from .models import Notification

# A notification nobody delivered this long after it was due is sent again by the sweep.
RESEND_AFTER = timedelta(seconds=60)
MAX_ATTEMPTS = 5


def notification_send(*, kind: str, subject: str, body: str, link: str = "",
                      recipients: list[str] | tuple[str, ...] = (), team: str = "",
                      webhook: bool = True) -> Notification | None:
    """Record a notification to `recipients` (e-mail addresses) and, with `webhook`, to the
    outgoing webhook (STEPWISE_NOTIFY_WEBHOOK_URL); deliver it once the transaction commits.

    Returns None when there is nobody to tell. Raises ValueError for an empty subject or body:
    a notification says something real or is not sent.
    """
    if not subject.strip() or not body.strip():
        raise ValueError("a notification needs a subject and a body")
    addresses = sorted({address for address in recipients if address})
    webhook = webhook and bool(settings.STEPWISE_NOTIFY_WEBHOOK_URL)
    if not addresses and not webhook:
        return None
    notification = Notification.objects.create(
        kind=kind, subject=subject[:200], body=body, link=link, recipients=addresses,
        webhook=webhook, team=team, next_attempt_at=now() + RESEND_AFTER)
    transaction.on_commit(lambda: _dispatch(notification.id), robust=True)
    return notification


def _dispatch(notification_id: int) -> None:
    current_app.send_task("notifications.tasks.deliver", (notification_id,), queue="orchestrator")


def notifications_resend(*, limit: int = 200) -> int:
    """Send again every pending notification that is due (a lost message, a failed attempt)."""
    due = list(Notification.objects.filter(status=Notification.Status.PENDING,
                                           next_attempt_at__lte=now())
               .values_list("id", flat=True)[:limit])
    with transaction.atomic():
        Notification.objects.filter(id__in=due).update(next_attempt_at=now() + RESEND_AFTER)
        for notification_id in due:
            transaction.on_commit(lambda n=notification_id: _dispatch(n), robust=True)
    return len(due)
