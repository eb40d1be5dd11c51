"""Celery entry points of the audit ledger: thin, each delegates to one service.

Both run on the `audit` queue, so only the worker that holds the signing key consumes them
(docs/security.md). `checkpoint` is polled by beat (CELERY_BEAT_SCHEDULE
"stepwise-audit-checkpoint") and sent once with `at_start` when a worker consuming `audit`
becomes ready and when beat starts, so a checkpoint is written at start rather than one
interval later; several processes sending it at once is harmless (the head is signed once
more at most). `verify` runs an auditor's verification and `export` an auditor's export
(`audit.verification`).
"""
from celery import shared_task
from celery.signals import beat_init, worker_ready

from .anchoring import checkpoint_if_due
from .verification import ledger_export_run, ledger_verification_run

QUEUE = "audit"
CHECKPOINT = "audit.tasks.checkpoint"


@shared_task(name=CHECKPOINT, ignore_result=True)
def checkpoint(at_start: bool = False) -> None:
    """Sign the ledger's head into the checkpoint store when a checkpoint is due."""
    checkpoint_if_due(reason="start" if at_start else "schedule", at_start=at_start)


@shared_task(name="audit.tasks.verify", ignore_result=True)
def verify(verification_id: int) -> None:
    ledger_verification_run(verification_id=verification_id)


@shared_task(name="audit.tasks.export", ignore_result=True)
def export(export_id: int) -> None:
    ledger_export_run(export_id=export_id)


@worker_ready.connect
def checkpoint_when_an_audit_worker_starts(sender=None, **kwargs) -> None:
    queues = {queue.name for queue in getattr(sender.task_consumer, "queues", [])} if sender else set()
    if QUEUE in queues:
        sender.app.send_task(CHECKPOINT, kwargs={"at_start": True}, queue=QUEUE)


@beat_init.connect
def checkpoint_when_beat_starts(sender=None, **kwargs) -> None:
    sender.app.send_task(CHECKPOINT, kwargs={"at_start": True}, queue=QUEUE)
