"""Evaluation in the API.

- `/api/v1/datasets/`: list and create a workflow's datasets, read one with its versions and a
  version's cases, and change its cases — add (a JSON body), upload (a JSON lines or CSV file),
  add a finished run, remove.
- `/api/v1/evaluations/`: list and start evaluations of a version over a dataset, read one with
  its results by risk tier and its cases, cancel one, compare two of the same dataset version.
- `/api/v1/workflows/<name>/release-policy/`: read, set and remove a workflow's release policy
  (a route of its own here: the workflow routes are the engine's, which imports nothing of this
  app).

Entry points only: they parse, find the objects the caller may see (one of another team is a
404), call one service and serialize. The services check who may change what.
"""
import django_filters
from django import forms
from django.db.models import QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_field,
    extend_schema_view,
)
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.parsers import BaseParser
from rest_framework.response import Response
from rest_framework.views import APIView

from orchestrator.engine.authz import visible
from orchestrator.models import Run, Workflow
from orchestrator.web.api.errors import ServiceErrorsMixin, error_body, valid_data
from orchestrator.web.api.filters import FilterSet, QueryForm
from orchestrator.web.api.parsers import JSONBodyParser, MultiPartBodyParser, read_body
from orchestrator.web.api.permissions import team_and_workflow_for_write
from orchestrator.web.api.serializers import ErrorsSerializer

from . import serializers as s
from .evaluations import evaluation_cancel, evaluation_start, shadow_start
from .gate import release_policy_set
from .models import (
    Case,
    CaseRunState,
    Dataset,
    DatasetVersion,
    Evaluation,
    EvaluationState,
    RiskTier,
)
from .selectors import (
    cases_of,
    comparison,
    datasets_visible_to,
    evaluations_visible_to,
    release_policy_of,
)
from .services import (
    dataset_case_from_run,
    dataset_cases_add,
    dataset_cases_remove,
    dataset_cases_upload,
    dataset_create,
)
from .uploads import FORMATS, format_of


class CaseQueryForm(QueryForm):
    """A case list's filters (`serializers.CaseQuerySerializer` publishes them)."""

    risk_tier = forms.ChoiceField(choices=RiskTier.choices, required=False)
    tag = forms.CharField(max_length=50, required=False)

_ERRORS = OpenApiResponse(ErrorsSerializer, description="Every problem, each with its path.")
_CHANGED = {201: OpenApiResponse(s.DatasetVersionSerializer, description="The new version."),
            400: _ERRORS, 403: _ERRORS, 404: _ERRORS}


class CasesFileParser(BaseParser):
    """A file of cases sent as the body itself: its bytes, bounded like every body, for the
    service to read (`evaluation.uploads`)."""

    media_type = "application/jsonl"

    def parse(self, stream, media_type=None, parser_context=None) -> bytes:
        return read_body(stream, parser_context)


def _file_parser(media: str) -> type[BaseParser]:
    return type(f"CasesFileParser_{media.replace('/', '_').replace('-', '_')}", (CasesFileParser,),
                {"media_type": media})


FILE_PARSERS = [_file_parser(media) for types in FORMATS.values() for media in types]


@extend_schema_view(list=extend_schema(
    parameters=[OpenApiParameter("workflow", str, description="One workflow's datasets only."),
                OpenApiParameter("team", str, description="One team's datasets only (a slug).")],
    description="The datasets of your teams' workflows, by workflow and name, each with its latest version."))
class DatasetViewSet(ServiceErrorsMixin, mixins.ListModelMixin, viewsets.GenericViewSet):
    """A workflow's named, versioned sets of evaluation cases (docs/evaluation.md)."""

    serializer_class = s.DatasetSerializer
    parser_classes = [JSONBodyParser]

    def get_queryset(self) -> QuerySet[Dataset]:
        rows = datasets_visible_to(self.request.user).select_related("created_by")
        if self.action == "list":
            query = self.request.query_params
            if workflow := query.get("workflow"):
                rows = rows.filter(workflow__name=workflow)
            if team := query.get("team"):
                rows = rows.filter(team__slug=team)
        return rows.order_by("workflow__name", "team__slug", "name", "id")

    def get_object(self) -> Dataset:
        found = self.get_queryset().filter(pk=self.kwargs["pk"]).first() if self.kwargs["pk"].isdigit() else None
        if found is None:
            raise NotFound("dataset not found")
        return found

    @extend_schema(request=s.DatasetCreateSerializer, responses={201: s.DatasetSerializer, 400: _ERRORS,
                                                                 403: _ERRORS},
                   description="Create an empty dataset of a workflow (version 1, no case). Editors "
                               "and owners (dataset.edit); audited.")
    def create(self, request):
        body = dict(valid_data(s.DatasetCreateSerializer(data=request.data)))
        _, workflow = team_and_workflow_for_write(request.user, body)
        dataset = dataset_create(workflow=workflow, actor=request.user, **body)
        return Response(s.DatasetSerializer(dataset).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses={200: s.DatasetDetailSerializer, 404: _ERRORS},
                   description="A dataset and every version of it, newest first.")
    def retrieve(self, request, pk=None):
        dataset = self.get_object()
        return Response(s.DatasetDetailSerializer(dataset).data)

    # --- cases ------------------------------------------------------------------------------

    @extend_schema(parameters=[s.CaseQuerySerializer], responses={200: s.CaseSerializer(many=True), 404: _ERRORS},
                   description="The cases of the dataset's latest version, by key.")
    @action(detail=True, methods=["get"])
    def cases(self, request, pk=None):
        return self._cases(self.get_object().latest_version)

    @extend_schema(parameters=[s.CaseQuerySerializer], responses={200: s.CaseSerializer(many=True), 404: _ERRORS},
                   description="The cases of one version, by key: what an evaluation of that version reads.")
    @action(detail=True, methods=["get"], url_path=r"versions/(?P<number>[0-9]{1,9})/cases")
    def version_cases(self, request, pk=None, number=None):
        version = self.get_object().versions.filter(number=int(number)).first()
        if version is None:
            raise NotFound(f"the dataset has no version {number}")
        return self._cases(version)

    def _cases(self, version: DatasetVersion) -> Response:
        form = CaseQueryForm(self.request.query_params)
        if not form.is_valid():  # an empty or repeated parameter, as the list filters refuse
            raise ValidationError(form.errors)
        query = form.cleaned_data
        rows = Case.objects.filter(version=version).order_by("key")
        if tier := query.get("risk_tier"):
            rows = rows.filter(risk_tier=tier)
        if tag := query.get("tag"):
            rows = [row for row in rows if tag in row.tags]  # JSON containment differs by database
        page = self.paginate_queryset(rows)
        return self.get_paginated_response(s.CaseSerializer(page, many=True).data)

    @extend_schema(request=s.CasesAddSerializer, responses=_CHANGED,
                   description="Add cases (or replace them, with mode): a new version. dataset.edit; audited.")
    @cases.mapping.post
    def cases_add(self, request, pk=None):
        dataset = self.get_object()
        body = valid_data(s.CasesAddSerializer(data=request.data))
        version = dataset_cases_add(dataset=dataset, actor=request.user, **body)
        return Response(s.DatasetVersionSerializer(version).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.CasesRemoveSerializer, responses=_CHANGED,
                   description="Remove cases by key: a new version without them. dataset.edit; audited.")
    @action(detail=True, methods=["post"], url_path="cases/remove")
    def cases_remove(self, request, pk=None):
        dataset = self.get_object()
        body = valid_data(s.CasesRemoveSerializer(data=request.data))
        version = dataset_cases_remove(dataset=dataset, actor=request.user, **body)
        return Response(s.DatasetVersionSerializer(version).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        request={"multipart/form-data": s.UploadFormSerializer,
                 **{media: OpenApiTypes.BINARY for types in FORMATS.values() for media in types}},
        parameters=[s.UploadQuerySerializer], responses=_CHANGED,
        description="Add the cases of a JSON lines or CSV file (docs/evaluation.md): a multipart form "
                    "with `file`, or the file itself as the body (Content-Type application/jsonl or "
                    "text/csv; mode, workflow_version and note in the query). All or nothing; every bad "
                    "line is reported as `line N...`. dataset.edit; audited.")
    @action(detail=True, methods=["post"], parser_classes=[MultiPartBodyParser, *FILE_PARSERS])
    def upload(self, request, pk=None):
        dataset = self.get_object()
        if isinstance(request.data, bytes):
            options = valid_data(s.UploadQuerySerializer(data=request.query_params))
            data, fmt = request.data, format_of(request.content_type)
        else:
            options = dict(valid_data(s.UploadFormSerializer(data=request.data)))
            upload = options.pop("file")
            fmt = format_of(upload.content_type or "", upload.name or "")
            if fmt is None:
                raise ValidationError(error_body("send a .jsonl or .csv file (JSON lines or CSV)", "file"))
            data = upload.read()
        version = dataset_cases_upload(dataset=dataset, data=data, fmt=fmt, actor=request.user, **options)
        return Response(s.DatasetVersionSerializer(version).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.FromRunSerializer, responses={**_CHANGED, 409: _ERRORS},
                   description="Add a finished run of the dataset's workflow as a case: its input, and "
                               "as expected outcome `expected` (the correction) or what the run did. "
                               "Editors, operators and owners (dataset.add_run); audited.")
    @action(detail=True, methods=["post"], url_path="from-run")
    def from_run(self, request, pk=None):
        dataset = self.get_object()
        body = dict(valid_data(s.FromRunSerializer(data=request.data)))
        run = visible(Run.objects.select_related("version__workflow"), request.user).filter(
            pk=body.pop("run")).first()
        if run is None:
            raise ValidationError(error_body("no run of yours has this id", "run"))
        version = dataset_case_from_run(dataset=dataset, run=run, actor=request.user, **body)
        return Response(s.DatasetVersionSerializer(version).data, status=status.HTTP_201_CREATED)


# --- evaluations ---------------------------------------------------------------------------------


@extend_schema_field({"type": "integer", "minimum": 1, "maximum": s.MAX_ID})
class WholeNumberFilter(django_filters.NumberFilter):
    """A whole number in the range an id or a version number has: anything else is a 400."""

    field_class = forms.IntegerField

    def __init__(self, *args, **kwargs):
        super().__init__(*args, min_value=1, max_value=s.MAX_ID, **kwargs)


NAME = r"^[a-z][a-z0-9_-]{0,99}$"


@extend_schema_field({"type": "string", "pattern": NAME, "minLength": 1, "maxLength": 100})
class NameFilter(django_filters.CharFilter):
    """A workflow's name: empty or not a name is a 400 (a name that no workflow has matches none)."""

    field_class = forms.RegexField

    def __init__(self, *args, **kwargs):
        super().__init__(*args, regex=NAME, max_length=100, **kwargs)


class EvaluationFilter(FilterSet):
    workflow = NameFilter(field_name="workflow__name", help_text="A workflow's name.")
    dataset = WholeNumberFilter(field_name="dataset_version__dataset_id", help_text="A dataset's id.")
    state = django_filters.ChoiceFilter(choices=EvaluationState.choices)
    version = WholeNumberFilter(field_name="version__number", help_text="A workflow version's number.")

    class Meta(FilterSet.Meta):
        model = Evaluation
        fields = ["workflow", "dataset", "state", "version"]


class EvaluationCaseQueryForm(QueryForm):
    """An evaluation's case list's filters (`serializers.EvaluationCaseQuerySerializer`)."""

    risk_tier = forms.ChoiceField(choices=RiskTier.choices, required=False)
    passed = forms.TypedChoiceField(choices=[("true", "true"), ("false", "false")], coerce=lambda v: v == "true",
                                    required=False, empty_value=None)
    state = forms.ChoiceField(choices=CaseRunState.choices, required=False)


class CompareQueryForm(QueryForm):
    base = forms.IntegerField(min_value=1, max_value=s.MAX_ID)
    new = forms.IntegerField(min_value=1, max_value=s.MAX_ID)


class TeamQueryForm(QueryForm):
    team = forms.CharField(max_length=100, required=False)


def _query(form_class, params) -> dict:
    form = form_class(params)
    if not form.is_valid():  # an empty or repeated parameter, or one that does not parse
        raise ValidationError(form.errors)
    return form.cleaned_data


@extend_schema_view(list=extend_schema(
    description="The evaluations of your teams' workflows, newest first, each with its counts of cases "
                "and its pass rate."))
class EvaluationViewSet(ServiceErrorsMixin, mixins.ListModelMixin, viewsets.GenericViewSet):
    """Evaluations: a workflow version run over a dataset version, sandboxed, scored and summarised
    by risk tier (docs/evaluation.md)."""

    serializer_class = s.EvaluationSerializer
    filterset_class = EvaluationFilter
    parser_classes = [JSONBodyParser]

    def get_queryset(self):
        return evaluations_visible_to(self.request.user).order_by("-created_at", "-id")

    def get_object(self) -> Evaluation:
        return self._visible(self.kwargs["pk"])

    def _visible(self, pk, path: str = "") -> Evaluation:
        found = evaluations_visible_to(self.request.user).filter(pk=pk).first() if str(pk).isdigit() else None
        if found is None:
            raise NotFound(error_body(f"evaluation {pk} not found", path))
        return found

    @extend_schema(request=s.EvaluationStartSerializer,
                   responses={201: s.EvaluationDetailSerializer, 400: _ERRORS, 403: _ERRORS},
                   description="Evaluate a version of the dataset's workflow over a version of the dataset "
                               "(default: its latest): every case becomes a sandboxed run on the evaluation "
                               "capacity, at most `concurrency` at a time, until the budget is spent. "
                               "Editors and owners (evaluation.run); audited.")
    def create(self, request):
        body = dict(valid_data(s.EvaluationStartSerializer(data=request.data)))
        dataset = datasets_visible_to(request.user).filter(pk=body.pop("dataset")).first()
        if dataset is None:
            raise ValidationError(error_body("no dataset of yours has this id", "dataset"))
        started = evaluation_start(dataset=dataset, actor=request.user, **body)
        return Response(s.EvaluationDetailSerializer(self._visible(started.id)).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.ShadowStartSerializer,
                   responses={201: s.EvaluationDetailSerializer, 400: _ERRORS, 403: _ERRORS},
                   description="Run a draft in shadow: a sample of the published version's live runs that end "
                               "from now on are run again on the draft, sandboxed, and scored against what the "
                               "live run did (docs/evaluation.md#shadow). evaluation.run; audited.")
    @action(detail=False, methods=["post"], filterset_class=None)
    def shadow(self, request):
        body = dict(valid_data(s.ShadowStartSerializer(data=request.data)))
        _, workflow = team_and_workflow_for_write(request.user, body)
        started = shadow_start(workflow=workflow, actor=request.user, **body)
        return Response(s.EvaluationDetailSerializer(self._visible(started.id)).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses={200: s.EvaluationDetailSerializer, 404: _ERRORS},
                   description="An evaluation with its cases by state and, once it ended, its summary: "
                               "every metric per risk tier and overall with its 95% interval.")
    def retrieve(self, request, pk=None):
        return Response(s.EvaluationDetailSerializer(self.get_object()).data)

    @extend_schema(parameters=[s.EvaluationCaseQuerySerializer],
                   responses={200: s.EvaluationCaseSerializer(many=True), 404: _ERRORS},
                   description="Its cases by key: each one's state, scores, whether it passed and its run.")
    @action(detail=True, methods=["get"], filterset_class=None)
    def cases(self, request, pk=None):
        evaluation = self.get_object()
        query = _query(EvaluationCaseQueryForm, request.query_params)
        rows = cases_of(evaluation)
        if tier := query.get("risk_tier"):
            rows = rows.filter(risk_tier=tier)
        if query.get("passed") is not None:
            rows = rows.filter(state=CaseRunState.SCORED, passed=query["passed"])
        if state := query.get("state"):
            rows = rows.filter(state=state)
        page = self.paginate_queryset(rows)
        return self.get_paginated_response(s.EvaluationCaseSerializer(page, many=True).data)

    @extend_schema(request=s.EvaluationCancelSerializer,
                   responses={200: s.EvaluationDetailSerializer, 403: _ERRORS, 404: _ERRORS, 409: _ERRORS},
                   description="Cancel a running evaluation: its unfinished runs are cancelled, the cases "
                               "not started are not run, what was scored is summarised. evaluation.run; "
                               "audited. 409 when it has ended.")
    @action(detail=True, methods=["post"], filterset_class=None)
    def cancel(self, request, pk=None):
        evaluation = self.get_object()
        body = valid_data(s.EvaluationCancelSerializer(data=request.data))
        evaluation_cancel(evaluation_id=evaluation.id, actor=request.user, reason=body["reason"])
        return Response(s.EvaluationDetailSerializer(self._visible(evaluation.id)).data)

    @extend_schema(parameters=[s.CompareQuerySerializer],
                   responses={200: s.ComparisonSerializer, 400: _ERRORS, 404: _ERRORS},
                   description="Two evaluations of the same dataset version compared: each tier's metrics "
                               "side by side with their delta, and each case whose outcome changed and how.")
    @action(detail=False, methods=["get"], filterset_class=None)
    def compare(self, request):
        query = _query(CompareQueryForm, request.query_params)
        base, new = self._visible(query["base"], "base"), self._visible(query["new"], "new")
        if base.dataset_version_id is None or base.dataset_version_id != new.dataset_version_id:
            raise ValidationError(error_body(
                f"evaluations {base.id} and {new.id} did not run the same dataset version ({_cases(base)}; "
                f"{_cases(new)}): compare evaluations of the same dataset version", "new"))
        result = comparison(base, new)
        return Response(s.ComparisonSerializer({**result, "base": base, "new": new}).data)


def _cases(evaluation: Evaluation) -> str:
    if evaluation.dataset_version is None:
        return f"{evaluation.id} is a shadow of live runs"
    return f"{evaluation.id} ran dataset '{evaluation.dataset_version.dataset.name}' version " \
           f"{evaluation.dataset_version.number}"


# --- a workflow's release policy -----------------------------------------------------------------


class ReleasePolicyView(ServiceErrorsMixin, APIView):
    """A workflow's release policy (docs/evaluation.md#the-release-gate): the dataset a version is
    evaluated over before it is published and what each risk tier must show there."""

    parser_classes = [JSONBodyParser]

    def _workflow(self, request, name: str) -> Workflow:
        team = _query(TeamQueryForm, request.query_params).get("team")
        found = visible(Workflow.objects.select_related("team"), request.user).filter(name=name)
        if team:
            found = found.filter(team__slug=team)
        found = list(found.order_by("team__slug")[:10])
        if not found:
            raise NotFound(f"workflow '{name}' not found")
        if len(found) > 1:
            raise ValidationError(error_body(f"workflow '{name}' exists in several of your teams "
                                             f"({', '.join(w.team.slug for w in found)}); add ?team=<slug>", "team"))
        return found[0]

    @extend_schema(operation_id="workflows_release_policy_retrieve", parameters=[s.TeamQuerySerializer],
                   responses={200: s.ReleasePolicySerializer, 404: _ERRORS},
                   description="The workflow's release policy; 404 when it has none.")
    def get(self, request, name: str):
        policy = release_policy_of(self._workflow(request, name))
        if policy is None:
            raise NotFound(f"workflow '{name}' has no release policy")
        return Response(s.ReleasePolicySerializer(policy).data)

    @extend_schema(operation_id="workflows_release_policy_update", parameters=[s.TeamQuerySerializer],
                   request=s.ReleasePolicySetSerializer,
                   responses={200: s.ReleasePolicySerializer, 400: _ERRORS, 403: _ERRORS, 404: _ERRORS},
                   description="Set the workflow's release policy: from now on a version is published only "
                               "after a completed evaluation over the dataset's latest version meets the "
                               "thresholds (an owner's publish overrides, audited). Owners (workflow.policy); "
                               "audited.")
    def put(self, request, name: str):
        workflow = self._workflow(request, name)
        body = valid_data(s.ReleasePolicySetSerializer(data=request.data))
        dataset = datasets_visible_to(request.user).filter(pk=body["dataset"]).first()
        if dataset is None:
            raise ValidationError(error_body("no dataset of yours has this id", "dataset"))
        release_policy_set(workflow=workflow, dataset=dataset, thresholds=body["thresholds"], actor=request.user)
        return Response(s.ReleasePolicySerializer(release_policy_of(workflow)).data)

    @extend_schema(operation_id="workflows_release_policy_destroy", parameters=[s.TeamQuerySerializer],
                   responses={204: None, 403: _ERRORS, 404: _ERRORS},
                   description="Remove the workflow's release policy: versions publish without an evaluation. "
                               "Owners (workflow.policy); audited.")
    def delete(self, request, name: str):
        release_policy_set(workflow=self._workflow(request, name), dataset=None, thresholds=None,
                           actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)
