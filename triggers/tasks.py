"""Celery entry points of triggers: thin, each calls one service.

`schedule_fire` is what beat's database scheduler sends for a schedule (its PeriodicTask, written
by `triggers.services.config`); any delivery of it may be a duplicate, which the slot keys make
harmless. `admit_queued` starts the firings admission control held back. `record_refusals`
writes each passed minute of webhook posts refused unauthenticated as one ledger entry.
"""
from celery import shared_task
from celery.utils.log import get_task_logger

from .services.firing import queued_firings_admit
from .services.schedules import schedule_tick
from .services.webhooks import refusal_tallies_record

log = get_task_logger(__name__)


@shared_task(name="triggers.tasks.schedule_fire")
def schedule_fire(trigger_id: str) -> None:
    outcomes = schedule_tick(trigger_id=trigger_id)
    for outcome in outcomes:
        if not outcome.accepted:
            log.warning("schedule %s: slot %s %s", trigger_id, outcome.status, outcome.reason)


@shared_task(name="triggers.tasks.admit_queued")
def admit_queued() -> None:
    started = queued_firings_admit()
    if started:
        log.info("triggers: started %d held firing(s)", started)


@shared_task(name="triggers.tasks.record_refusals", ignore_result=True)
def record_refusals() -> None:
    refusal_tallies_record()
