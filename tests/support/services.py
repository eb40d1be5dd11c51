"""Restart the real broker and database under a running system, for the fault suite.

These act on the servers the settings point at, so tests using them run in a session of their
own (marker `restarts_services`), never beside other tests. What a restart means per backend,
and the evidence each returns that it really happened (a `Restart`; the fault suite asserts it):

- Redis broker: SHUTDOWN NOSAVE and start again with no persistence, as on this machine and in
  docker-compose: every queued and unacknowledged message is gone, every connection dropped.
  Evidence: the server's `run_id` (new at every start) changed, and how many keys it held.
- the embedded filesystem broker has no server: its "restart" loses every message it held.
  Evidence: the message files it deleted.
- PostgreSQL: `pg_ctlcluster ... restart` (fast shutdown): every connection is dropped,
  in-flight transactions roll back, committed data stays. Evidence: `pg_postmaster_start_time()`
  moved, and this process's connection (opened before) is a new backend after.
- SQLite has no server to restart; `DatabaseServer.available` is False there.
"""
import shutil
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import redis
from django.conf import settings
from django.db import connection


def _wait(predicate, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not come back within {timeout}s")


@dataclass(frozen=True)
class Restart:
    """What a restart did: the server's identity before and after, and what it lost."""

    before: str
    after: str
    lost: int  # messages (filesystem broker) or keys (Redis) the restart threw away
    happened: bool  # the server is another one (its identity changed), or messages were lost


class RedisBroker:
    kind = "redis"

    def __init__(self, url: str):
        parsed = urlparse(url)
        self.host, self.port = parsed.hostname or "127.0.0.1", parsed.port or 6379
        self.client = redis.Redis(host=self.host, port=self.port, socket_timeout=2)

    @property
    def available(self) -> bool:
        return self.host in ("127.0.0.1", "localhost") and shutil.which("redis-server") is not None

    def alive(self) -> bool:
        try:
            return bool(self.client.ping())
        except redis.RedisError:
            return False

    def stop(self) -> None:
        try:
            self.client.shutdown(nosave=True)
        except redis.ConnectionError:
            pass  # the server closes the connection as it goes: that is the answer
        _wait(lambda: not self.alive(), "Redis shutdown")

    def start(self) -> None:
        subprocess.run(["redis-server", "--daemonize", "yes", "--bind", self.host,
                        "--port", str(self.port), "--save", "", "--appendonly", "no"],
                       check=True, stdout=subprocess.DEVNULL)
        _wait(self.alive, "Redis")

    def identity(self) -> str:
        return str(self.client.info("server")["run_id"])

    def restart(self) -> Restart:
        before, held = self.identity(), self.client.dbsize()
        self.stop()
        self.start()
        after = self.identity()
        return Restart(before, after, held, after != before)

    @contextmanager
    def down(self):
        """The broker is stopped inside the block, and running again after it, whatever happens.
        Yields a list that holds the block's `Restart` once the broker is back."""
        before, held = self.identity(), self.client.dbsize()
        done: list[Restart] = []
        self.stop()
        try:
            yield done
        finally:
            self.start()
            after = self.identity()
            done.append(Restart(before, after, held, after != before))


class FilesystemBroker:
    """The embedded broker: no server, so a restart is the loss of every message it held."""

    kind = "filesystem"
    available = True

    def __init__(self, folder: str):
        self.folder = Path(folder)

    def restart(self) -> Restart:
        """Delete every message file: it happened if there was one to lose."""
        held = sorted(self.folder.glob("*.msg"))
        lost = 0
        for message in held:
            try:
                message.unlink()
                lost += 1
            except FileNotFoundError:
                pass  # a worker took it first
        return Restart(f"{len(held)} messages", f"{len(list(self.folder.glob('*.msg')))} messages",
                       lost, lost > 0)


def broker() -> RedisBroker | FilesystemBroker:
    url = settings.CELERY_BROKER_URL
    if url.startswith("redis"):
        return RedisBroker(url)
    return FilesystemBroker(settings.CELERY_BROKER_TRANSPORT_OPTIONS["data_folder_in"])


class DatabaseServer:
    def __init__(self):
        db = connection.settings_dict
        self.postgres = db["ENGINE"].endswith("postgresql")
        self.local = (db.get("HOST") or "localhost") in ("127.0.0.1", "localhost", "")
        clusters = Path("/etc/postgresql")
        self.version = sorted(p.name for p in clusters.iterdir())[0] if clusters.is_dir() else None

    @property
    def available(self) -> bool:
        return (self.postgres and self.local and self.version is not None
                and shutil.which("pg_ctlcluster") is not None)

    def identity(self) -> str:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_postmaster_start_time()::text, pg_backend_pid()")
            started, pid = cursor.fetchone()
        return f"started {started}, backend {pid}"

    def restart(self) -> Restart:
        before = self.identity()
        subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", self.version, "main",
                        "restart"], check=True)
        connection.close()  # this process's connection died with the server
        _wait(self._accepts, "PostgreSQL")
        after = self.identity()
        # A new postmaster start time: the server restarted (every connection was dropped).
        return Restart(before, after, 0, after.split(",")[0] != before.split(",")[0])

    def _accepts(self) -> bool:
        try:
            connection.ensure_connection()
            return True
        except Exception:
            connection.close()
            return False
