"""Health (liveness and readiness for anyone, details for operators) and the definition format's
JSON Schema.

`/health/` answers anonymous probes with `{"status": "ok"}` and nothing else (liveness: restart
the process if it does not answer); `/health/ready/` says whether the database and the broker
answer (readiness: send it traffic or not), with nothing else.
`/health/details/` gives operators the database, the broker and which workers beat recently
(host names and queues); `orchestrator.operations.health.health_details` decides who is an operator.
"""
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.permissions import AllowAny, IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from orchestrator.engine.definitions import definition_format_schema
from orchestrator.engine.errors import Forbidden
from orchestrator.operations.health import health_details, ready

from .errors import error_body

_LIVENESS = inline_serializer("Liveness", {"status": serializers.ChoiceField(choices=["ok"])})
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
_ERRORS = inline_serializer("HealthErrors", {"errors": inline_serializer("HealthError", {
    "path": serializers.CharField(), "message": serializers.CharField()}, many=True)})


class HealthView(APIView):
    """Liveness: 200 `{"status": "ok"}` whenever the web process answers. Anonymous."""

    authentication_classes: list = []
    permission_classes = [AllowAny]

    @extend_schema(responses={200: _LIVENESS}, auth=[])
    def get(self, request):
        return Response({"status": "ok"})


_READINESS = inline_serializer("Readiness", {
    "status": serializers.ChoiceField(choices=["ready", "not ready"])})


class ReadinessView(APIView):
    """Readiness for load balancers: 200 `{"status": "ready"}` while the database and the broker
    answer, else 503 `{"status": "not ready"}` (which one: the details, for operators).
    Anonymous."""

    authentication_classes: list = []
    permission_classes = [AllowAny]

    @extend_schema(responses={200: _READINESS, 503: _READINESS}, auth=[])
    def get(self, request):
        if ready():
            return Response({"status": "ready"})
        return Response({"status": "not ready"}, status=status.HTTP_503_SERVICE_UNAVAILABLE)


class HealthDetailsView(APIView):
    """200 while the database answers (status "degraded" if the broker does not); else 503.

    Operators only (the operator or owner role in a team, or superuser): 403 otherwise.
    """

    permission_classes = [IsAuthenticated]

    @extend_schema(responses={200: _HEALTH, 503: _HEALTH, 403: _ERRORS})
    def get(self, request):
        try:
            body = health_details(user=request.user)
        except Forbidden as exc:
            return Response(error_body(str(exc)), status=status.HTTP_403_FORBIDDEN)
        code = (status.HTTP_200_OK if body["database"] == "ok"
                else status.HTTP_503_SERVICE_UNAVAILABLE)
        return Response(body, status=code)


class DefinitionSchemaView(APIView):
    """The JSON Schema (draft 2020-12) of a workflow definition."""

    authentication_classes: list = []
    permission_classes = [AllowAny]

    @extend_schema(responses={200: OpenApiTypes.OBJECT}, auth=[])
    def get(self, request):
        return Response(definition_format_schema())
