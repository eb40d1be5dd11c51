"""Unauthenticated endpoints: health, and the definition format's JSON Schema.

Health answers "can this deployment work right now": the database (200/503 hangs on it), the
broker, and which workers have sent a heartbeat recently. It reads and pings; it changes
nothing.
"""
from datetime import timedelta

from django.db import connection
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from ..clock import now
from ..definitions import definition_format_schema
from ..models import WorkerHeartbeat

# A worker that has not beaten for this long is not listed.
WORKER_SEEN_WITHIN = timedelta(seconds=30)


def database_status() -> str:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Exception as exc:  # any failure is the answer, not a crash
        return f"error: {exc.__class__.__name__}: {exc}"
    return "ok"


def broker_status() -> str:
    from ..celery import app as celery_app

    try:
        with celery_app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1)
    except Exception as exc:  # any failure is the answer, not a crash
        return f"error: {exc.__class__.__name__}: {exc}"
    return "ok"


def workers_seen() -> list[dict]:
    beats = WorkerHeartbeat.objects.filter(last_seen__gte=now() - WORKER_SEEN_WITHIN)
    return list(beats.order_by("hostname").values("hostname", "queues", "last_seen"))


_HEALTH = inline_serializer("Health", {
    "status": serializers.ChoiceField(choices=["ok", "degraded"]),
    "database": serializers.CharField(help_text='"ok" or the error.'),
    "broker": serializers.CharField(help_text='"ok" or the error.'),
    "workers": inline_serializer("WorkerSeen", {
        "hostname": serializers.CharField(),
        "queues": serializers.ListField(child=serializers.CharField()),
        "last_seen": serializers.DateTimeField(),
    }, many=True),
})


class HealthView(APIView):
    """200 while the database answers (status "degraded" if the broker does not); else 503."""

    authentication_classes: list = []
    permission_classes = [AllowAny]

    @extend_schema(responses={200: _HEALTH, 503: _HEALTH}, auth=[])
    def get(self, request):
        database = database_status()
        broker = broker_status()
        workers = workers_seen() if database == "ok" else []
        body = {
            "status": "ok" if database == broker == "ok" else "degraded",
            "database": database,
            "broker": broker,
            "workers": workers,
        }
        code = status.HTTP_200_OK if database == "ok" else status.HTTP_503_SERVICE_UNAVAILABLE
        return Response(body, status=code)


class DefinitionSchemaView(APIView):
    """The JSON Schema (draft 2020-12) of a workflow definition."""

    authentication_classes: list = []
    permission_classes = [AllowAny]

    @extend_schema(responses={200: OpenApiTypes.OBJECT}, auth=[])
    def get(self, request):
        return Response(definition_format_schema())
