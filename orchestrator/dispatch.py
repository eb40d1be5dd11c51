"""Sending work to the broker — always after the transaction that decided it commits.

Every function here registers a `transaction.on_commit` callback; nothing is sent if the
transaction rolls back, and a message is only ever a reference (ids), never state.

Sending is best effort: if the broker is down, the error is logged and the caller goes on,
because what was decided is already committed. Every message has a backstop in the reaper's
sweep of persisted state (queued steps, due retries, waiting maps and parents, compensating
runs), so a message that was never sent is sent again once the broker is back.
"""
from functools import partial

from django.db import transaction

from .definitions import calls_model

after_commit = partial(transaction.on_commit, robust=True)


def queue_for(spec: dict) -> str:
    """The queue a step (or a map item body) runs on: agent.<model>, tools or orchestrator.

    A router that asks a model (strategy: llm) runs where that model's calls run, so a slow
    model never holds up the orchestrator queue.
    """
    if calls_model(spec):
        return f"agent.{spec['model']}"
    if spec["type"] == "tool":
        return "tools"
    return "orchestrator"


def step_dispatch_on_commit(step_id: int, queue: str) -> None:
    from .tasks import execute_step

    after_commit(lambda: execute_step.apply_async((step_id,), queue=queue))


def retry_due_on_commit(step_id: int, delay_s: float) -> None:
    """A short retry delay may wait in the broker; the reaper's sweep is the backstop."""
    from .tasks import retry_due

    after_commit(
        lambda: retry_due.apply_async((step_id,), countdown=delay_s, queue="orchestrator")
    )


def map_dispatch_on_commit(step_id: int, indexes: list[int], item_queue: str) -> None:
    """Fan a map step out as a Celery chord: one task per item, the join as the chord body."""
    from celery import chord

    from .tasks import map_item, map_join

    def send() -> None:
        header = [map_item.si(step_id, i).set(queue=item_queue) for i in indexes]
        chord(header)(map_join.si(step_id).set(queue="orchestrator"))

    after_commit(send)


def map_items_redispatch_on_commit(step_id: int, delays: dict[int, float], item_queue: str) -> None:
    """Send items again outside the chord, each after its delay in seconds (index -> delay);
    the reaper joins when they are all done."""
    from .tasks import map_item

    after_commit(lambda: [map_item.apply_async((step_id, index), queue=item_queue,
                                               countdown=delay or None)
                          for index, delay in delays.items()])


def child_finished_on_commit(parent_step_id: int) -> None:
    from .tasks import child_finished

    after_commit(lambda: child_finished.apply_async((parent_step_id,), queue="orchestrator"))


def compensate_on_commit(run_id, delay_s: float = 0) -> None:
    from .tasks import compensate_run

    after_commit(lambda: compensate_run.apply_async((str(run_id),), countdown=delay_s or None,
                                                    queue="tools"))
