"""Celery entry points of the audit ledger: thin, each delegates to one service.

`checkpoint` is scheduled by beat (CELERY_BEAT_SCHEDULE "stepwise-audit-checkpoint") on the
`audit` queue, so only the worker that holds the signing key consumes it (docs/security.md).
"""
from celery import shared_task

from .anchoring import checkpoint_write


@shared_task(name="audit.tasks.checkpoint", ignore_result=True)
def checkpoint() -> None:
    """Sign the ledger's head into AUDIT_CHECKPOINT_DIR, unless the newest file records it."""
    checkpoint_write(reason="schedule", skip_if_unchanged=True)
