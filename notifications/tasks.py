"""Celery entry point of notifications: thin, delegates to the delivery."""
from celery import shared_task

from .callbacks import callback_deliver
from .delivery import notification_deliver


@shared_task(name="notifications.tasks.deliver", ignore_result=True)
def deliver(notification_id: int) -> None:
    """Send one notification; a failure waits for the reaper's resend sweep."""
    notification_deliver(notification_id=notification_id)


@shared_task(name="notifications.tasks.deliver_callback", ignore_result=True)
def deliver_callback(delivery_id: int) -> None:
    """POST one run callback; a failure waits for the reaper's resend sweep."""
    callback_deliver(delivery_id=delivery_id)
