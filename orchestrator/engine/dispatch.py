"""Sending work to the broker — always after the transaction that decided it commits.

Every function here registers a `transaction.on_commit` callback; nothing is sent if the
transaction rolls back, and a message is only ever a reference (ids), never state.

Sending is best effort: if the broker is down, the error is logged and the caller goes on,
because what was decided is already committed. Every message has a backstop in the reaper's
sweep of persisted state (queued steps, due retries, waiting maps and parents, compensating
runs), so a message that was never sent is sent again once the broker is back.

Tasks are sent by name (`orchestrator.tasks.*`), never imported: the services that call these
sit below the Celery entry points in the import graph.

A message about a step carries its run id and step name as headers (`stepwise_run`,
`stepwise_step`; the worker's log lines take them, `orchestrator.signals`) and in its kwargs
representation (what Flower shows), and the sender's trace as `traceparent`
(`orchestrator.operations.tracing`), so Flower rows, logs and traces join up with runs.
"""
import time
from functools import partial

from celery import chord, current_app, signature
from django.db import transaction

from orchestrator.operations import tracing
from orchestrator.operations.queues import BATCH_SUFFIX

from .capacity import queue_suffix
from .definitions import calls_model
from .states import RunCapacity

after_commit = partial(transaction.on_commit, robust=True)
# A retry due sooner than this waits in the broker (countdown); later ones wait in the
# database, for the reaper's sweep.
BROKER_DELAY_LIMIT_S = 30


def about(run_id=None, step_name: str = "") -> dict:
    """The options that name a message's run and step to workers, logs, traces and Flower."""
    # `sent_at` lets the operations page tell how long the oldest message of a Redis queue has
    # waited (orchestrator/operations/queues.py): Kombu's messages carry no time of their own.
    headers = {**tracing.headers_out(), "sent_at": time.time()}
    named = {}
    if run_id:
        headers["stepwise_run"] = named["run"] = str(run_id)
    if step_name:
        headers["stepwise_step"] = named["step"] = step_name
    return {"headers": headers, "kwargsrepr": repr(named)} if named else {"headers": headers}


def _send(task: str, args: tuple, *, run_id=None, step_name: str = "", **options) -> None:
    # It asks for no result (orchestrator/celery.py: Stepwise.send_task).
    current_app.send_task(f"orchestrator.tasks.{task}", args, **about(run_id, step_name),
                          **options)


def queue_for(spec: dict, *, capacity: str = RunCapacity.INTERACTIVE) -> str:
    """The queue a step (or a map item body) runs on: agent.<model>, tools or orchestrator,
    on the side of its run's capacity class (`.batch`, `.evaluation`, `.<class>`; the plain
    queue for an interactive run).

    A router that asks a model (strategy: llm) runs where that model's calls run, so a slow
    model never holds up the orchestrator queue.
    """
    if calls_model(spec):
        queue = f"agent.{spec['model']}"
    elif spec["type"] == "tool":
        queue = "tools"
    else:
        # Batch has no orchestrator side: these steps decide and wait, calling nothing scarce.
        queue = "orchestrator"
        if capacity == RunCapacity.BATCH:
            return queue
    return queue + queue_suffix(capacity)


# Map items are batch work: they go to a queue of their own beside the interactive one
# (tools.batch, agent.<model>.batch), consumed by the same workers unless a deployment gives
# batch its own. A worker consuming both takes from them in turn (Kombu's fair cycle over a
# consumer's queues), so the hundreds of items of one fan-out never stand in front of another
# run's step: it waits for at most one item per worker process (docs/benchmark.md).
# A run of another class has items of that class: they go where its steps go.
def batch_queue_for(item_spec: dict, *, capacity: str = RunCapacity.INTERACTIVE) -> str:
    """The queue a map item body runs on: its step type's queue, batch side (its class's side
    for a run of another class than interactive)."""
    if capacity != RunCapacity.INTERACTIVE:
        return queue_for(item_spec, capacity=capacity)
    return queue_for(item_spec) + BATCH_SUFFIX


def step_dispatch_on_commit(step_id: int, queue: str, *, run_id=None, step_name: str = "") -> None:
    after_commit(lambda: _send("execute_step", (step_id,), queue=queue, run_id=run_id,
                               step_name=step_name))


def retry_due_on_commit(step_id: int, delay_s: float, *, run_id=None, step_name: str = "") -> None:
    """A short retry delay may wait in the broker; the reaper's sweep is the backstop."""
    after_commit(lambda: _send("retry_due", (step_id,), countdown=delay_s, queue="orchestrator",
                               run_id=run_id, step_name=step_name))


def map_dispatch_on_commit(step_id: int, indexes: list[int], item_queue: str, *, run_id=None,
                           step_name: str = "") -> None:
    """Fan a map step out as a Celery chord: one task per item, the join as the chord body."""

    def send() -> None:
        named = about(run_id, step_name)
        # The chord counts its header's results: they are stored, however the items are sent.
        header = [signature("orchestrator.tasks.map_item", (step_id, i), immutable=True,
                            queue=item_queue, ignore_result=False, **named) for i in indexes]
        join = signature("orchestrator.tasks.map_join", (step_id,), immutable=True,
                         queue="orchestrator", **named)
        chord(header, app=current_app)(join)

    after_commit(send)


def map_items_redispatch_on_commit(step_id: int, delays: dict[int, float], item_queue: str) -> None:
    """Send items again outside the chord, each after its delay in seconds (index -> delay);
    the reaper joins when they are all done."""
    after_commit(lambda: [_send("map_item", (step_id, index), queue=item_queue,
                                countdown=delay or None)
                          for index, delay in delays.items()])


def child_start_on_commit(parent_step_id: int, *, run_id=None, step_name: str = "") -> None:
    """A worker creates the child run of a sub-workflow step (never the transaction that
    started the step: a request would otherwise recurse through workflows calling each other)."""
    after_commit(lambda: _send("child_start", (parent_step_id,), run_id=run_id,
                               step_name=step_name, queue="orchestrator"))


def held_runs_release_on_commit(workflow_id: int, key: str) -> None:
    """Let the runs held behind a concurrency key go (services/concurrency.py)."""
    after_commit(lambda: _send("release_held_runs", (workflow_id, key), queue="orchestrator"))


def child_finished_on_commit(parent_step_id: int) -> None:
    after_commit(lambda: _send("child_finished", (parent_step_id,), queue="orchestrator"))


def compensate_on_commit(run_id, delay_s: float = 0, *,
                         capacity: str = RunCapacity.INTERACTIVE) -> None:
    """Compensations call tools: on the tools queue (its class's side of it)."""
    queue = "tools" + queue_suffix(capacity)
    after_commit(lambda: _send("compensate_run", (str(run_id),), countdown=delay_s or None,
                               queue=queue))


def callback_on_commit(delivery_id: int) -> None:
    """POST a run's callback (notifications/callbacks.py) once the event it reports commits."""
    after_commit(lambda: current_app.send_task("notifications.tasks.deliver_callback",
                                               (delivery_id,), queue="orchestrator"))
