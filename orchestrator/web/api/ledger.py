"""The audit ledger in the API, read-only, for auditors and superusers (`/api/v1/ledger/`):
entries by filter a page at a time, a selection streamed as JSON Lines or CSV with its manifest,
the verification status, and verifications started and followed.

A whole-ledger export, written and signed by the audit worker, is started and downloaded here
too. The views parse and translate; `audit.queries` and `audit.verification` decide who may read
(a member, editor or reviewer is refused with 403) and what is read (docs/audit.md#the-ledger-api).
"""
from django.http import FileResponse, StreamingHttpResponse
from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from audit.chain import entry_row
from audit.export import FIELDS, FORMATS, content_type
from audit.models import LedgerExport, LedgerVerification
from audit.queries import (
    MAX_PAGE,
    NEWEST,
    ORDERS,
    BadCursor,
    EntryFilter,
    entries_page,
    export_of,
    verification_of,
    verification_status,
)
from audit.verification import (
    ledger_export_open,
    ledger_export_request,
    ledger_stream,
    ledger_stream_manifest,
    ledger_verification_request,
)

from .errors import ServiceErrorsMixin, error_body, valid_data
from .parsers import JSONBodyParser
from .serializers import ErrorsSerializer

_ERRORS = OpenApiResponse(ErrorsSerializer, description="Every problem, each with its path.")


class EntryFilterSerializer(serializers.Serializer):
    run = serializers.UUIDField(required=False, help_text="Entries of this run.")
    subject_type = serializers.CharField(required=False, max_length=16,
                                         help_text='What the entry is about: "run", "step", "approval", ...')
    subject_id = serializers.CharField(required=False, max_length=100)
    actor = serializers.CharField(required=False, max_length=200, help_text='"user:alice", "worker:host", ...')
    kind = serializers.CharField(required=False, max_length=64, help_text=(
        'An action ("step.completed"), or a family of them ("step" matches every "step.*").'))
    team = serializers.SlugField(required=False, max_length=50, help_text="The team's slug.")
    workflow = serializers.CharField(required=False, max_length=100)
    since = serializers.DateTimeField(required=False, help_text="Recorded at or after this time.")
    until = serializers.DateTimeField(required=False, help_text="Recorded before this time.")

    def filter(self) -> EntryFilter:
        """The filter the query asks for (a 400 for a parameter that is not valid)."""
        data = valid_data(self)
        return EntryFilter(**{name: data[name] for name in EntryFilterSerializer._declared_fields
                              if name in data})


class EntryPageQuerySerializer(EntryFilterSerializer):
    order = serializers.ChoiceField(ORDERS, required=False, default=NEWEST,
                                    help_text="newest (default) or oldest first, in chain order.")
    cursor = serializers.CharField(required=False, max_length=200,
                                   help_text="`next_cursor` of the previous page.")
    limit = serializers.IntegerField(required=False, default=50, min_value=1, max_value=MAX_PAGE)


class ExportQuerySerializer(EntryFilterSerializer):
    file_format = serializers.ChoiceField(FORMATS, required=False, default="jsonl")
    through = serializers.IntegerField(required=False, min_value=1, help_text=(
        "The last sequence to export (default: the newest signed checkpoint's); the manifest "
        "of an export is asked for with the `through` its response header gave."))


class ManifestQuerySerializer(ExportQuerySerializer):
    through = serializers.IntegerField(min_value=1, help_text=(
        "The X-Ledger-Through-Sequence header of the export this is the manifest of."))


class EntrySerializer(serializers.Serializer):
    """One entry, every recorded field as stored: `payload` is the exact canonical JSON text the
    digest covers, so an auditor can recompute `digest` and `hash` (docs/audit.md)."""

    id = serializers.IntegerField()
    sequence = serializers.IntegerField()
    created_at = serializers.CharField(help_text="UTC, microseconds: the text the digest covers.")
    actor = serializers.CharField()
    actor_kind = serializers.CharField()
    action = serializers.CharField()
    subject_type = serializers.CharField()
    subject_id = serializers.CharField()
    team = serializers.CharField()
    workflow = serializers.CharField()
    workflow_version = serializers.IntegerField(allow_null=True)
    definition_digest = serializers.CharField()
    run_id = serializers.CharField(allow_null=True)
    step_name = serializers.CharField()
    event_id = serializers.IntegerField(allow_null=True)
    proposal_hash = serializers.CharField()
    model = serializers.CharField()
    prompt_version = serializers.CharField()
    idempotency_key = serializers.CharField()
    correlation_id = serializers.CharField()
    outcome = serializers.CharField()
    payload = serializers.CharField()
    payload_ref = serializers.CharField()
    digest = serializers.CharField()
    prev_hash = serializers.CharField()
    hash = serializers.CharField()
    shard = serializers.IntegerField(help_text="The chain the entry is linked into: `sequence` counts within it.")

    def to_representation(self, entry) -> dict:
        # The values exactly as the digest covers them (`audit.chain.entry_row`).
        row = {"id": entry.id, **entry_row(entry)}
        return {name: row[name] for name in FIELDS}


assert set(EntrySerializer().fields) == set(FIELDS)  # an export and a page hold the same fields


class EntryPageSerializer(serializers.Serializer):
    results = EntrySerializer(many=True)
    next_cursor = serializers.CharField(allow_null=True, help_text="null on the last page.")
    next = serializers.CharField(allow_null=True, help_text="The next page's URL, null on the last.")


def _query(serializer_class, request):
    return serializer_class(data=request.query_params)


class LedgerEntriesView(ServiceErrorsMixin, APIView):
    @extend_schema(operation_id="ledger_entries", parameters=[EntryPageQuerySerializer],
                   responses={200: EntryPageSerializer, 400: _ERRORS, 403: _ERRORS},
                   description="Entries of the audit ledger, newest or oldest first, a page at a "
                   "time: follow `next` (keyset on the chain position, so entries appended "
                   "meanwhile never shift a page). Auditors and superusers only (403 otherwise).")
    def get(self, request):
        query = _query(EntryPageQuerySerializer, request)
        where = query.filter()
        options = query.validated_data
        try:
            page = entries_page(actor=request.user, where=where, order=options["order"],
                                cursor=options.get("cursor"), limit=options["limit"])
        except BadCursor as exc:
            raise ValidationError(error_body(str(exc), "cursor")) from None
        following = None
        if page.next_cursor:
            params = request.query_params.copy()
            params["cursor"] = page.next_cursor
            following = request.build_absolute_uri(f"{request.path}?{params.urlencode()}")
        return Response({"results": EntrySerializer(page.entries, many=True).data,
                         "next_cursor": page.next_cursor, "next": following})


_THROUGH = "X-Ledger-Through-Sequence"


class LedgerExportView(ServiceErrorsMixin, APIView):
    @extend_schema(
        operation_id="ledger_export", parameters=[ExportQuerySerializer],
        responses={(200, "application/x-ndjson"): OpenApiTypes.STR,
                   (200, "text/csv"): OpenApiTypes.STR, 400: _ERRORS, 403: _ERRORS, 409: _ERRORS},
        description="The selected entries as one JSON Lines or CSV file, streamed, in chain "
        "order, up to the newest signed checkpoint (or `through`); the response's "
        f"`{_THROUGH}` header is the last sequence it may hold, to ask for its manifest with. "
        "409 while no signed checkpoint covers the ledger. Auditors and superusers only.")
    def get(self, request):
        query = _query(ExportQuerySerializer, request)
        where = query.filter()
        fmt = query.validated_data["file_format"]
        selection, pieces = ledger_stream(actor=request.user, where=where, fmt=fmt,
                                          through=query.validated_data.get("through"))
        response = StreamingHttpResponse(pieces, content_type=content_type(fmt))
        response[_THROUGH] = str(selection.through)
        response["Content-Disposition"] = (
            f'attachment; filename="audit-ledger-through-{selection.through}.{fmt}"')
        return response


class ManifestSerializer(serializers.Serializer):
    format = serializers.CharField()
    generated_by = serializers.CharField()
    exported_at = serializers.CharField()
    file_format = serializers.CharField()
    file_sha256 = serializers.CharField()
    selection = serializers.DictField()
    count = serializers.IntegerField()
    first_sequence = serializers.IntegerField(allow_null=True)
    last_sequence = serializers.IntegerField(allow_null=True)
    through_sequence = serializers.IntegerField()
    checkpoint = serializers.DictField(help_text="The signed checkpoint of the chain through "
                                                 "`through_sequence` or later (docs/audit.md).")
    hash_formula = serializers.CharField()


class LedgerManifestView(ServiceErrorsMixin, APIView):
    @extend_schema(operation_id="ledger_export_manifest", parameters=[ManifestQuerySerializer],
                   responses={200: ManifestSerializer, 400: _ERRORS, 403: _ERRORS, 409: _ERRORS},
                   description="The manifest of an export asked for with the same filters, "
                   "format and `through`: the file's SHA-256, its entries' range and the signed "
                   "checkpoint that covers them. Auditors and superusers only.")
    def get(self, request):
        query = _query(ManifestQuerySerializer, request)
        where = query.filter()
        options = query.validated_data
        return Response(ledger_stream_manifest(actor=request.user, where=where,
                                               fmt=options["file_format"], through=options["through"]))


class VerificationSerializer(serializers.ModelSerializer):
    url = serializers.SerializerMethodField()

    class Meta:
        model = LedgerVerification
        fields = ["id", "url", "state", "mode", "requested_by_label", "allow_missing_checkpoint",
                  "created_at", "started_at", "finished_at", "entries_total", "entries_checked",
                  "stage", "result", "warnings", "from_sequence", "through_sequence",
                  "through_hash", "base_checkpoint"]

    def get_url(self, verification) -> str:
        return reverse("api:ledger-verification", args=[verification.pk])


class VerificationRequestSerializer(serializers.Serializer):
    incremental = serializers.BooleanField(required=False, default=False, help_text=(
        "Walk only what follows the newest signed checkpoint an earlier verification found "
        "intact (the whole chain when there is none)."))
    allow_missing_checkpoint = serializers.BooleanField(required=False, default=False)


class CheckpointSerializer(serializers.Serializer):
    name = serializers.CharField()
    sequence = serializers.IntegerField()
    hash = serializers.CharField()
    created_at = serializers.DateTimeField()
    reason = serializers.CharField()
    key_id = serializers.CharField()
    store = serializers.CharField()


class StatusSerializer(serializers.Serializer):
    head_sequence = serializers.IntegerField(allow_null=True)
    last_verified = VerificationSerializer(allow_null=True, help_text=(
        "The newest verification that passed: its from/through sequences are the range "
        "known intact."))
    last = VerificationSerializer(allow_null=True)
    last_checkpoint = CheckpointSerializer(allow_null=True)
    failures = VerificationSerializer(many=True)


class LedgerStatusView(ServiceErrorsMixin, APIView):
    @extend_schema(operation_id="ledger_status", responses={200: StatusSerializer, 403: _ERRORS},
                   description="What is known of the ledger's integrity: the last verified range, "
                   "the last signed checkpoint, the newest failures. Auditors and superusers only.")
    def get(self, request):
        known = verification_status(actor=request.user)
        return Response(StatusSerializer({
            "head_sequence": known.head_sequence, "last_verified": known.last_passed,
            "last": known.last, "last_checkpoint": known.last_checkpoint,
            "failures": known.failures}).data)


class LedgerVerificationsView(ServiceErrorsMixin, APIView):
    parser_classes = [JSONBodyParser]

    @extend_schema(operation_id="ledger_verifications_start", request=VerificationRequestSerializer,
                   responses={202: VerificationSerializer, 400: _ERRORS, 403: _ERRORS},
                   description="Start a verification on the audit worker; follow it at its `url` "
                   "(state, entries checked of the total, stage, then its result, kept). "
                   "Auditors and superusers only.")
    def post(self, request):
        body = valid_data(VerificationRequestSerializer(data=request.data))
        verification = ledger_verification_request(actor=request.user, **body)
        return Response(VerificationSerializer(verification).data, status=status.HTTP_202_ACCEPTED)


class LedgerVerificationView(ServiceErrorsMixin, APIView):
    @extend_schema(operation_id="ledger_verification",
                   parameters=[OpenApiParameter("id", int, OpenApiParameter.PATH)],
                   responses={200: VerificationSerializer, 403: _ERRORS, 404: _ERRORS},
                   description="One verification: its progress while it runs, its result after.")
    def get(self, request, pk: int):
        try:
            verification = verification_of(actor=request.user, verification_id=pk)
        except LedgerVerification.DoesNotExist:
            raise NotFound("no such verification") from None
        return Response(VerificationSerializer(verification).data)


class ExportSerializer(serializers.ModelSerializer):
    url = serializers.SerializerMethodField()
    file_url = serializers.SerializerMethodField(help_text="null until the export is done.")
    manifest_url = serializers.SerializerMethodField(help_text="null until the export is done.")

    class Meta:
        model = LedgerExport
        fields = ["id", "url", "state", "format", "requested_by_label", "created_at", "finished_at",
                  "entries", "result", "file_url", "manifest_url"]

    def get_url(self, export) -> str:
        return reverse("api:ledger-whole-export", args=[export.pk])

    def get_file_url(self, export) -> str | None:
        done = export.state == LedgerExport.State.DONE
        return reverse("api:ledger-whole-export-file", args=[export.pk]) if done else None

    def get_manifest_url(self, export) -> str | None:
        done = export.state == LedgerExport.State.DONE
        return reverse("api:ledger-whole-export-manifest", args=[export.pk]) if done else None


class ExportRequestSerializer(serializers.Serializer):
    format = serializers.ChoiceField(FORMATS, required=False, default="jsonl")


class LedgerExportsView(ServiceErrorsMixin, APIView):
    parser_classes = [JSONBodyParser]

    @extend_schema(operation_id="ledger_exports_start", request=ExportRequestSerializer,
                   responses={202: ExportSerializer, 400: _ERRORS, 403: _ERRORS},
                   description="Export the whole ledger on the audit worker, which signs a "
                   "checkpoint of the head into its manifest (as `manage.py audit_export`); "
                   "follow it at its `url`, then download the file and its manifest. Auditors "
                   "and superusers only.")
    def post(self, request):
        body = valid_data(ExportRequestSerializer(data=request.data))
        export = ledger_export_request(actor=request.user, fmt=body["format"])
        return Response(ExportSerializer(export).data, status=status.HTTP_202_ACCEPTED)


_EXPORT_ID = [OpenApiParameter("id", int, OpenApiParameter.PATH)]


class LedgerWholeExportView(ServiceErrorsMixin, APIView):
    @extend_schema(operation_id="ledger_whole_export", parameters=_EXPORT_ID,
                   responses={200: ExportSerializer, 403: _ERRORS, 404: _ERRORS},
                   description="One whole-ledger export: its state, then its files.")
    def get(self, request, pk: int):
        try:
            export = export_of(actor=request.user, export_id=pk)
        except LedgerExport.DoesNotExist:
            raise NotFound("no such export") from None
        return Response(ExportSerializer(export).data)


def _export_file(request, pk: int, *, manifest: bool) -> FileResponse:
    try:
        name, handle = ledger_export_open(actor=request.user, export_id=pk, manifest=manifest)
    except LedgerExport.DoesNotExist:
        raise NotFound("no such export") from None
    return FileResponse(handle, as_attachment=True, filename=name)


_FILE_RESPONSES = {(200, "application/octet-stream"): OpenApiTypes.BINARY, 403: _ERRORS,
                   404: _ERRORS, 409: _ERRORS}


class LedgerWholeExportFileView(ServiceErrorsMixin, APIView):
    @extend_schema(operation_id="ledger_whole_export_file", parameters=_EXPORT_ID,
                   responses=_FILE_RESPONSES,
                   description="The export's file (JSON Lines or CSV); 409 until it is done.")
    def get(self, request, pk: int):
        return _export_file(request, pk, manifest=False)


class LedgerWholeExportManifestView(ServiceErrorsMixin, APIView):
    @extend_schema(operation_id="ledger_whole_export_manifest", parameters=_EXPORT_ID,
                   responses=_FILE_RESPONSES,
                   description="The export's manifest, with the signed checkpoint; 409 until it is done.")
    def get(self, request, pk: int):
        return _export_file(request, pk, manifest=True)
