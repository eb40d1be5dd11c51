"""Child processes of the benchmark: Celery workers and the API server.

Each is started in a session of its own, so that its process group is its whole tree (the
prefork pool included) and can be signalled at once. Every group id is appended to a ledger
file in the backend's var dir; `reap_ledger` kills whatever is still alive from it, so even a
measuring process killed hard leaves nothing running once the driver has cleaned up.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The live queues, and the evaluation runs' (`manage.py stepwise_queues evaluation`).
LIVE_QUEUES = "orchestrator,tools,tools.batch,agent.fast,agent.fast.batch,agent.deep,agent.deep.batch"
EVALUATION_QUEUES = "orchestrator.evaluation,tools.evaluation,agent.fast.evaluation,agent.deep.evaluation"
QUEUES = f"{LIVE_QUEUES},{EVALUATION_QUEUES}"
LEDGER = "bench-pgids"


class Deadline(Exception):
    """A wait ran past the benchmark's deadline."""


class WorkerDied(RuntimeError):
    """A worker (or the server) exited while the benchmark still needed it."""


class Group:
    """One started process and its descendants (one process group)."""

    def __init__(self, name: str, cmd: list[str], env: dict, var_dir: Path):
        self.name = name
        self.log = var_dir / f"bench-{name}.log"
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        with (var_dir / LEDGER).open("a") as ledger:
            ledger.write(f"{self.proc.pid}\n")

    def wait_for(self, ready, *, deadline: float, what: str) -> None:
        """Poll `ready()` until true; raise if the process dies or the deadline passes."""
        while time.time() < deadline:
            if ready():
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.log_tail()}")
            time.sleep(0.1)
        raise Deadline(f"{self.name} not {what} before the deadline: {self.log_tail()}")

    def check(self) -> None:
        """Raise WorkerDied, with the reason from the log, if the process has exited."""
        if self.proc.poll() is not None:
            log = self.log.read_text(errors="replace")
            reason = next((line for line in log.splitlines() if "Unrecoverable error" in line),
                          log[-500:])
            raise WorkerDied(f"{self.name} exited with status {self.proc.returncode}: {reason}")

    def log_tail(self, chars: int = 2000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def peak_rss(self) -> dict:
        return peak_rss(self.proc.pid)

    def stop(self, timeout: float = 20) -> None:
        """SIGTERM the group (a warm shutdown), SIGKILL what is left after `timeout`."""
        if self.proc.poll() is None:
            # The main process only: it stops its pool itself; a SIGTERM to the pool children
            # too would have it respawn them and linger.
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        _signal_group(self.proc.pid, signal.SIGKILL)  # pool children outliving their parent
        self.proc.wait()


def celery_worker(name: str, app: str, *, concurrency: int, env: dict, var_dir: Path,
                  deadline: float, queues: str = QUEUES, nice: int = 0) -> Group:
    """A real prefork worker on `queues` (default: every Stepwise queue), at CPU priority
    `nice` (`nice -n`), returned once it logged "ready."."""
    cmd = [*(["nice", "-n", str(nice)] if nice else []),
           sys.executable, "-m", "celery", "-A", app, "worker", "-Q", queues,
           "-c", str(concurrency), "-P", "prefork", "--without-mingle", "--without-gossip",
           "-n", f"{name}@%h", "-l", "info"]
    group = Group(name, cmd, env, var_dir)
    group.wait_for(lambda: "ready." in group.log.read_text(errors="replace"),
                   deadline=deadline, what="ready")
    return group


def celery_beat(*, env: dict, var_dir: Path, deadline: float) -> Group:
    """`celery beat` on Stepwise's scheduler (the reaper's sweeps, every schedule), returned once
    it holds the leader lease and so sends."""
    cmd = [sys.executable, "-m", "celery", "-A", "orchestrator", "beat", "-l", "info", "--pidfile="]
    group = Group("beat", cmd, env, var_dir)
    group.wait_for(lambda: "took the leader lease" in group.log.read_text(errors="replace"),
                   deadline=deadline, what="leading")
    return group


def api_server(*, env: dict, var_dir: Path, deadline: float,
               processes: int = 1) -> tuple[Group, str]:
    """The ASGI app under uvicorn on a free local port, in `processes` processes (uvicorn's
    `--workers`, as the compose file runs it, when more than one); returns (group, base URL)."""
    port = _free_port()
    cmd = [sys.executable, "-m", "uvicorn", "orchestrator.asgi:application", "--host",
           "127.0.0.1", "--port", str(port), "--no-access-log", "--log-level", "warning"]
    if processes > 1:
        cmd += ["--workers", str(processes)]
    group = Group("api", cmd, env, var_dir)
    group.wait_for(lambda: _accepts(port), deadline=deadline, what="listening")
    return group, f"http://127.0.0.1:{port}"


def peak_rss(pgid: int) -> dict:
    """VmHWM (peak resident set) of every live process in group `pgid`, in MB."""
    sizes = []
    for pid in _members(pgid):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmHWM:"):
                sizes.append(int(line.split()[1]) / 1024)
    return {"processes": len(sizes), "total_mb": round(sum(sizes), 1),
            "max_mb": round(max(sizes, default=0), 1), "each_mb": [round(s, 1) for s in sizes]}


def reap_ledger(var_dir: Path) -> int:
    """SIGKILL every still-live process group listed in `var_dir`'s ledger; return how many."""
    ledger = var_dir / LEDGER
    if not ledger.exists():
        return 0
    killed = 0
    for line in ledger.read_text().split():
        pgid = int(line)
        if _members(pgid):
            _signal_group(pgid, signal.SIGKILL)
            killed += 1
    return killed


def _members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "(comm)": state ppid pgrp ...
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _accepts(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0
