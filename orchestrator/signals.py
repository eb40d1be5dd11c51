"""Worker heartbeats, a worker process's metrics at its start, and what every task's log lines
and spans carry.

Each worker process says it is alive in the database every few seconds. Health checks read
this table, so "workers seen" works on every broker, including the embedded filesystem
transport that has no broadcast.

Around each task, the ids its message carries (`stepwise_run`, `stepwise_step`, `traceparent`:
`orchestrator.engine.dispatch`) are bound for its log lines and the task is a span of the sender's
trace (`orchestrator.operations.tracing`); after it, they are forgotten.
"""
import os
import threading
from contextlib import ExitStack

from celery.signals import (
    task_postrun,
    task_prerun,
    worker_init,
    worker_process_init,
    worker_ready,
    worker_shutdown,
)
from django.db import close_old_connections

from .engine.clock import now
from .models import WorkerHeartbeat
from .operations import metrics, tracing
from .operations.logcontext import bind, clear

HEARTBEAT_S = 5
_stop = threading.Event()


def _beat(hostname: str, queues: list[str]) -> None:
    while not _stop.is_set():
        try:
            WorkerHeartbeat.objects.update_or_create(
                hostname=hostname, defaults={"queues": queues, "pid": os.getpid(), "last_seen": now()})
        except Exception:  # the database may be restarting; try again next beat
            close_old_connections()
        _stop.wait(HEARTBEAT_S)


@worker_ready.connect
def start_heartbeat(sender=None, **kwargs) -> None:
    queues = sorted(q.name for q in sender.app.amqp.queues.consume_from.values()) if sender else []
    threading.Thread(target=_beat, args=(sender.hostname, queues), daemon=True).start()


@worker_shutdown.connect
def stop_heartbeat(**kwargs) -> None:
    _stop.set()


@worker_init.connect
@worker_process_init.connect
def start_metrics(**kwargs) -> None:
    """The worker's main process (every pool) and each prefork child as it starts."""
    metrics.process_start()


@task_prerun.connect
@task_postrun.connect
def recycle_stale_connections(**kwargs) -> None:
    """Connections are reused across tasks (CELERY_DB_REUSE_MAX); drop any that broke or aged
    out (a database restart), as Django does around each request."""
    close_old_connections()


def _header(request, name: str) -> str:
    value = getattr(request, name, None) or (getattr(request, "headers", None) or {}).get(name)
    return value if isinstance(value, str) else ""


@task_prerun.connect
def enter_task_context(task=None, **kwargs) -> None:
    clear()
    if task is None:
        return
    request = task.request
    stack = ExitStack()
    stack.enter_context(tracing.continued(
        f"task {task.name.rsplit('.', 1)[-1]}", {"traceparent": _header(request, "traceparent")},
        task=task.name, run=_header(request, "stepwise_run") or None,
        step=_header(request, "stepwise_step") or None))
    bind(run_id=_header(request, "stepwise_run") or None,
         step=_header(request, "stepwise_step") or None)
    request.stepwise_context = stack


@task_postrun.connect
def leave_task_context(task=None, **kwargs) -> None:
    stack = getattr(task.request, "stepwise_context", None) if task is not None else None
    if stack is not None:
        stack.close()
    clear()
