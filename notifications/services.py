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

from orchestrator.engine.clock import now
from orchestrator.engine.sealing import CALLBACK_SECRETS
from orchestrator.integrations.egress import policy_for, url_problems

from .models import CallbackDelivery, Notification, RunCallback

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


# --- run callbacks (docs/live.md#callbacks) --------------------------------------------------

CALLBACK_RESEND_AFTER = timedelta(seconds=60)
CALLBACK_MAX_ATTEMPTS = 8
CALLBACK_SECRET_MIN = 16


def callback_problems(*, url: str, secret: str, team: str) -> list[dict]:
    """Why a run may not call `url` back ([] if it may): the URL must be one the team's egress
    policy allows (tool name `run.callback`), and a signing secret is required with it."""
    problems = []
    if not url.startswith(("http://", "https://")):
        problems.append({"path": "callback_url", "message": "must be an http(s) URL"})
    else:
        problems += [{"path": "callback_url", "message": message}
                     for message in url_problems(url, policy_for(tool="run.callback", team=team))]
    if len(secret) < CALLBACK_SECRET_MIN:
        problems.append({"path": "callback_secret", "message": f"a signing secret of at least "
                         f"{CALLBACK_SECRET_MIN} characters is required with callback_url"})
    return problems


def run_callback_register(*, run, url: str, secret: str, team: str) -> RunCallback:
    """Record a run's callback, in the transaction that creates the run (`run_start` checked
    it with `callback_problems` first)."""
    return RunCallback.objects.create(run=run, url=url, sealed_secret=CALLBACK_SECRETS.seal(secret),
                                      team=team)


def callbacks_reseal() -> int:
    """Re-encrypt every run's callback secret under the current key (after a key rotation, with
    the old key among the fallbacks). Returns how many were resealed."""
    count = 0
    for callback_id, sealed in RunCallback.objects.values_list("id", "sealed_secret").iterator():
        RunCallback.objects.filter(id=callback_id).update(
            sealed_secret=CALLBACK_SECRETS.reseal(sealed))
        count += 1
    return count


def _dispatch_callback(delivery_id: int) -> None:
    current_app.send_task("notifications.tasks.deliver_callback", (delivery_id,), queue="orchestrator")


def callbacks_resend(*, limit: int = 200) -> int:
    """Send again every callback delivery that is due (a lost message, a failed attempt)."""
    due = list(CallbackDelivery.objects.filter(status=CallbackDelivery.Status.PENDING,
                                               next_attempt_at__lte=now())
               .values_list("id", flat=True)[:limit])
    with transaction.atomic():
        CallbackDelivery.objects.filter(id__in=due).update(next_attempt_at=now() + CALLBACK_RESEND_AFTER)
        for delivery_id in due:
            transaction.on_commit(lambda d=delivery_id: _dispatch_callback(d), robust=True)
    return len(due)
