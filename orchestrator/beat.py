"""Celery beat's scheduler for Stepwise: the database scheduler, sending only while leader.

Any number of beat processes may run (one per host, for availability). Each contends for the
`beat` leader lease (`services/leadership.py`) every STEPWISE_BEAT_LEASE_S / 3 seconds; only
the holder sends anything — the reaper's sweeps and every schedule's ticks. When the leader
dies, a follower takes the lease over once it expires, re-reads the schedule from the database
and goes on: recovery waits at most the lease, and a schedule slot missed meanwhile is caught
up or skipped under the schedule's policy (the slot key makes any tick sent twice harmless).

Celery's SIGTERM handler closes the scheduler, which writes the schedule, then raises SystemExit;
Celery's loop closes it once more as it ends. A handler that ran while the scheduler was in a
query would reach the same connection from inside it and wait on it forever, so that first close
is skipped: the second one, after the query has been abandoned, writes the schedule.
"""
import logging
import os
import secrets
import socket
import time
from contextlib import contextmanager

from django.conf import settings
from django.db import DatabaseError, close_old_connections, connection
from django_celery_beat.schedulers import DatabaseScheduler

from .engine.services.leadership import leadership_hold, leadership_release

log = logging.getLogger(__name__)
LEASE_NAME = "beat"


class LeaderScheduler(DatabaseScheduler):
    """DatabaseScheduler whose `tick` sends only while this process holds the beat lease."""

    def __init__(self, *args, **kwargs):
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.leading = False
        self._renew_at = 0.0  # monotonic time of the next renewal
        self._in_database = False  # tick or sync is talking to the database
        super().__init__(*args, **kwargs)

    @property
    def lease_s(self) -> float:
        return float(settings.STEPWISE_BEAT_LEASE_S)

    def tick(self, *args, **kwargs):
        with self._talking():
            if not self._leader():
                return self.lease_s / 3  # a follower: contend again later, send nothing
            return min(super().tick(*args, **kwargs), max(self._renew_at - time.monotonic(), 0))

    def sync(self):
        with self._talking():
            super().sync()

    @contextmanager
    def _talking(self):
        outer, self._in_database = self._in_database, True
        try:
            yield
        except (SystemExit, KeyboardInterrupt):
            if not outer:
                connection.close()  # its query was abandoned midway: the last sync opens another
            raise
        finally:
            self._in_database = outer

    def _leader(self) -> bool:
        if self.leading and time.monotonic() < self._renew_at:
            return True
        try:
            leading = leadership_hold(name=LEASE_NAME, holder=self.holder, lease_s=self.lease_s)
        except DatabaseError:
            close_old_connections()  # the database is away: lead nothing until it is back
            leading = False
        if leading and not self.leading:
            log.warning("beat %s took the leader lease", self.holder)
            # Re-read what the previous leader recorded rather than this process's old view.
            self._initial_read, self._heap = True, None
        elif self.leading and not leading:
            log.warning("beat %s lost the leader lease", self.holder)
        self.leading = leading
        self._renew_at = time.monotonic() + self.lease_s / 3 if leading else 0.0
        return leading

    def close(self):
        if self._in_database:
            return  # a signal handler, inside this scheduler's own query (the module's docstring)
        if self.leading:
            try:
                leadership_release(name=LEASE_NAME, holder=self.holder)
            except DatabaseError:
                pass  # it expires by itself
        super().close()
