"""Celery entry points. Each takes ids, re-reads state through a service, and delegates.

Any message may be a replay; the services make a replay do nothing. Services send these tasks
by name (`orchestrator.engine.dispatch`); nothing below this module imports it.
"""
import random

from celery import shared_task
from celery.utils.log import get_task_logger

from .engine.keys import worker_id
from .engine.services import compensation, concurrency, reaper, reruns
from .engine.services.kinds import map_step, sub_workflow, worker

log = get_task_logger(__name__)


@shared_task(name="orchestrator.tasks.execute_step", bind=True)
def execute_step(self, step_id: int) -> None:
    """Claim a queued step, run its executor, commit the outcome (which schedules the next,
    and may hand this worker the run's next step on the same queue: `worker.Carry`)."""
    queue = (self.request.delivery_info or {}).get("routing_key")
    wait = worker.step_execute(step_id=step_id, worker=worker_id(),
                               carry=worker.Carry.for_message(queue))
    if wait:  # throttled by a shared rate limit: the step stays queued; come back later
        self.apply_async((step_id,), countdown=wait, queue=queue)


@shared_task(name="orchestrator.tasks.retry_due")
def retry_due(step_id: int) -> None:
    worker.step_retry_due(step_id=step_id)


@shared_task(name="orchestrator.tasks.map_item", ignore_result=False, bind=True, max_retries=None)
def map_item(self, step_id: int, index: int) -> None:
    """One item of a map step. Its result is persisted; the chord only counts completions."""
    outcome = map_step.map_item_run(step_id=step_id, index=index)
    if outcome.verdict == map_step.DEFERRED:
        # Back of the queue (a retry keeps the chord waiting for this item), so other runs'
        # work interleaves with a large fan-out; or after the wait its provider quota names.
        raise self.retry(countdown=outcome.delay_s or random.uniform(0.05, 0.25))
    if outcome.verdict == map_step.RETRY:  # the item's retry policy, the chord still waiting
        raise self.retry(countdown=outcome.delay_s)


@shared_task(name="orchestrator.tasks.map_join")
def map_join(step_id: int) -> None:
    map_step.map_join(step_id=step_id)


@shared_task(name="orchestrator.tasks.child_start")
def child_start(parent_step_id: int) -> None:
    sub_workflow.child_run_start(parent_step_id=parent_step_id)


@shared_task(name="orchestrator.tasks.child_finished")
def child_finished(parent_step_id: int) -> None:
    sub_workflow.child_finished(parent_step_id=parent_step_id)


@shared_task(name="orchestrator.tasks.release_held_runs")
def release_held_runs(workflow_id: int, key: str) -> None:
    concurrency.held_runs_release(workflow_id=workflow_id, key=key)


@shared_task(name="orchestrator.tasks.compensate_run")
def compensate_run(run_id: str) -> None:
    compensation.run_compensate(run_id=run_id)


@shared_task(name="orchestrator.tasks.rerun_advance", ignore_result=True)
def rerun_advance(rerun_id: int) -> None:
    """Start the next chunk of a bulk re-run's runs (which sends the rest on)."""
    reruns.rerun_advance(rerun_id=rerun_id)


@shared_task(name="orchestrator.tasks.reruns_sweep", ignore_result=True)
def reruns_sweep() -> None:
    reruns.reruns_sweep()


# Every few seconds from beat: no result, no task events (it would flood Flower's task list),
# and its report at debug level: what it changed is logged by the events it wrote.
@shared_task(name="orchestrator.tasks.reap", ignore_result=True, send_events=False)
def reap() -> None:
    report = reaper.reap()
    if any(report.values()):
        log.debug("reaper: %s", report)
