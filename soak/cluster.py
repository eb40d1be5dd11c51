"""The soak's own servers and processes: nothing here touches a shared server.

`Postgres` is a private cluster (initdb under the soak's temporary directory, on a free port;
as root, the server runs as the `postgres` user, since PostgreSQL refuses root); `Redis` a
private redis-server without persistence, so a restart loses every message it held. `Proc` is one
Stepwise process (a worker group, a beat, the web server) that a fault may SIGKILL.
"""
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

PG_BIN = Path(os.environ.get("STEPWISE_SOAK_PG_BIN", "/usr/lib/postgresql/15/bin"))
ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def missing_binaries() -> list[str]:
    """The server programs the soak needs that this machine lacks."""
    needed = [PG_BIN / "initdb", PG_BIN / "pg_ctl", Path(shutil.which("redis-server") or "redis-server")]
    return [str(p) for p in needed if not p.exists()]


def _as_postgres(cmd: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return cmd
    return ["runuser", "-u", "postgres", "--", *cmd]


class Postgres:
    def __init__(self, root: Path, *, port: int | None = None):
        self.dir = root / "pg"
        self.port = port or free_port()
        self.log = root / "postgres.log"
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/stepwise"
        self.restarts = 0

    def _ctl(self, *args: str) -> None:
        subprocess.run(_as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(self.dir), "-l",
                                     str(self.log), "-w", "-t", "60", *args]),
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def init(self) -> None:
        self.dir.mkdir(parents=True)
        if os.geteuid() == 0:
            uid = pwd.getpwnam("postgres")
            for path in (self.dir.parent, self.dir):
                os.chown(path, uid.pw_uid, uid.pw_gid)
        subprocess.run(_as_postgres([str(PG_BIN / "initdb"), "-D", str(self.dir), "-U", "postgres",
                                     "-A", "trust", "--no-sync", "-E", "UTF8"]),
                       check=True, stdout=subprocess.DEVNULL)
        with (self.dir / "postgresql.conf").open("a") as conf:
            conf.write(f"\nport = {self.port}\nlisten_addresses = '127.0.0.1'\n"
                       f"unix_socket_directories = '{self.dir}'\nmax_connections = 300\n"
                       # Faster, and still safe against a crash of the server (not of the OS).
                       "fsync = off\nfull_page_writes = off\n")
        self.log.touch()
        if os.geteuid() == 0:
            os.chown(self.log, pwd.getpwnam("postgres").pw_uid, -1)
        self._ctl("start")
        subprocess.run(_as_postgres([str(PG_BIN / "createdb"), "-h", "127.0.0.1", "-p",
                                     str(self.port), "-U", "postgres", "stepwise"]), check=True)

    def restart(self) -> bool:
        """Crash and restart the server (immediate stop: every connection dies, crash recovery)."""
        self._ctl("-m", "immediate", "restart")
        self.restarts += 1
        return True

    def stop(self) -> None:
        try:
            self._ctl("-m", "immediate", "stop")
        except subprocess.CalledProcessError:
            pass


class Redis:
    def __init__(self, root: Path, *, port: int | None = None):
        self.port = port or free_port()
        self.log = root / "redis.log"
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--protected-mode", "no"],
            stdout=self.log.open("a"), stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("the soak's redis-server did not start")

    def restart(self) -> bool:
        """SIGKILL the server and start an empty one on the same port."""
        self.proc.kill()
        self.proc.wait()
        self.start()
        return True

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class Proc:
    """One Stepwise process a fault may SIGKILL (its whole process group) and start again."""

    def __init__(self, name: str, args: list[str], env: dict, logs: Path):
        self.name, self.args, self.env = name, args, env
        self.log = logs / f"{name}.log"
        self.proc: subprocess.Popen | None = None
        self.kills = 0

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, *self.args], cwd=ROOT, env=self.env,
                                     stdout=self.log.open("a"), stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> bool:
        """SIGKILL the process group; True if it was running (a fault that really happened)."""
        if not self.alive():
            return False
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.kills += 1
        return True

    def stop(self) -> None:
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()


def worker(name: str, env: dict, logs: Path) -> Proc:
    queues = ("orchestrator,audit,tools,tools.batch,agent.fast,agent.fast.batch,agent.deep,"
              "agent.deep.batch,orchestrator.evaluation,tools.evaluation,agent.fast.evaluation,"
              "agent.deep.evaluation")
    return Proc(name, ["-m", "celery", "-A", "orchestrator", "worker", "-Q", queues, "-c", "2", "-P", "prefork",
                       "--without-mingle", "--without-gossip", "--without-heartbeat",
                       "-n", f"{name}@%h", "-l", "warning"], env, logs)


def beat(name: str, env: dict, logs: Path) -> Proc:
    return Proc(name, ["-m", "celery", "-A", "orchestrator", "beat", "-l", "warning", "--pidfile=",
                       "--max-interval", "1"], env, logs)


def web(port: int, env: dict, logs: Path) -> Proc:
    return Proc("web", ["-m", "uvicorn", "orchestrator.asgi:application", "--host", "127.0.0.1",
                        "--port", str(port), "--log-level", "warning"], env, logs)
