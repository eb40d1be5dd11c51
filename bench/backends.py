"""The two backends' environments, and the scratch state each gets and loses.

embedded: a fresh temporary STEPWISE_VAR_DIR holding the SQLite file and the Kombu
filesystem broker (the settings' defaults when no URL is set).
postgres: the same kind of var dir, plus a database created for the run and dropped after it,
and Redis database 14 as broker and REDIS_URL, flushed before and after. BENCH_DATABASE_URL
and BENCH_REDIS_URL name others, so that two invocations can run side by side.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

PG_SERVER, PG_DATABASE = os.environ.get(
    "BENCH_DATABASE_URL", "postgres://root@127.0.0.1:5432/stepwise_bench").rsplit("/", 1)
REDIS = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
# Variables that would point a backend somewhere else than where the benchmark put it.
SCRUBBED = ("DATABASE_URL", "BENCH_DATABASE_URL", "BENCH_REDIS_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "REDIS_URL",
            "STEPWISE_SQLITE_PATH", "PYTEST_XDIST_WORKER", "STEPWISE_VAR_DIR")
BACKENDS = ("embedded", "postgres")


@contextmanager
def backend_env(backend: str, *, keep: bool = False):
    """Yield (env, var_dir) for `backend`; drop its database and delete its files after
    (the files are kept, for reading the worker logs, when `keep`)."""
    var_dir = Path(tempfile.mkdtemp(prefix=f"stepwise-bench-{backend}-"))
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED}
    env.update(STEPWISE_VAR_DIR=str(var_dir), DJANGO_SETTINGS_MODULE="orchestrator.settings",
               CELERY_SKIP_CHECKS="1", DJANGO_DEBUG="0", PYTHONUNBUFFERED="1",
               # The bench measures capacity: no start rate per person or token, and no default
               # cap on a team's unfinished runs (its scale phases hold thousands).
               STEPWISE_RUN_START_RATE_PERSON="", STEPWISE_RUN_START_RATE_TOKEN="",
               STEPWISE_TEAM_MAX_LIVE_RUNS="0")
    try:
        if backend == "postgres":
            _pg_recreate()
            _redis_flush()
            env.update(DATABASE_URL=f"{PG_SERVER}/{PG_DATABASE}", CELERY_BROKER_URL=REDIS,
                       REDIS_URL=REDIS)
        yield env, var_dir
    finally:
        try:
            if backend == "postgres":
                _pg_drop()
                _redis_flush()
        finally:
            if keep:
                print(f"=== {backend}: kept {var_dir}", flush=True)
            else:
                shutil.rmtree(var_dir, ignore_errors=True)


def _pg_admin(*statements: str) -> None:
    import psycopg

    with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def _pg_recreate() -> None:
    _pg_admin(f"DROP DATABASE IF EXISTS {PG_DATABASE} WITH (FORCE)",
              f"CREATE DATABASE {PG_DATABASE}")


def _pg_drop() -> None:
    _pg_admin(f"DROP DATABASE IF EXISTS {PG_DATABASE} WITH (FORCE)")


def _redis_flush() -> None:
    import redis

    client = redis.Redis.from_url(REDIS)
    try:
        client.flushdb()
    finally:
        client.close()


def database_recreate(url: str) -> None:
    """An empty database at `url` (PostgreSQL), for a bench of its own (bench/ledger_*.py)."""
    admin, name = _admin_url(url)
    with _admin_connection(admin) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        connection.execute(f'CREATE DATABASE "{name}"')


def database_drop(url: str) -> None:
    admin, name = _admin_url(url)
    with _admin_connection(admin) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _admin_url(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/postgres")), parts.path.lstrip("/")


def _admin_connection(admin: str):
    import psycopg

    return psycopg.connect(admin, autocommit=True)
