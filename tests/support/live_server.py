"""The web process as `make run` starts it (uvicorn serving orchestrator.asgi), for tests that
talk to it over real HTTP.

It runs in a process of its own, on a free loopback port, against the test session's database
and broker (SQLite file or PostgreSQL; the filesystem broker or Redis, whatever the settings
say), so it sees what a transactional test commits. Nothing is faked: requests go through
uvicorn, the ASGI application, every middleware and the real authentication.
"""
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def server_env() -> dict:
    """The environment of a process that must use this test session's database and broker."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), STEPWISE_VAR_DIR=str(settings.VAR_DIR))
    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        env["STEPWISE_SQLITE_PATH"] = str(db["NAME"])
    else:
        env["DATABASE_URL"] = (
            f"postgres://{db['USER']}:{db['PASSWORD'] or ''}@{db['HOST'] or ''}:"
            f"{db['PORT'] or 5432}/{db['NAME']}"
        )
    return env


class LiveServer:
    """`uvicorn orchestrator.asgi:application` on 127.0.0.1, started and stopped by a test."""

    def __init__(self, name: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = Path(settings.VAR_DIR) / f"live-server-{name}.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 60) -> "LiveServer":
        cmd = [sys.executable, "-m", "uvicorn", "orchestrator.asgi:application",
               "--host", "127.0.0.1", "--port", str(self.port), "--log-level", "warning"]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=server_env(), stdout=self.log.open("w"),
                                     stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the web process exited: {self.log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/api/v1/health/", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the web process did not answer: {self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def errors_logged(self) -> str:
        """What the web process wrote to its log (tracebacks of 500s end up here)."""
        return self.log.read_text() if self.log.exists() else ""
