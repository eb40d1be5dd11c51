"""Celery entry point of notifications: thin, delegates to the delivery."""
from celery import shared_task

from .delivery import notification_deliver


@shared_task(name="notifications.tasks.deliver", ignore_result=True)
def deliver(notification_id: int) -> None:
    """Send one notification; a failure waits for the reaper's resend sweep."""
    notification_deliver(notification_id=notification_id)
