"""Evaluation datasets in the API (`/api/v1/datasets/`): list and create a workflow's
datasets, read one with its versions and a version's cases, and change its cases — add (a JSON
body), upload (a JSON lines or CSV file), add a finished run, remove.

Entry points only: they parse, find the objects the caller may see (a dataset of another team
is a 404), call one service and serialize. The services check who may change what.
"""
from django import forms
from django.db.models import QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_view,
)
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.parsers import BaseParser
from rest_framework.response import Response

from orchestrator.engine.authz import visible
from orchestrator.models import Run
from orchestrator.web.api.errors import ServiceErrorsMixin, error_body, valid_data
from orchestrator.web.api.filters import QueryForm
from orchestrator.web.api.parsers import JSONBodyParser, MultiPartBodyParser, read_body
from orchestrator.web.api.permissions import team_and_workflow_for_write
from orchestrator.web.api.serializers import ErrorsSerializer

from . import serializers as s
from .models import Case, Dataset, DatasetVersion, RiskTier
from .selectors import datasets_visible_to
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
