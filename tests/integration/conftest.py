"""Integration fixtures: real Celery worker processes on the configured broker and database.

One worker group per pytest(-xdist) process, started once per session and pointed at the
test database. Tests here are transactional (`transaction=True`), so on_commit dispatch sends
real messages that the real workers consume.
"""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings
from django.db import connection

from orchestrator.models import Run
from tests.support.egress import local_servers_env

ROOT = Path(__file__).resolve().parents[2]
QUEUES = ("orchestrator,tools,tools.batch,agent.fast,agent.fast.batch,agent.deep,agent.deep.batch,"
          "orchestrator.evaluation,tools.evaluation,agent.fast.evaluation,agent.deep.evaluation")
LEASE_S = 3


def worker_env() -> dict:
    env = dict(os.environ, CELERY_SKIP_CHECKS="1", PYTHONPATH=str(ROOT))
    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        env["STEPWISE_SQLITE_PATH"] = str(db["NAME"])
    else:
        env["DATABASE_URL"] = (
            f"postgres://{db['USER']}:{db['PASSWORD'] or ''}@{db['HOST'] or ''}:{db['PORT'] or 5432}/{db['NAME']}"
        )
    env["STEPWISE_VAR_DIR"] = str(settings.VAR_DIR)
    # Short leases so fault tests see a killed worker's step retried within seconds.
    env["STEPWISE_LEASE_S"] = str(LEASE_S)
    # The local servers standing in for remote APIs listen on loopback: allowed explicitly.
    env["STEPWISE_EGRESS"] = local_servers_env()
    return env


class WorkerGroup:
    """A real `celery worker` process (prefork, 2 children) that tests may kill and restart."""

    def __init__(self, name: str, *, queues: str = QUEUES, env: dict | None = None):
        self.name = name
        self.queues = queues
        self.env = env or {}
        self.proc: subprocess.Popen | None = None
        self.log = Path(settings.VAR_DIR) / f"itest-worker-{name}.log"
        self.log.unlink(missing_ok=True)  # one log per test session, restarts included

    def start(self) -> None:
        cmd = [sys.executable, "-m", "celery", "-A", "orchestrator", "worker", "-Q", self.queues,
               "-c", "2", "-P", "prefork", "--without-mingle", "--without-gossip",
               "--without-heartbeat", "-n", f"{self.name}@%h", "-l", "info"]
        started = self.log.stat().st_size if self.log.exists() else 0  # restarts append
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env={**worker_env(), **self.env},
                                     stdout=self.log.open("a"), stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if "ready." in self.log.read_text()[started:]:
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited: {self.log.read_text()[-3000:]}")
            time.sleep(0.2)
        raise RuntimeError(f"worker did not become ready: {self.log.read_text()[-3000:]}")

    def kill(self) -> int:
        """SIGKILL the whole worker (parent and children), as a crash would; return its pid.

        Raises AssertionError if there was no live worker to kill: a fault that did not happen.
        """
        assert self.proc and self.proc.poll() is None, "no worker was running to be killed"
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        return self.proc.pid

    def stop(self) -> None:
        """A warm shutdown, asked of the main process only: it ends its pool children itself.
        A SIGTERM to the whole group also reaches the children, which the pool's supervisor
        may then replace while the main process waits for them, until the kill below."""
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()


def wait_for(predicate, *, timeout: float = 30, interval: float = 0.05):
    """Poll until predicate() is truthy; return its value or fail the test with a message."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")


def wait_for_run(run_id, states=("completed", "failed", "cancelled", "timed_out", "waiting"),
                 timeout: float = 30) -> Run:
    try:
        return wait_for(lambda: Run.objects.filter(id=run_id, state__in=states).first(), timeout=timeout)
    except AssertionError:
        run = Run.objects.get(id=run_id)
        steps = [(s.name, s.state, s.error) for s in run.steps.all()]
        raise AssertionError(f"run {run_id} is {run.state}, not in {states}: {run.error} {steps}") from None
