"""Worker heartbeats: each worker process says it is alive in the database every few seconds.

Health checks read this table, so "workers seen" works on every broker, including the
embedded filesystem transport that has no broadcast.
"""
import os
import threading

from celery.signals import task_postrun, task_prerun, worker_ready, worker_shutdown
from django.db import close_old_connections

from .clock import now
from .models import WorkerHeartbeat

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


@task_prerun.connect
@task_postrun.connect
def recycle_stale_connections(**kwargs) -> None:
    """Connections are reused across tasks (CELERY_DB_REUSE_MAX); drop any that broke or aged
    out (a database restart), as Django does around each request."""
    close_old_connections()
