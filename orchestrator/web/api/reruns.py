"""Bulk re-runs in the API: `POST /api/v1/runs/rerun/` asks to start chosen runs (or every run
matching the run list's filters) again on a chosen version; `GET /api/v1/reruns/<id>/` shows how
far the batch got, each source run with its new run or the reason it was refused.

Entry points only: they parse, find the workflow and version asked for, call
`services.reruns.runs_rerun` (which checks run.start), and serialize (docs/operations.md).
"""
from django.db.models import Prefetch, QuerySet
from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_view,
)
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from orchestrator.engine.authz import visible
from orchestrator.engine.services.reruns import (
    MAX_KEY_CHARS,
    MAX_RERUN_RUNS,
    rerun_version,
    rerun_workflow,
    runs_rerun,
)
from orchestrator.engine.states import RunState
from orchestrator.models import Rerun, RerunItem

from .errors import ServiceErrorsMixin, error_body, valid_data
from .parsers import JSONBodyParser
from .serializers import ErrorSerializer, ErrorsSerializer
from .throttling import RUN_START_THROTTLES, RunStartThrottleMixin

_ERRORS = OpenApiResponse(ErrorsSerializer, description="Every problem, each with its path.")


class RerunFilterSerializer(serializers.Serializer):
    """The run list's filters (`GET /api/v1/runs/`), naming the workflow."""

    workflow = serializers.RegexField(r"^[a-z][a-z0-9_-]*$", max_length=100,
                                      help_text="The workflow whose runs to re-run.")
    team = serializers.SlugField(required=False, help_text="Needed when two of your teams have "
                                 "a workflow of that name.")
    state = serializers.ListField(child=serializers.ChoiceField(choices=RunState.choices),
                                  required=False, min_length=1, max_length=len(RunState.values),
                                  help_text="Only runs in one of these states.")
    created_after = serializers.DateTimeField(required=False, help_text="ISO 8601, inclusive.")
    created_before = serializers.DateTimeField(required=False, help_text="ISO 8601, exclusive.")


class RerunRequestSerializer(serializers.Serializer):
    runs = serializers.ListField(child=serializers.UUIDField(), required=False, min_length=1,
                                 max_length=MAX_RERUN_RUNS,
                                 help_text="The runs to start again (of one workflow).")
    filter = RerunFilterSerializer(required=False, help_text="Or every run matching these "
                                   f"filters (at most {MAX_RERUN_RUNS}).")
    version = serializers.IntegerField(min_value=1, max_value=2**31 - 1,
                                       help_text="The version of their workflow the new runs run on.")

    def validate(self, data):
        if ("runs" in data) == ("filter" in data):
            raise serializers.ValidationError({"runs": "give either runs or filter"})
        return data


class RerunItemSerializer(serializers.ModelSerializer):
    source_run = serializers.UUIDField(source="source_run_id", read_only=True)
    new_run = serializers.UUIDField(source="new_run_id", read_only=True, allow_null=True,
                                    help_text="The run started in its place; null until started, "
                                    "or when refused.")
    reason = serializers.CharField(read_only=True, help_text="Why it was refused; empty otherwise.")
    problems = ErrorSerializer(many=True, read_only=True, help_text="The refusal's problems by path.")
    retry_after_s = serializers.IntegerField(read_only=True, allow_null=True,
                                             help_text="When a budget's refusal may pass, in seconds.")

    class Meta:
        model = RerunItem
        fields = ["position", "source_run", "outcome", "new_run", "reason", "problems", "retry_after_s",
                  "finished_at"]


class RerunSerializer(serializers.ModelSerializer):
    url = serializers.HyperlinkedIdentityField(view_name="api:rerun-detail")
    team = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    workflow = serializers.CharField(source="version.workflow.name", read_only=True)
    version = serializers.IntegerField(source="version.number", read_only=True)
    requested_by = serializers.CharField(source="actor", read_only=True,
                                         help_text='"user:<name>", or the engine.')
    pending = serializers.SerializerMethodField()
    selection = serializers.JSONField(read_only=True, help_text='{"runs": <how many named>} or '
                                      '{"filter": {...}}.')
    items = RerunItemSerializer(many=True, read_only=True)

    class Meta:
        model = Rerun
        fields = ["id", "url", "team", "workflow", "version", "requested_by", "key", "state", "total",
                  "started", "refused", "pending", "selection", "created_at", "finished_at", "items"]

    def get_pending(self, rerun: Rerun) -> int:
        """Source runs not started or refused yet."""
        return max(rerun.total - rerun.started - rerun.refused, 0)


def reruns_of(user) -> QuerySet[Rerun]:
    """The batches of the person's teams, each with its items in order."""
    return visible(Rerun.objects.select_related("team", "version__workflow"), user).defer(
        "version__definition", "version__normalized").prefetch_related(
        Prefetch("items", queryset=RerunItem.objects.order_by("position"))).order_by("-created_at")


class RerunStartView(ServiceErrorsMixin, RunStartThrottleMixin, APIView):
    parser_classes = [JSONBodyParser]
    # A batch is one start request for the person's and the token's rates; each of its runs
    # is admitted by the team's and the workflow's caps as it starts.
    throttle_classes = RUN_START_THROTTLES

    def start_path(self, request) -> str:
        return "rerun"

    @extend_schema(
        operation_id="runs_rerun", request=RerunRequestSerializer,
        parameters=[OpenApiParameter(
            "Idempotency-Key", {"type": "string", "minLength": 1, "maxLength": MAX_KEY_CHARS,
                                "pattern": r"\S"}, OpenApiParameter.HEADER, required=True,
            description="Names the batch in its team: asking again with the same key and body "
            "returns the same batch and starts nothing twice; the same key with another body is "
            "a 409.")],
        examples=[OpenApiExample("failed runs onto the fixed version", request_only=True,
                                 value={"filter": {"workflow": "support", "state": ["failed"]},
                                        "version": 4}),
                  OpenApiExample("chosen runs", request_only=True,
                                 value={"runs": ["3f1c2a8e-7d4b-4c61-9a0e-5b2d8c7f1e93"], "version": 4})],
        responses={202: OpenApiResponse(RerunSerializer, description="The batch was recorded; a "
                                        "worker starts its runs (follow `url`)."),
                   200: OpenApiResponse(RerunSerializer, description="A repeat: the existing batch."),
                   400: _ERRORS, 403: _ERRORS, 409: _ERRORS,
                   429: OpenApiResponse(ErrorsSerializer, description="The person or token asked for as "
                                        "many run starts as its rate allows; Retry-After says when to "
                                        "ask again.")},
        description="Start runs again, each with its own input, on `version` of their workflow: "
        "the `runs` named (all of one workflow) or every run matching `filter`. Each new run is "
        "started as you would start it (run.start, the team's and workflow's caps and budgets, "
        "the version's gates and release policy); a source that cannot start again (still going, "
        "a child run, refused by a budget...) is refused by itself, with the reason, in the "
        "batch. 400 for runs that are not your teams' or not of one workflow, a filter matching "
        "nothing, a version the workflow does not have; 403 without run.start.")
    def post(self, request):
        body = valid_data(RerunRequestSerializer(data=request.data))
        key = request.headers.get("Idempotency-Key", "")
        if not key.strip() or len(key) > MAX_KEY_CHARS:
            raise ValidationError(error_body(f"an Idempotency-Key header of 1 to {MAX_KEY_CHARS} "
                                             "characters names the batch", "Idempotency-Key"))
        run_ids = [str(run_id) for run_id in body["runs"]] if "runs" in body else None
        filters = dict(body["filter"]) if "filter" in body else None
        workflow = rerun_workflow(actor=request.user, run_ids=run_ids, filters=filters)
        version = rerun_version(workflow, body["version"])
        rerun = runs_rerun(run_ids=run_ids, filters=filters, version=version, actor=request.user, key=key)
        answer = RerunSerializer(reruns_of(request.user).get(pk=rerun.pk), context={"request": request})
        return Response(answer.data, status=status.HTTP_202_ACCEPTED if rerun._created else status.HTTP_200_OK)


@extend_schema_view(
    list=extend_schema(description="Bulk re-runs of your teams' runs, newest first."),
    retrieve=extend_schema(description="A bulk re-run's progress: how many of its source runs were "
                           "started again or refused, and each one's new run or reason."),
)
class RerunViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = RerunSerializer

    def get_queryset(self) -> QuerySet[Rerun]:
        return reruns_of(self.request.user)
