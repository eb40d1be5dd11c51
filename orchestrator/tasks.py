"""Celery entry points. Each takes ids, re-reads state through a service, and delegates.

Any message may be a replay; the services make a replay do nothing.
"""
import socket

from celery import shared_task
from celery.utils.log import get_task_logger

from .executors import ExecContext, execute
from .leases import lease_heartbeat
from .retry import StepError
from .services import compensation, fanout, reaper, steps

log = get_task_logger(__name__)
WORKER = f"{socket.gethostname()}"


@shared_task(name="orchestrator.tasks.execute_step")
def execute_step(step_id: int) -> None:
    """Claim a queued step, run its executor, commit the outcome (which schedules the next)."""
    claim = steps.step_claim(step_id=step_id, worker=WORKER)
    if claim is None:
        return
    ctx = ExecContext(str(claim.run_id), claim.workflow, claim.spec["name"],
                      claim.attempt, claim.idempotency_key, step_id=step_id)
    try:
        with lease_heartbeat(step_id=step_id, attempt=claim.attempt):
            result = execute(claim.spec, claim.step_input, ctx)
    except StepError as error:
        steps.step_fail(step_id=step_id, attempt=claim.attempt, error=error,
                        usage=steps.Usage(), worker=WORKER)
        return
    steps.step_succeed(step_id=step_id, attempt=claim.attempt, output=result.output,
                       usage=steps.Usage(result.tokens_in, result.tokens_out, result.cost_usd,
                                         result.model, result.provider), worker=WORKER)


@shared_task(name="orchestrator.tasks.retry_due")
def retry_due(step_id: int) -> None:
    steps.step_retry_due(step_id=step_id)


@shared_task(name="orchestrator.tasks.map_item", ignore_result=False)
def map_item(step_id: int, index: int) -> None:
    """One item of a map step. Its result is persisted; the chord only counts completions."""
    fanout.map_item_run(step_id=step_id, index=index)


@shared_task(name="orchestrator.tasks.map_join")
def map_join(step_id: int) -> None:
    fanout.map_join(step_id=step_id)


@shared_task(name="orchestrator.tasks.child_finished")
def child_finished(parent_step_id: int) -> None:
    fanout.child_finished(parent_step_id=parent_step_id)


@shared_task(name="orchestrator.tasks.compensate_run")
def compensate_run(run_id: str) -> None:
    compensation.run_compensate(run_id=run_id)


@shared_task(name="orchestrator.tasks.reap")
def reap() -> None:
    report = reaper.reap()
    if any(report.values()):
        log.info("reaper: %s", report)
