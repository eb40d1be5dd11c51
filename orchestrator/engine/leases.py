"""The worker side of a lease: a heartbeat thread that renews the claim while work runs.

A step (or map item) whose worker dies stops being renewed; the reaper sees the lease expire
and retries it under its policy. The heartbeat never extends work past its own timeout: the
timeout is a separate deadline the reaper enforces regardless of heartbeats.
"""
import os
import queue
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
    """Call `renew` every third of a lease until the block ends or `renew` returns False.

    `renew` runs on a thread of its own (named `name` while it serves this block), with its own
    database connection, closed when the block's beats end. When the block ends no renewal of
    it is still running, or one has run for 5 s and is left to finish.
    """
    beat = _Beat(renew, name)
    _BEATERS.serve(beat)
    try:
        yield
    finally:
        beat.stop()


class _Beat:
    """One block's heartbeat: renewals until it is stopped or `renew` says the work moved on."""

    def __init__(self, renew: Callable[[], bool], name: str) -> None:
        self.renew, self.name = renew, name
        self.stopped = threading.Event()
        # Held while `renew` runs: `stop` waits for a renewal in flight, and none starts after.
        self.renewing = threading.Lock()

    def run(self) -> None:
        while not self.stopped.wait(settings.STEPWISE_LEASE_S / 3):
            with self.renewing:
                if self.stopped.is_set():
                    return
                try:
                    if not self.renew():
                        return  # the work moved on without us (timed out, cancelled)
                except Exception:  # the database may be restarting; try again next beat
                    close_old_connections()

    def stop(self) -> None:
        self.stopped.set()
        if self.renewing.acquire(timeout=5):
            self.renewing.release()


class _Beaters:
    """The threads that run heartbeats, one per block at a time, kept for the next block when
    theirs ends: a step (most end well within a beat) then starts no thread of its own."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.idle = 0
        self.beats: queue.SimpleQueue[_Beat] = queue.SimpleQueue()

    def serve(self, beat: _Beat) -> None:
        with self.lock:
            start = self.idle == 0
            if not start:
                self.idle -= 1
        if start:
            threading.Thread(target=self._serve_forever, name=beat.name, daemon=True).start()
        self.beats.put(beat)

    def _serve_forever(self) -> None:
        while True:
            beat = self.beats.get()
            threading.current_thread().name = beat.name
            try:
                beat.run()
            finally:
                connection.close()
                threading.current_thread().name = "heartbeat (idle)"
            with self.lock:
                self.idle += 1


_BEATERS = _Beaters()


def _forget_parents_beaters() -> None:
    """A forked child (a prefork worker process) has none of its parent's threads."""
    global _BEATERS
    _BEATERS = _Beaters()


os.register_at_fork(after_in_child=_forget_parents_beaters)
