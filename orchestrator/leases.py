"""The worker side of a lease: a heartbeat thread that renews the claim while a step runs.

A step whose worker dies stops being renewed; the reaper sees the lease expire and retries
the step under its policy. The heartbeat never extends a step past its own timeout: the
timeout is a separate deadline the reaper enforces regardless of heartbeats.
"""
import threading
from contextlib import contextmanager

from django.conf import settings
from django.db import close_old_connections, connection


@contextmanager
def lease_heartbeat(*, step_id: int, attempt: int):
    from .services.steps import lease_extend

    stop = threading.Event()

    def beat() -> None:
        try:
            while not stop.wait(settings.STEPWISE_LEASE_S / 3):
                try:
                    if not lease_extend(step_id=step_id, attempt=attempt):
                        return  # the step moved on without us (timed out, cancelled)
                except Exception:  # the database may be restarting; try again next beat
                    close_old_connections()
        finally:
            connection.close()

    thread = threading.Thread(target=beat, name=f"lease-{step_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)
