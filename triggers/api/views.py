"""Trigger endpoints: manage triggers, fire a programmatic one, receive a webhook, replay dead
letters. Each parses the request, calls one service and answers; querysets are scoped to the
caller's teams (`authz.visible`), and whether the caller may act is the service's to decide.
"""
import uuid

from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from orchestrator.engine.authz import visible
from orchestrator.web.api.errors import ServiceErrorsMixin, error_body, valid_data
from orchestrator.web.api.parsers import JSONBodyParser
from orchestrator.web.api.permissions import team_for_write
from orchestrator.web.api.serializers import ErrorsSerializer
from orchestrator.web.api.throttling import RUN_START_THROTTLES, RunStartThrottleMixin

from ..models import EventDeadLetter, Trigger
from ..selectors import webhook_trigger
from ..services.config import trigger_create, trigger_update, webhook_secret_rotate
from ..services.events import event_dead_letter_replay
from ..services.firing import FireOutcome, trigger_fire_api
from ..services.webhooks import webhook_receive
from . import serializers as s
from .serializers import webhook_path

_ERRORS = OpenApiResponse(ErrorsSerializer, description="Every problem, each with its path.")
# How each outcome of a firing is answered.
_STATUS = {
    "started": 202, "signalled": 202, "queued": 202, "debounced": 202, "duplicate": 200, "ignored": 200, "invalid": 400,
    "unauthorized": 401, "not_found": 404, "too_large": 413,
}
# A key refused when its held firing was admitted stays refused: 409. Other refusals (rate,
# concurrent_runs, budget, queue_full): 429 with Retry-After, as every start path answers.
_REFUSED = {"disabled": 409, "refused_at_admission": 409, "uncorrelated": 409}


def outcome_answer(outcome: FireOutcome, request) -> tuple[int, dict, dict]:
    """(status code, body, headers) for a firing's outcome."""
    if outcome.status == "refused":
        code = _REFUSED.get(outcome.reason, 429)
    else:
        code = _STATUS.get(outcome.status, 400)
    if code >= 400:
        body = {"errors": outcome.problems or [{"path": "", "message": outcome.reason}]}
        headers = {"Retry-After": str(outcome.retry_after_s)} if outcome.retry_after_s else {}
        return code, body, headers
    run = outcome.run
    run_url = request.build_absolute_uri(f"/api/v1/runs/{run.id}/") if run else None
    return code, {"status": outcome.status, "run": str(run.id) if run else None,
                  "run_url": run_url, "firing": outcome.firing.id if outcome.firing else None,
                  "key": outcome.firing.key if outcome.firing else None}, {}


@csrf_exempt
@require_POST
def webhook(request, trigger_id):
    """POST a delivery signed the Standard Webhooks way (docs/triggers.md#webhooks).

    Reads at most the trigger's max_body_bytes + 1 of the body, so a huge body costs nothing.
    """
    trigger = webhook_trigger(trigger_id)
    if trigger is None:
        return JsonResponse(error_body("no webhook trigger here"), status=404)
    limit = trigger.max_body_bytes
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    body = b"" if declared > limit else request.read(limit + 1)
    complete = declared <= limit and len(body) <= limit
    outcome = webhook_receive(trigger_id=trigger.id, headers=request.headers, body=body,
                              body_complete=complete)
    code, answer, headers = outcome_answer(outcome, request)
    return JsonResponse(answer, status=code, headers=headers)


class TriggerViewSet(ServiceErrorsMixin, RunStartThrottleMixin, mixins.ListModelMixin,
                     mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Triggers of your teams. Creating and changing them needs trigger.manage."""

    serializer_class = s.TriggerSerializer
    parser_classes = [JSONBodyParser]

    def get_queryset(self):
        triggers = Trigger.objects.select_related("team", "workflow", "created_by", "updated_by")
        return visible(triggers, self.request.user).order_by("team__slug", "name")

    @extend_schema(request=s.TriggerWriteSerializer,
                   responses={201: s.TriggerSerializer, 400: _ERRORS, 403: _ERRORS},
                   description="Create a trigger. A webhook's answer carries its `secret`: the "
                   "only time it is shown.")
    def create(self, request):
        body = s.TriggerWriteSerializer(data=request.data)
        valid_data(body)
        if "kind" not in body.validated_data:
            raise ValidationError(error_body("is required", "kind"))
        team = team_for_write(request.user, body.validated_data.get("team"))
        trigger, secret = trigger_create(team=team, kind=body.validated_data["kind"],
                                         actor=request.user, **body.given())
        answer = self.get_serializer(self.get_queryset().get(pk=trigger.pk)).data
        if secret:
            answer = {**answer, "secret": secret}
        return Response(answer, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.TriggerWriteSerializer,
                   responses={200: s.TriggerSerializer, 400: _ERRORS, 403: _ERRORS})
    def partial_update(self, request, pk=None):
        """Change some settings of a trigger (not its team or kind)."""
        trigger = self.get_object()
        body = s.TriggerWriteSerializer(data=request.data, partial=True)
        valid_data(body)
        fixed = [name for name in ("team", "kind") if name in request.data]
        if fixed:
            raise ValidationError({"errors": [{"path": name, "message": "cannot be changed"}
                                              for name in fixed]})
        trigger_update(trigger_id=trigger.id, actor=request.user, changes=body.given())
        return Response(self.get_serializer(self.get_queryset().get(pk=trigger.pk)).data)

    @extend_schema(request=None, responses={200: s.TriggerSerializer, 403: _ERRORS})
    @action(detail=True, methods=["post"])
    def enable(self, request, pk=None):
        """Enable the trigger; a schedule starts counting its slots from now."""
        return self._set_enabled(True)

    @extend_schema(request=None, responses={200: s.TriggerSerializer, 403: _ERRORS})
    @action(detail=True, methods=["post"])
    def disable(self, request, pk=None):
        """Disable the trigger: it starts nothing until enabled again."""
        return self._set_enabled(False)

    def _set_enabled(self, enabled: bool) -> Response:
        trigger = self.get_object()
        trigger_update(trigger_id=trigger.id, actor=self.request.user, changes={"enabled": enabled})
        return Response(self.get_serializer(self.get_queryset().get(pk=trigger.pk)).data)

    @extend_schema(request=None, responses={200: s.TriggerSecretSerializer, 400: _ERRORS, 403: _ERRORS},
                   description="Give a webhook a new secret, shown in this answer only. The "
                   "previous secret still verifies for 24 hours.")
    @action(detail=True, methods=["post"], url_path="rotate-secret")
    def rotate_secret(self, request, pk=None):
        trigger, secret = webhook_secret_rotate(trigger_id=self.get_object().id, actor=request.user)
        return Response({"secret": secret, "secret_fingerprint": trigger.secret_fingerprint,
                         "webhook_url": request.build_absolute_uri(webhook_path(trigger))})

    @extend_schema(
        request={"application/json": dict},
        parameters=[OpenApiParameter(
            "Idempotency-Key", str, OpenApiParameter.HEADER,
            description="Firing again with the same key returns the same run.")],
        responses={202: s.FireOutcomeSerializer, 200: s.FireOutcomeSerializer, 400: _ERRORS,
                   403: _ERRORS, 409: _ERRORS, 429: _ERRORS},
        description="Fire a programmatic (`api`) trigger: the body is the payload its input "
        "template reads. 202 with the run (or `queued` when admission control holds it), 200 "
        "for a key already fired, 429 with Retry-After past its rate, the team's cap on "
        "unfinished runs, or the person's or token's rate of run starts.")
    @action(detail=True, methods=["post"], throttle_classes=RUN_START_THROTTLES)
    def fire(self, request, pk=None):
        trigger = self.get_object()
        key = request.headers.get("Idempotency-Key") or str(uuid.uuid4())
        if len(key) > 128:
            raise ValidationError(error_body("must be at most 128 characters", "Idempotency-Key"))
        outcome = trigger_fire_api(trigger_id=trigger.id, payload=request.data, key=key,
                                   actor=request.user)
        code, answer, headers = outcome_answer(outcome, request)
        return Response(answer, status=code, headers=headers)

    def start_path(self, request) -> str:
        return "api_trigger"

    @extend_schema(responses=s.FiringSerializer(many=True))
    @action(detail=True, methods=["get"])
    def firings(self, request, pk=None):
        """The trigger's firings, newest first: each key once, with the run it started, or
        (a schedule's refused slot) the reason and problems why it started none."""
        firings = self.get_object().firings.select_related("run", "fired_by").order_by("-created_at")
        page = self.paginate_queryset(firings)
        return self.get_paginated_response(
            s.FiringSerializer(page, many=True, context=self.get_serializer_context()).data)


class EventDeadLetterViewSet(ServiceErrorsMixin, mixins.ListModelMixin,
                             mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Queue events that could not start a run, newest first, with their reasons."""

    serializer_class = s.EventDeadLetterSerializer

    def get_queryset(self):
        letters = EventDeadLetter.objects.select_related("trigger", "replayed_by")
        return visible(letters, self.request.user, team_field="trigger__team").order_by("-created_at")

    @extend_schema(request=None, responses={200: s.EventDeadLetterSerializer, 403: _ERRORS,
                                            409: _ERRORS},
                   description="Process the event again under the trigger's current settings. "
                   "Operators only. It stays open, with the new reason, if it still cannot start.")
    @action(detail=True, methods=["post"])
    def replay(self, request, pk=None):
        letter = self.get_object()
        event_dead_letter_replay(dead_letter_id=letter.id, actor=request.user)
        return Response(self.get_serializer(self.get_queryset().get(pk=letter.pk)).data)
