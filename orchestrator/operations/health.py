"""Health of the deployment: liveness and readiness for anyone, the details for operators only.

Liveness ("the web process answers") and readiness ("the database and the broker answer", so
the load balancer may send traffic) say nothing else, so they can stay anonymous. The details
— database and broker status with their errors, which workers beat recently, their host names
and queues — map the deployment for an attacker, so `health_details` checks the person itself:
operators only (`user_may_see_health`). It reads and pings; it changes nothing.
"""
from __future__ import annotations

from datetime import timedelta

from django.db import connection

from orchestrator.celery import app as celery_app
from orchestrator.engine.authz import operates_somewhere
from orchestrator.engine.clock import now
from orchestrator.engine.errors import Forbidden
from orchestrator.models import WorkerHeartbeat

# A worker that has not beaten for this long is not listed.
WORKER_SEEN_WITHIN = timedelta(seconds=30)


def user_may_see_health(user) -> bool:
    """Operators: an operator (or owner) of some team, or a superuser. Staff alone is not
    enough (docs/permissions.md)."""
    return bool(user) and operates_somewhere(user)


def database_status() -> str:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Exception as exc:  # any failure is the answer, not a crash
        return f"error: {exc.__class__.__name__}: {exc}"
    return "ok"


def broker_status() -> str:
    try:
        with celery_app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1)
    except Exception as exc:  # any failure is the answer, not a crash
        return f"error: {exc.__class__.__name__}: {exc}"
    return "ok"


def workers_seen() -> list[dict]:
    beats = WorkerHeartbeat.objects.filter(last_seen__gte=now() - WORKER_SEEN_WITHIN)
    return list(beats.order_by("hostname").values("hostname", "queues", "last_seen"))


def ready() -> bool:
    """Readiness: this process can do its work — the database and the broker answer. Says
    nothing else, so a load balancer may ask it anonymously."""
    return database_status() == "ok" and broker_status() == "ok"


def health_details(*, user) -> dict:
    """Database, broker and recent workers, for an operator.

    Raises Forbidden unless `user_may_see_health(user)`.
    """
    if not user_may_see_health(user):
        raise Forbidden("health details are for operators: the operator or owner role in a team "
                        "(docs/permissions.md)")
    database = database_status()
    broker = broker_status()
    return {
        "status": "ok" if database == broker == "ok" else "degraded",
        "database": database,
        "broker": broker,
        "workers": workers_seen() if database == "ok" else [],
    }
