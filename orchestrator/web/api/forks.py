"""Forking a run in the API (`POST /api/v1/runs/<id>/fork/`): parse the request, call
`services.forks.run_fork`, answer with the new run. The service decides and checks everything
(docs/operations.md#forking-a-run)."""
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound
from rest_framework.generics import GenericAPIView
from rest_framework.response import Response

from orchestrator.engine.authz import visible
from orchestrator.engine.selectors import runs_with_version
from orchestrator.engine.services.forks import run_fork
from orchestrator.models import Run

from .errors import ServiceErrorsMixin, valid_data
from .parsers import JSONBodyParser
from .serializers import ErrorsSerializer, RunDetailSerializer
from .throttling import RUN_START_THROTTLES, RunStartThrottleMixin
from .views import with_steps

_ERRORS = OpenApiResponse(ErrorsSerializer, description="Every problem, each with its path.")


class RunForkRequestSerializer(serializers.Serializer):
    step = serializers.RegexField(r"^[a-z][a-z0-9_]*$", max_length=64, help_text=(
        "The step the fork runs again from; it and every step downstream of it run again."))
    version = serializers.IntegerField(required=False, min_value=1, help_text=(
        "A version of the same workflow (default: the source run's)."))
    input = serializers.DictField(required=False, help_text=(
        "Replaces the run's input (default: the source run's); must satisfy the input_schema."))
    step_input = serializers.DictField(required=False, help_text=(
        "{upstream step: output}: what the fork step reads of those steps in place of their "
        "outputs; checked against the step's input_schema, and a tool step's params against "
        "its tool's schema."))
    repeat_effects = serializers.ListField(
        child=serializers.CharField(max_length=64), required=False, default=list, max_length=100,
        help_text="Steps whose side effects the source performed that this fork performs again "
        "(otherwise each returns the source's recorded outcome); refused for a step behind a "
        "gate the fork does not ask again.")
    reason = serializers.CharField(required=False, default="", allow_blank=True, max_length=500,
                                   help_text="Why: recorded with each repeated effect.")

    def validate(self, attrs: dict) -> dict:
        unknown = set(self.initial_data) - set(self.fields)
        if unknown:
            raise serializers.ValidationError(f"unknown field(s): {', '.join(sorted(unknown))}")
        return attrs


class RunForkView(ServiceErrorsMixin, RunStartThrottleMixin, GenericAPIView):
    parser_classes = [JSONBodyParser]
    throttle_classes = RUN_START_THROTTLES
    serializer_class = RunForkRequestSerializer

    def get_queryset(self):
        return visible(Run.objects.all(), self.request.user)

    @extend_schema(
        operation_id="runs_fork",
        request=RunForkRequestSerializer,
        parameters=[OpenApiParameter(
            "Idempotency-Key", str, OpenApiParameter.HEADER,
            description="Asking again with the same key and body returns the first fork (200); "
                        "with another body, 409.")],
        responses={202: RunDetailSerializer, 200: RunDetailSerializer, 400: _ERRORS,
                   403: _ERRORS, 404: _ERRORS, 409: _ERRORS, 429: _ERRORS},
        description="Start a fork of the run from `step`, on the same or another version of its "
        "workflow: the steps before it that completed are carried over with their outputs "
        "(no model call, no cost), it and everything downstream run again. An effect the source "
        "performed is not performed again unless its step is in `repeat_effects`. Needs "
        "run.start in the run's team; 400 for a bad step, version, input or step input (each "
        "problem by path, nothing created); 409 for an effect to repeat behind a gate the fork "
        "does not ask again, or an archived workflow.",
    )
    def post(self, request, pk=None):
        source = self.get_queryset().filter(pk=pk).first()
        if source is None:
            raise NotFound("no such run")
        body = valid_data(RunForkRequestSerializer(data=request.data))
        try:
            fork = run_fork(run_id=source.id, step=body["step"], actor=request.user,
                            version=body.get("version"), input=body.get("input"),
                            step_input=body.get("step_input"),
                            repeat_effects=body["repeat_effects"], reason=body["reason"],
                            idempotency_key=request.headers.get("Idempotency-Key"))
        except Run.DoesNotExist:
            raise NotFound("no such run") from None
        created = fork._created
        fork = with_steps(visible(runs_with_version().select_related("team", "created_by"),
                                  request.user)).get(pk=fork.pk)
        return Response(RunDetailSerializer(fork, context=self.get_serializer_context()).data,
                        status=status.HTTP_202_ACCEPTED if created else status.HTTP_200_OK)
