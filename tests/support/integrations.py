"""The real services the integration tools are tested against, and how a test asks for one.

`need(name)` skips the test with the reason when the service is not reachable here, and fails
it instead when STEPWISE_REQUIRE_SERVICES=1 (CI sets it, so a service that did not start can
never turn the suite green by skipping). Every name a test creates on a shared server is its
own: the PostgreSQL database `stepwise_integrations`, MariaDB tables `integrations_*` in the
`test` database, RabbitMQ exchanges and queues `integrations-<random>` (deleted after), Redis
database 13 with keys under a prefix `integrations-<random>:` of each test's own (deleted
after: every test process shares the database, so none deletes keys it did not make), MQTT
topics `integrations/...`. No server is ever restarted or reconfigured.
"""
import os
import secrets
import socket
from contextlib import suppress

import amqp
import psycopg
import pymysql
import pytest
import redis

REQUIRED = os.environ.get("STEPWISE_REQUIRE_SERVICES") == "1"
PG_DB = "stepwise_integrations"
PG_URL = f"postgresql://postgres@127.0.0.1:5432/{PG_DB}"
MARIADB_URL = "mysql://root@127.0.0.1:3306/test"
AMQP_URL = "amqp://guest@127.0.0.1:5672//"
REDIS_URL = "redis://127.0.0.1:6379/13"
MQTT = ("127.0.0.1", 1883)


def _probe_postgres() -> None:
    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True,
                         connect_timeout=3) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (PG_DB,)).fetchone():
            with suppress(psycopg.errors.DuplicateDatabase):
                conn.execute(f"CREATE DATABASE {PG_DB}")


def _probe_mariadb() -> None:
    pymysql.connect(host="127.0.0.1", port=3306, user="root", database="test",
                    connect_timeout=3).close()


def _probe_rabbitmq() -> None:
    conn = amqp.Connection("127.0.0.1:5672", userid="guest", password="guest", connect_timeout=3)
    conn.connect()
    conn.close()


def _probe_redis() -> None:
    redis.Redis.from_url(REDIS_URL, socket_timeout=3).ping()


def _probe_mqtt() -> None:
    socket.create_connection(MQTT, timeout=3).close()


PROBES = {"PostgreSQL": _probe_postgres, "MariaDB": _probe_mariadb, "RabbitMQ": _probe_rabbitmq,
          "Redis": _probe_redis, "Mosquitto": _probe_mqtt}


def need(service: str) -> None:
    """Skip (or, with STEPWISE_REQUIRE_SERVICES=1, fail) unless `service` answers."""
    try:
        PROBES[service]()
    except Exception as exc:  # whatever the client raises, the service is not usable
        reason = f"{service} is not reachable on this machine: {type(exc).__name__}: {exc}"
        if REQUIRED:
            pytest.fail(f"STEPWISE_REQUIRE_SERVICES=1 but {reason}", pytrace=False)
        pytest.skip(reason)


def unique(prefix: str = "integrations") -> str:
    return f"{prefix}-{secrets.token_hex(4)}"


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
