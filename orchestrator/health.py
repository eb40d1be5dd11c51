"""Health of the deployment: liveness for anyone, the details for operators only.

Liveness ("the web process answers") says nothing else, so it can stay anonymous. The details
— database and broker status with their errors, which workers beat recently, their host names
and queues — map the deployment for an attacker, so `health_details` checks the person itself:
operators only (`user_may_see_health`). It reads and pings; it changes nothing.
"""
from __future__ import annotations

from datetime import timedelta

from django.db import connection

from .clock import now
from .models import WorkerHeartbeat

# A worker that has not beaten for this long is not listed.
WORKER_SEEN_WITHIN = timedelta(seconds=30)


def user_may_see_health(user) -> bool:
    """Operators: the operator (redrive) permission, or superuser. Staff alone is not enough.

    The same rule as the operator actions (`dead_letter_redrive`, retry, skip, resume).
    """
    return bool(user and user.is_authenticated and user.is_active and
                (user.is_superuser or user.has_perm("orchestrator.redrive_deadletter")))


def database_status() -> str:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Exception as exc:  # any failure is the answer, not a crash
        return f"error: {exc.__class__.__name__}: {exc}"
    return "ok"


def broker_status() -> str:
    from .celery import app as celery_app

    try:
        with celery_app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1)
    except Exception as exc:  # any failure is the answer, not a crash
        return f"error: {exc.__class__.__name__}: {exc}"
    return "ok"


def workers_seen() -> list[dict]:
    beats = WorkerHeartbeat.objects.filter(last_seen__gte=now() - WORKER_SEEN_WITHIN)
    return list(beats.order_by("hostname").values("hostname", "queues", "last_seen"))


def health_details(*, user) -> dict:
    """Database, broker and recent workers, for an operator.

    Raises PermissionError unless `user_may_see_health(user)`.
    """
    if not user_may_see_health(user):
        raise PermissionError(
            "health details need the orchestrator.redrive_deadletter (operator) permission")
    database = database_status()
    broker = broker_status()
    return {
        "status": "ok" if database == broker == "ok" else "degraded",
        "database": database,
        "broker": broker,
        "workers": workers_seen() if database == "ok" else [],
    }
