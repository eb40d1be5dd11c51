"""The API endpoints: parse the request, call one service, serialize the answer.

Every queryset is scoped to the caller's teams (`authz.visible`), so an object of another
team is a 404. Whether the caller may act is the service's to decide (`authz`); service
exceptions propagate to `ServiceErrorsMixin`, which maps them to 400/403/409 with an `errors`
list; views do not catch them one by one.
"""
import re
import uuid
from decimal import Decimal

from django.db.models import Max, OuterRef, Prefetch, QuerySet, Subquery
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_view,
)
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import APIException, NotFound, Throttled, ValidationError
from rest_framework.response import Response

from approvals.models import ApprovalDecision, ApprovalRequest, InputTask
from budgets.serializers import BudgetRaiseSerializer, RunEstimateSerializer
from budgets.services import run_estimate
from orchestrator.engine.authz import visible, visible_listed, visible_workflows_named
from orchestrator.engine.definitions import DefinitionInvalid, parse_definition_text
from orchestrator.engine.definitions.limits import MAX_SIGNAL_KEY_CHARS
from orchestrator.engine.errors import NotAllowed
from orchestrator.engine.provenance import of_start as provenance_of_start
from orchestrator.engine.selectors import latest_version, runs_with_version
from orchestrator.engine.services.kinds.human_gate import (
    approval_edit,
    approval_grant,
    approval_reject,
    approval_revoke,
)
from orchestrator.engine.services.kinds.human_input import input_answer
from orchestrator.engine.services.operators import (
    dead_letter_redrive,
    run_budget_raise,
    run_resume,
    step_retry,
    step_skip,
)
from orchestrator.engine.services.runs import input_problems, run_cancel, run_start
from orchestrator.engine.services.signals import signal_send
from orchestrator.engine.services.workflows import (
    definition_problems,
    workflow_archive,
    workflow_policy_set,
    workflow_publish,
    workflow_restore,
    workflow_save,
)
from orchestrator.models import DeadLetter, Event, Run, StepRun, Workflow, WorkflowVersion

from ..progress import LONG_POLL_MAX_S, LongPollsExhausted, long_poll_slot, wait_for_event
from . import serializers as s
from .errors import ServiceErrorsMixin, error_body, errors_of, problems_body, valid_data
from .filters import ApprovalFilter, DeadLetterFilter, InputTaskFilter, RunFilter, WorkflowFilter
from .parsers import JSONBodyParser, TextYAMLParser, YAMLParser
from .permissions import team_for_write
from .throttling import RUN_START_THROTTLES, RunStartThrottleMixin

_ERRORS = OpenApiResponse(s.ErrorsSerializer, description="Every problem, each with its path.")
_DEFINITION_BODY = {
    "application/json": s.DefinitionRequestSerializer,
    "application/yaml": OpenApiTypes.STR,
    "text/yaml": OpenApiTypes.STR,
}
_TEAM_PARAM = OpenApiParameter(
    "team", str, description="Team slug: needed when you belong to several teams."
)


def read_definition(request) -> tuple[object, str | None]:
    """(definition, team slug) from a bare definition, `{"definition", "team"}`, or YAML text.

    Raises DefinitionInvalid when a wrapped `definition` is text that does not parse.
    """
    data = request.data
    team = request.query_params.get("team")
    if isinstance(data, dict) and "definition" in data and set(data) <= {"definition", "team"}:
        team = data.get("team") or team
        data = data["definition"]
        if isinstance(data, str):
            data = parse_definition_text(data)
    return data, team


class WorkflowViewSet(ServiceErrorsMixin, RunStartThrottleMixin, viewsets.GenericViewSet):
    """Workflows of your teams, addressed by name (add `?team=` if two teams share a name)."""

    lookup_field = "name"
    lookup_value_regex = r"[a-z][a-z0-9_-]*"
    filterset_class = WorkflowFilter
    parser_classes = [JSONBodyParser, YAMLParser, TextYAMLParser]
    serializer_class = s.WorkflowListSerializer

    def get_queryset(self) -> QuerySet[Workflow]:
        workflows = visible(Workflow.objects.select_related("team"), self.request.user)
        if self.action in ("runs", "estimate"):  # the version they start, in the same SELECT
            workflows = workflows.select_related("active_version")
        if self.action == "list":
            workflows = workflows.annotate(
                latest_number=Max("versions__number"), updated_at=Max("versions__created_at")
            )
        return workflows.order_by("name", "team__slug")

    def get_object(self) -> Workflow:
        name = self.kwargs["name"]
        if self.action in ("runs", "estimate"):  # every run started: the lookup compiled
            found = visible_workflows_named(self.request.user, name,
                                            team_slug=self.request.query_params.get("team"))
        else:
            found = list(self.filter_queryset(self.get_queryset()).filter(name=name)[:10])
        if not found:
            raise NotFound(f"workflow '{name}' not found")
        if len(found) > 1:
            slugs = ", ".join(w.team.slug for w in found)
            raise ValidationError(error_body(
                f"workflow '{name}' exists in several of your teams ({slugs}); add ?team=<slug>",
                "team",
            ))
        return found[0]

    @extend_schema(parameters=[_TEAM_PARAM])
    def list(self, request):
        """Workflows of your teams, with their latest version number."""
        page = self.paginate_queryset(self.filter_queryset(self.get_queryset()))
        return self.get_paginated_response(self.get_serializer(page, many=True).data)

    @extend_schema(parameters=[_TEAM_PARAM], responses={200: s.WorkflowDetailSerializer, 400: _ERRORS})
    def retrieve(self, request, name=None):
        """The latest version's definition, which version is published, and every version's
        number and URL."""
        return self._detail(self.get_object())

    @extend_schema(
        request=_DEFINITION_BODY,
        parameters=[_TEAM_PARAM],
        responses={
            201: OpenApiResponse(s.WorkflowVersionSerializer, description="A new version."),
            200: OpenApiResponse(s.WorkflowVersionSerializer, description="Unchanged."),
            400: _ERRORS,
        },
        description="Save a definition: a bare definition object, `{\"definition\": ..., "
        "\"team\": ...}`, or YAML text. A changed definition becomes the next version.",
    )
    def create(self, request):
        definition, slug = read_definition(request)
        team = team_for_write(request.user, slug)
        version, created = workflow_save(team=team, definition=definition, actor=request.user)
        context = {**self.get_serializer_context(), "created": created}
        return Response(s.WorkflowVersionSerializer(version, context=context).data,
                        status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(
        request=_DEFINITION_BODY,
        parameters=[_TEAM_PARAM],
        responses={200: s.ValidationResultSerializer, 400: s.ValidationResultSerializer},
        description="Check a definition the way saving would, listing every problem. "
        "Saves nothing.",
    )
    @action(detail=False, methods=["post"])
    def validate(self, request):
        try:
            definition, slug = read_definition(request)
            team = team_for_write(request.user, slug)
            problems = problems_body(definition_problems(definition, team=team))["errors"]
        except DefinitionInvalid as exc:
            problems = problems_body(exc.problems)["errors"]
        except APIException as exc:  # unreadable body or no team
            problems = errors_of(exc)
        return Response({"valid": not problems, "errors": problems},
                        status=status.HTTP_400_BAD_REQUEST if problems else status.HTTP_200_OK)

    @extend_schema(parameters=[_TEAM_PARAM], responses=s.WorkflowVersionSummarySerializer(many=True))
    @action(detail=True, methods=["get"])
    def versions(self, request, name=None):
        """Every version of the workflow, newest first."""
        workflow = self.get_object()
        versions = (workflow.versions.select_related("created_by")
                    .defer("definition", "normalized").order_by("-number"))
        page = self.paginate_queryset(versions)
        return self.get_paginated_response(
            s.WorkflowVersionSummarySerializer(page, many=True, context=self.get_serializer_context()).data
        )

    @extend_schema(parameters=[_TEAM_PARAM], responses=s.WorkflowVersionSerializer)
    @action(detail=True, methods=["get"], url_path=r"versions/(?P<number>[0-9]+)", url_name="version")
    def version(self, request, name=None, number=None):
        """One version: the definition as submitted and as normalized."""
        workflow = self.get_object()
        version = workflow.versions.select_related("created_by").filter(number=number).first()
        if version is None:
            raise NotFound(f"workflow '{workflow.name}' has no version {number}")
        return Response(s.WorkflowVersionSerializer(version, context=self.get_serializer_context()).data)

    @extend_schema(parameters=[_TEAM_PARAM], request=None,
                   responses={200: s.WorkflowDetailSerializer, 403: _ERRORS, 409: _ERRORS},
                   description="Publish this version: runs and triggers start it from now on. "
                   "A version that drops or weakens a mandatory gate of the published one, or "
                   "calls a tool a gate policy guards without a satisfying gate, needs an owner "
                   "(403 listing each problem by path); publishing the published version again "
                   "is how an owner waives what a policy set since finds unguarded in it.")
    @action(detail=True, methods=["post"], url_path=r"versions/(?P<number>[0-9]+)/publish",
            url_name="version-publish")
    def publish(self, request, name=None, number=None):
        workflow = workflow_publish(workflow_id=self.get_object().id, number=int(number),
                                    actor=request.user)
        return self._detail(workflow)

    @extend_schema(parameters=[_TEAM_PARAM], request=None,
                   responses={200: s.WorkflowDetailSerializer, 403: _ERRORS},
                   description="Archive the workflow: its versions and runs stay, no new run "
                   "starts (API, triggers, parents).")
    @action(detail=True, methods=["post"])
    def archive(self, request, name=None):
        return self._detail(workflow_archive(workflow_id=self.get_object().id, actor=request.user))

    @extend_schema(parameters=[_TEAM_PARAM], request=None,
                   responses={200: s.WorkflowDetailSerializer, 403: _ERRORS},
                   description="Restore an archived workflow: runs may start again.")
    @action(detail=True, methods=["post"])
    def restore(self, request, name=None):
        return self._detail(workflow_restore(workflow_id=self.get_object().id, actor=request.user))

    @extend_schema(parameters=[_TEAM_PARAM], request=s.WorkflowPolicySerializer,
                   responses={200: s.WorkflowDetailSerializer, 400: _ERRORS, 403: _ERRORS},
                   description="Whether saving a version publishes it (owners).")
    @action(detail=True, methods=["post"], parser_classes=[JSONBodyParser])
    def policy(self, request, name=None):
        body = valid_data(s.WorkflowPolicySerializer(data=request.data))
        return self._detail(workflow_policy_set(workflow_id=self.get_object().id,
                                                publish_on_save=body["publish_on_save"],
                                                actor=request.user))

    def _detail(self, workflow: Workflow) -> Response:
        workflow.latest = latest_version(team=workflow.team, name=workflow.name)
        workflow.all_versions = list(
            workflow.versions.select_related("created_by").defer("definition", "normalized")
            .order_by("-number"))
        return Response(s.WorkflowDetailSerializer(workflow, context=self.get_serializer_context()).data)

    @extend_schema(
        request=s.RunStartRequestSerializer,
        examples=s.RUN_START_EXAMPLES,
        parameters=[
            _TEAM_PARAM,
            OpenApiParameter(
                "Idempotency-Key", str, OpenApiParameter.HEADER,
                description="Replaying a request with the same key and body returns the same "
                "run; the same key with another body is a 409.",
            ),
            OpenApiParameter(
                "via", str, enum=["api", "builder"],
                description="Where the person started it, for the run's provenance: the "
                "builder's Run says `builder`; the start is the same.",
            ),
        ],
        responses={
            202: OpenApiResponse(s.RunSerializer, description="The run was created and started."),
            200: OpenApiResponse(s.RunSerializer, description="A replay: the existing run."),
            400: _ERRORS,
            403: _ERRORS,
            409: _ERRORS,
            429: OpenApiResponse(s.ErrorsSerializer, description=(
                "The team's or the workflow's budget refuses a new run now (its cap on "
                "unfinished runs, or its day's or month's limit), or the person or token "
                "started as many runs as its rate allows; Retry-After says when to ask again.")),
        },
        description="Start a run of the published version (or of `version`; one that drops or "
        "weakens a mandatory gate of the published version, or calls a tool a gate policy guards "
        "without a satisfying gate, only for an owner: 403 with the paths). 409 when the "
        "workflow is archived or has no published version.",
    )
    @action(detail=True, methods=["post"], parser_classes=[JSONBodyParser],
            throttle_classes=RUN_START_THROTTLES)
    def runs(self, request, name=None):
        workflow = self.get_object()
        body = valid_data(s.RunStartRequestSerializer(data=request.data))
        run = run_start(
            version=self._version_to_run(workflow, body.get("version")), input=body["input"],
            actor=request.user, idempotency_key=request.headers.get("Idempotency-Key"),
            trigger="api", callback_url=body.get("callback_url", ""),
            callback_secret=body.get("callback_secret", ""), capacity=body.get("capacity"),
            provenance=provenance_of_start(request.user, path=self.start_path(request)),
        )
        return Response(s.RunSerializer(run, context=self.get_serializer_context()).data,
                        status=status.HTTP_202_ACCEPTED if run._created else status.HTTP_200_OK)

    @extend_schema(
        request=s.RunStartRequestSerializer,
        examples=s.RUN_START_EXAMPLES,
        parameters=[_TEAM_PARAM],
        responses={200: RunEstimateSerializer, 400: _ERRORS},
        description="What a run with this body would cost and take, projected from the same "
        "estimates its dispatches reserve (docs/budgets.md). Starts nothing.",
    )
    @action(detail=True, methods=["post"], parser_classes=[JSONBodyParser])
    def estimate(self, request, name=None):
        workflow = self.get_object()
        body = valid_data(s.RunStartRequestSerializer(data=request.data))
        version = self._version_to_run(workflow, body.get("version"))
        problems = input_problems(version.normalized["input_schema"], body["input"])
        if problems:
            raise ValidationError({"errors": problems})
        estimate = run_estimate(version=version, run_input=body["input"])
        return Response(RunEstimateSerializer({**estimate.__dict__, "within_budget": estimate.within_budget,
                                               "steps": [e.__dict__ for e in estimate.steps]}).data)

    def start_path(self, request) -> str:
        """"builder" for the builder's Run (it says so in `?via=`), else "api": a label of the
        provenance; both are the same start, checked and limited alike."""
        via = request.query_params.get("via", "api")
        if via not in ("api", "builder"):
            raise ValidationError({"errors": [{"path": "via", "message": "one of: api, builder"}]})
        return via

    @staticmethod
    def _version_to_run(workflow: Workflow, number: int | None) -> WorkflowVersion:
        if number is None:
            version = workflow.active_version
            if version is None:
                raise NotAllowed(f"workflow '{workflow.name}' has no published version",
                                 [{"path": "version", "message": "no published version: publish "
                                   "one, or name a version"}])
        else:
            version = workflow.versions.filter(number=number).first()
        if version is None:
            raise ValidationError(
                error_body(f"workflow '{workflow.name}' has no version {number}", "version")
            )
        version.workflow = workflow  # read with its team already: run_start needs both
        return version


MAX_EVENT_ID = 2**63 - 1
_WHOLE = re.compile(r"[0-9]+")
_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")


def _query_number(request, name: str, high: float, *, whole: bool) -> float | None:
    """The query parameter `name` as a number from 0 to `high` (a whole one with `whole`),
    None when absent; given twice, not a number or out of range is a 400 naming it."""
    values = request.query_params.getlist(name)
    if not values:
        return None
    text = values[0]
    pattern = _WHOLE if whole else _NUMBER
    kind = "a whole number" if whole else "a number"
    if len(values) > 1 or not pattern.fullmatch(text) or len(text) > 40:
        raise ValidationError(error_body(f"{name} must be {kind} from 0 to {high}, given once",
                                         name))
    value = int(text) if whole else float(text)
    if not 0 <= value <= high:
        raise ValidationError(error_body(f"{name} must be {kind} from 0 to {high}", name))
    return value


@extend_schema_view(
    list=extend_schema(description="Runs of your teams, newest first."),
    retrieve=extend_schema(
        description="A run with every step in order, each step's attempts, the approval of each "
        "human gate, and its `progress`. With `wait_for_change=<event id>` (the `last_event` of "
        "the detail you have) the answer waits until the run has a newer event or `timeout` "
        "seconds pass (long-polling for clients without a websocket; docs/live.md).",
        parameters=[
            OpenApiParameter("wait_for_change", {"type": "integer", "minimum": 0,
                                                 "maximum": MAX_EVENT_ID},
                             description="Answer once the run has an event newer than this id "
                             "(its `last_event`)."),
            OpenApiParameter("timeout", {"type": "number", "minimum": 0,
                                         "maximum": LONG_POLL_MAX_S},
                             description=f"Seconds to wait at most (default and at most "
                             f"{LONG_POLL_MAX_S}), with `wait_for_change`; then the unchanged run "
                             "is returned."),
        ],
        responses={200: s.RunDetailSerializer, 429: OpenApiResponse(s.ErrorsSerializer, description=(
            "With `wait_for_change`: you already hold STEPWISE_LONG_POLLS_PER_PERSON long-polls "
            "on this server process (Retry-After)."))}),
)
class RunViewSet(ServiceErrorsMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                 viewsets.GenericViewSet):
    """Runs of your teams, newest first."""

    filterset_class = RunFilter

    def get_queryset(self) -> QuerySet[Run]:
        runs = runs_with_version().select_related("team", "created_by")
        runs = (visible_listed if self.action == "list" else visible)(runs, self.request.user)
        if self.action == "retrieve":
            runs = with_steps(runs)
        return runs.order_by("-created_at")

    def get_serializer_class(self):
        return s.RunSerializer if self.action == "list" else s.RunDetailSerializer

    def retrieve(self, request, *args, **kwargs):
        after = _query_number(request, "wait_for_change", MAX_EVENT_ID, whole=True)
        timeout = _query_number(request, "timeout", LONG_POLL_MAX_S, whole=False)
        if after is not None:
            run = self.get_object()  # 404 before waiting, for a run the person may not see
            try:
                with long_poll_slot(request.user.pk):
                    wait_for_event(run, after=int(after),
                                   timeout=LONG_POLL_MAX_S if timeout is None else timeout)
            except LongPollsExhausted as exc:
                raise Throttled(wait=1, detail=str(exc)) from None
        return super().retrieve(request, *args, **kwargs)

    @extend_schema(request=None, responses={202: s.RunDetailSerializer, 403: _ERRORS, 409: _ERRORS},
                   description="Cancel the run: nothing new starts, running steps finish, then "
                   "the run is `cancelled`. Operators, or whoever started the run. 409 if it "
                   "has already ended or is compensating.")
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        run = self.get_object()
        run_cancel(run_id=run.id, actor=request.user)
        return self._accepted(run)

    @extend_schema(request=None, responses={202: s.RunDetailSerializer, 403: _ERRORS, 409: _ERRORS},
                   description="Resume a paused run. Operators only.")
    @action(detail=True, methods=["post"])
    def resume(self, request, pk=None):
        run = self.get_object()
        run_resume(run_id=run.id, actor=request.user)
        return self._accepted(run)

    @extend_schema(request=BudgetRaiseSerializer,
                   responses={202: s.RunDetailSerializer, 403: _ERRORS, 409: _ERRORS},
                   description="Raise the run's cost limit, its duration limit or both (stored "
                   "on the run, audited; the definition is unchanged) and resume it if it is "
                   "paused. Operators only; 409 once the run has ended.")
    @action(detail=True, methods=["post"], parser_classes=[JSONBodyParser])
    def budget(self, request, pk=None):
        run = self.get_object()
        body = valid_data(BudgetRaiseSerializer(data=request.data))
        cost = body.get("max_cost_usd")
        run_budget_raise(run_id=run.id, max_cost_usd=None if cost is None else cost.quantize(Decimal("0.000001")),
                         max_duration_s=body.get("max_duration_s"), reason=body["reason"], actor=request.user)
        return self._accepted(run)

    @extend_schema(
        request=s.SignalSendSerializer,
        parameters=[OpenApiParameter(
            "Idempotency-Key", str, OpenApiParameter.HEADER,
            description="Sending again with the same key returns the first send's result and "
                        "changes nothing (a random key when none is given).")],
        responses={202: s.SignalSerializer, 200: s.SignalSerializer, 400: _ERRORS, 403: _ERRORS,
                   404: _ERRORS, 409: _ERRORS},
        description="Send the signal `name` to the run: the wait step waiting for it completes "
        "with `payload` as its output (`state: consumed`), or, when it has not started waiting, "
        "the signal is kept for it (`buffered`) if the step allows. 202 for a new signal, 200 "
        "for a key already sent; 400 for a payload that fails the step's schema (each problem "
        "by path, nothing consumed); 409 when no step of the run waits for `name`, the run has "
        "ended, the step refuses early signals or the run keeps as many as it may, or the key "
        "was sent with another payload. Needs run.signal in the run's team.")
    @action(detail=True, methods=["post"], url_path=r"signals/(?P<name>[a-z][a-z0-9_]*)",
            parser_classes=[JSONBodyParser])
    def signal(self, request, pk=None, name=None):
        run = self.get_object()
        body = valid_data(s.SignalSendSerializer(data=request.data))
        key = request.headers.get("Idempotency-Key") or str(uuid.uuid4())
        if len(key) > MAX_SIGNAL_KEY_CHARS:
            raise ValidationError(error_body(f"must be at most {MAX_SIGNAL_KEY_CHARS} characters",
                                             "Idempotency-Key"))
        outcome = signal_send(run_id=run.id, name=name, payload=body["payload"], key=key,
                              actor=request.user)
        answer = s.SignalSerializer(outcome.signal, context={"duplicate": outcome.duplicate}).data
        return Response(answer, status=status.HTTP_200_OK if outcome.duplicate
                        else status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={202: s.RunDetailSerializer, 403: _ERRORS, 409: _ERRORS,
                                            429: _ERRORS},
                   description="Run a failed step again (paused or failed run). Operators only; "
                   "429 when its next attempt would cross the run's budget (raise it first).")
    @action(detail=True, methods=["post"], url_path=r"steps/(?P<step>[a-z][a-z0-9_]*)/retry")
    def retry_step(self, request, pk=None, step=None):
        return self._on_step(request, step, step_retry)

    @extend_schema(request=None, responses={202: s.RunDetailSerializer, 403: _ERRORS, 409: _ERRORS},
                   description="Let a paused run go on without its failed step. Operators only.")
    @action(detail=True, methods=["post"], url_path=r"steps/(?P<step>[a-z][a-z0-9_]*)/skip")
    def skip_step(self, request, pk=None, step=None):
        return self._on_step(request, step, step_skip)

    def _on_step(self, request, name: str, service) -> Response:
        """Call an operator service on the run's step `name`; answer with the run."""
        run = self.get_object()
        step_id = run.steps.filter(name=name).values_list("id", flat=True).first()
        if step_id is None:
            raise NotFound(f"run has no step '{name}'")
        service(step_id=step_id, actor=request.user)
        return self._accepted(run)

    def _accepted(self, run: Run) -> Response:
        """202 with the run as it is now, steps included, after an action on it."""
        run = with_steps(self.get_queryset()).get(pk=run.pk)
        return Response(self.get_serializer(run).data, status=status.HTTP_202_ACCEPTED)


class DeadLetterViewSet(ServiceErrorsMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                        viewsets.GenericViewSet):
    """Work that exhausted its retries, newest first. Filter by status, run, error_class."""

    serializer_class = s.DeadLetterSerializer
    filterset_class = DeadLetterFilter

    def get_queryset(self) -> QuerySet[DeadLetter]:
        letters = DeadLetter.objects.select_related("run__team", "step", "redriven_by")
        return visible_listed(letters, self.request.user,
                              team_field="run__team").order_by("-created_at")

    @extend_schema(request=None, responses={200: s.DeadLetterSerializer, 403: _ERRORS, 409: _ERRORS,
                                            429: _ERRORS},
                   description="Run the dead-lettered step again after re-checking its state; "
                   "its side effects are not repeated (the effect ledger). Operators only; "
                   "429 when it would cross the run's budget.")
    @action(detail=True, methods=["post"])
    def redrive(self, request, pk=None):
        letter = self.get_object()
        dead_letter_redrive(dead_letter_id=letter.id, actor=request.user)
        return Response(self.get_serializer(self.get_queryset().get(pk=letter.pk)).data)


def with_steps(runs: QuerySet[Run]) -> QuerySet[Run]:
    """Runs with every step, its attempts and its approval: three queries, however many steps."""
    latest = ApprovalRequest.objects.filter(step=OuterRef("pk")).order_by("-id")
    steps = (StepRun.objects.annotate(approval_id=Subquery(latest.values("id")[:1]),
                                      approval_state=Subquery(latest.values("state")[:1]))
             .prefetch_related("attempt_records").order_by("position"))
    newest = Event.objects.filter(run=OuterRef("pk")).order_by("-id").values("id")[:1]
    return runs.select_related("parent_step", "trigger_firing__trigger").prefetch_related(
        Prefetch("steps", queryset=steps)).annotate(newest_event=Subquery(newest))


@extend_schema_view(
    list=extend_schema(description="Approval requests of your teams' runs (superusers: all)."),
    retrieve=extend_schema(description="One approval request, with the context it approves."),
)
class ApprovalViewSet(ServiceErrorsMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                      viewsets.GenericViewSet):
    """Approval requests of your teams' runs (superusers: all). Filter with `?state=pending`."""

    filterset_class = ApprovalFilter
    serializer_class = s.ApprovalSerializer

    def get_queryset(self) -> QuerySet[ApprovalRequest]:
        approvals = ApprovalRequest.objects.select_related(
            "run__team", "run__version__workflow", "step", "decided_by"
        ).defer("run__version__definition", "run__version__normalized").prefetch_related(
            Prefetch("decisions", queryset=ApprovalDecision.objects.select_related("user")))
        return visible_listed(approvals, self.request.user,
                              team_field="run__team").order_by("-requested_at")

    def _answer(self, approval_id: int) -> Response:
        return Response(self.get_serializer(self.get_queryset().get(pk=approval_id)).data)

    @extend_schema(request=s.ApprovalDecisionSerializer,
                   responses={200: s.ApprovalSerializer, 400: _ERRORS, 403: _ERRORS, 409: _ERRORS},
                   description="Approve the action whose hash you send as `proposal_hash`. Once "
                   "`approvals_required` different people approved, the gate completes with "
                   "{approved, note, decided_by, approved_by, proposal_hash} and the run moves "
                   "on. 403 unless you are one of the approvers (and did not start the run or "
                   "edit its parameters); 409 for a missing or stale hash or a decided request.")
    @action(detail=True, methods=["post"])
    def approve(self, request, pk=None):
        approval = self.get_object()
        body = valid_data(s.ApprovalDecisionSerializer(data=request.data))
        approval_grant(approval_id=approval.id, user=request.user,
                       proposal_hash=body["proposal_hash"], note=body["note"])
        return self._answer(approval.pk)

    @extend_schema(request=s.ApprovalRejectSerializer,
                   responses={200: s.ApprovalSerializer, 400: _ERRORS, 403: _ERRORS, 409: _ERRORS},
                   description="Reject (a `note` is required): the gate fails (class `rejected`) "
                   "and the workflow's on_error policy applies. 403 unless you are one of the "
                   "approvers; 409 for a missing or stale hash or a decided request.")
    @action(detail=True, methods=["post"])
    def reject(self, request, pk=None):
        approval = self.get_object()
        body = valid_data(s.ApprovalRejectSerializer(data=request.data))
        approval_reject(approval_id=approval.id, user=request.user,
                        proposal_hash=body["proposal_hash"], note=body["note"])
        return self._answer(approval.pk)

    @extend_schema(request=s.ApprovalEditSerializer,
                   responses={200: s.ApprovalSerializer, 400: _ERRORS, 403: _ERRORS, 409: _ERRORS},
                   description="Change parameters the gate marks `editable`: checked against the "
                   "action's schema (400 naming each problem), re-hashed and recorded as your "
                   "change. The request stays pending under the new `proposal_hash`; someone "
                   "else must approve it. JSON only: `params` is an object.")
    @action(detail=True, methods=["post"], parser_classes=[JSONBodyParser])
    def edit(self, request, pk=None):
        approval = self.get_object()
        body = valid_data(s.ApprovalEditSerializer(data=request.data))
        approval_edit(approval_id=approval.id, user=request.user,
                      proposal_hash=body["proposal_hash"], params=body["params"], note=body["note"])
        return self._answer(approval.pk)

    @extend_schema(request=s.ApprovalRevokeSerializer,
                   responses={200: s.ApprovalSerializer, 400: _ERRORS, 403: _ERRORS, 409: _ERRORS},
                   description="Withdraw an approval whose action has not started (a `note` is "
                   "required): the guarded steps then refuse to run. 409 once they started.")
    @action(detail=True, methods=["post"])
    def revoke(self, request, pk=None):
        approval = self.get_object()
        body = valid_data(s.ApprovalRevokeSerializer(data=request.data))
        approval_revoke(approval_id=approval.id, user=request.user, note=body["note"])
        return self._answer(approval.pk)


class InputTaskViewSet(ServiceErrorsMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                       viewsets.GenericViewSet):
    """Input tasks of `human_input` steps in your teams' runs (superusers: all). Filter with
    `?state=open`; `?for=me` lists the open tasks waiting for your answer."""

    filterset_class = InputTaskFilter
    serializer_class = s.InputTaskSerializer

    def get_queryset(self) -> QuerySet[InputTask]:
        tasks = InputTask.objects.select_related(
            "run__team", "run__version__workflow", "step", "answered_by"
        ).defer("run__version__definition", "run__version__normalized")
        return visible_listed(tasks, self.request.user,
                              team_field="run__team").order_by("deadline_at", "id")

    @extend_schema(request=s.InputAnswerSerializer,
                   responses={200: s.InputTaskSerializer, 400: _ERRORS, 403: _ERRORS, 409: _ERRORS},
                   description="Answer the task with the form's fields (`answer`), or abstain "
                   "where it allows (`abstain: true`). The step completes with {answer, "
                   "answered_by, abstained} and the run moves on. 400 naming each field the "
                   "form's schema refuses; 403 unless you are the task's assignee or in its "
                   "group (and, where the step asks for separation of duties, did not set the "
                   "run in motion); 409 when the task is stale: answered, expired or cancelled, "
                   "or its run no longer waits for it.")
    @action(detail=True, methods=["post"], parser_classes=[JSONBodyParser])
    def answer(self, request, pk=None):
        task = self.get_object()
        body = valid_data(s.InputAnswerSerializer(data=request.data))
        input_answer(task_id=task.id, user=request.user, answer=body["answer"],
                     abstain=body["abstain"], note=body["note"])
        return Response(self.get_serializer(self.get_queryset().get(pk=task.pk)).data)
