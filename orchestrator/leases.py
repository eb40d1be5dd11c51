"""The worker side of a lease: a heartbeat thread that renews the claim while work runs.

A step (or map item) whose worker dies stops being renewed; the reaper sees the lease expire
and retries it under its policy. The heartbeat never extends work past its own timeout: the
timeout is a separate deadline the reaper enforces regardless of heartbeats.
"""
import threading
from collections.abc import Callable
from contextlib import contextmanager
from datetime import datetime, timedelta

from django.conf import settings
from django.db import close_old_connections, connection

from .clock import now


def lease_until(at: datetime | None = None) -> datetime:
    """When a lease taken or renewed at `at` (default: now) runs out."""
    return (at or now()) + timedelta(seconds=settings.STEPWISE_LEASE_S)


@contextmanager
def heartbeat(renew: Callable[[], bool], *, name: str):
    """Call `renew` every third of a lease until the block ends or `renew` returns False."""
    stop = threading.Event()

    def beat() -> None:
        try:
            while not stop.wait(settings.STEPWISE_LEASE_S / 3):
                try:
                    if not renew():
                        return  # the work moved on without us (timed out, cancelled)
                except Exception:  # the database may be restarting; try again next beat
                    close_old_connections()
        finally:
            connection.close()

    thread = threading.Thread(target=beat, name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)
