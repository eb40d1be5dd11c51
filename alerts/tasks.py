"""Celery entry point of alerts: beat sends `alerts.tasks.scan` (CELERY_BEAT_SCHEDULE)."""
from celery import shared_task

from .detection import alerts_scan


@shared_task(name="alerts.tasks.scan", ignore_result=True, send_events=False)
def scan() -> None:
    alerts_scan()
