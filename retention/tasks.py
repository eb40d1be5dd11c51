"""Celery entry points of retention, sent by beat (CELERY_BEAT_SCHEDULE "stepwise-retention"
on the orchestrator queue, "stepwise-retention-ledger" on the audit queue, where the signing
key is): thin, each delegates to one service."""
from celery import shared_task

from .sweep import ledger_prune_due, retention_sweep


@shared_task(name="retention.tasks.sweep", ignore_result=True)
def sweep() -> None:
    retention_sweep()


@shared_task(name="retention.tasks.prune_ledger", ignore_result=True)
def prune_ledger() -> None:
    ledger_prune_due()
