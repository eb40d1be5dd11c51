"""Browsing the ledger in the admin: a read-only list, each entry, and a run's timeline;
verifying it (*Verify ledger*, `LedgerVerificationAdmin`) and exporting it (*Export ledger*,
`LedgerExportAdmin`).

No one may add, change or delete an entry here, superusers included; there are no actions.
Who may look is `audit.access.can_read_ledger` (the `auditors` group and superusers), not the
model permissions. The timeline page (`…/auditentry/run/<run id>/`) explains one run from its
entries alone (`audit.timeline`).
"""

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import (
    FileResponse,
    Http404,
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from orchestrator.engine.errors import Forbidden, NotAllowed
from orchestrator.web.admin_display import ReadOnlyAdminMixin, pretty_json
from orchestrator.web.admin_paging import HistoryListMixin, recent_values_filter

from .access import can_read_ledger
from .models import AuditEntry, CheckpointRecord, LedgerExport, LedgerVerification
from .timeline import intact, run_timeline
from .verification import (
    ledger_export_open,
    ledger_export_request,
    ledger_verification_request,
    outputs_check,
)

# How many of the newest entries the run and actor pickers take their suggestions from.
RECENT_ENTRIES = 500
SUGGESTIONS = 25


class TextInputFilter(admin.SimpleListFilter):
    """A box to type a value in (a run id, an actor), which also offers the values of the
    newest entries to pick from (an HTML datalist: no script)."""

    template = "audit/text_filter.html"

    def suggestions(self, request, model_admin) -> list[tuple[str, str]]:
        """(value, label) pairs, newest first."""
        return []

    def lookups(self, request, model_admin):
        self._suggested = self.suggestions(request, model_admin)
        return ()

    def has_output(self) -> bool:
        return True  # Django shows a filter only if it has choices; the box needs none.

    def choices(self, changelist):
        # The other filters in force, kept as hidden fields so that submitting the box keeps them.
        hidden = [(name, value) for name, values in changelist.get_filters_params().items()
                  if name != self.parameter_name
                  for value in (values if isinstance(values, list) else [values])]
        yield {"parameter_name": self.parameter_name, "value": self.value() or "",
               "hidden": hidden, "suggestions": self._suggested,
               "clear_url": changelist.get_query_string(remove=[self.parameter_name])}


def _newest(model_admin, request):
    return model_admin.get_queryset(request).order_by("-id")


def _distinct(rows, limit: int = SUGGESTIONS) -> list[tuple[str, str]]:
    seen: dict[str, str] = {}
    for value, label in rows:
        if value and str(value) not in seen:
            seen[str(value)] = label
            if len(seen) == limit:
                break
    return list(seen.items())


class RunFilter(TextInputFilter):
    title = "run"
    parameter_name = "run"

    def suggestions(self, request, model_admin):
        rows = _newest(model_admin, request).filter(run_id__isnull=False).values_list(
            "run_id", "workflow")[:RECENT_ENTRIES]
        return _distinct((run_id, f"{workflow or 'run'} {str(run_id)[:8]}")
                         for run_id, workflow in rows)

    def queryset(self, request, queryset):
        value = (self.value() or "").strip()
        return queryset.filter(run_id=value) if value else queryset


class ActorFilter(TextInputFilter):
    title = "actor"
    parameter_name = "actor"

    def suggestions(self, request, model_admin):
        rows = _newest(model_admin, request).values_list("actor", "actor_kind")[:RECENT_ENTRIES]
        return _distinct(rows)

    def queryset(self, request, queryset):
        value = (self.value() or "").strip()
        return queryset.filter(actor__icontains=value) if value else queryset


@admin.register(AuditEntry)
class AuditEntryAdmin(HistoryListMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["sequence", "created_at", "actor", "action", "subject", "workflow",
                    "outcome", "run_link"]
    list_filter = [RunFilter, ActorFilter, "actor_kind", recent_values_filter("action"),
                   "subject_type", recent_values_filter("workflow"),
                   recent_values_filter("outcome"), "created_at"]
    search_fields = ["action", "actor", "idempotency_key", "correlation_id", "proposal_hash",
                     "step_name", "subject_id"]
    actions = None
    # Newest first: what an operator opens the ledger for just happened. Along the primary
    # key, the order entries were written in: a sequence counts within its shard only, and a
    # date hierarchy would read every entry's day.
    ordering = ["-id"]
    list_per_page = 100
    show_full_result_count = False  # counting a big ledger on every page is slow
    fields = readonly_fields = [
        "sequence", "created_at", "actor", "actor_kind", "action", "subject_type", "subject_id",
        "team", "workflow", "workflow_version", "definition_digest", "run_timeline_link",
        "step_name", "event_id", "proposal_hash", "model", "prompt_version", "idempotency_key",
        "correlation_id", "outcome", "payload_pretty", "payload_ref", "digest", "prev_hash",
        "hash", "integrity",
    ]

    # --- read-only (ReadOnlyAdminMixin); visible to ledger readers only -------------------

    def has_view_permission(self, request, obj=None) -> bool:
        return can_read_ledger(request.user)

    def has_module_permission(self, request) -> bool:
        return can_read_ledger(request.user)

    # --- columns -------------------------------------------------------------------------

    @admin.display(description="subject")
    def subject(self, entry: AuditEntry) -> str:
        step = f" {entry.step_name}" if entry.step_name else ""
        return f"{entry.subject_type} {entry.subject_id}{step}"

    @admin.display(description="run")
    def run_link(self, entry: AuditEntry) -> str:
        if not entry.run_id:
            return ""
        return format_html('<a href="{}">timeline</a> · <a href="?run={}">entries</a>',
                           reverse("admin:audit_run_timeline", args=[entry.run_id]), entry.run_id)

    @admin.display(description="run")
    def run_timeline_link(self, entry: AuditEntry) -> str:
        if not entry.run_id:
            return "-"
        return format_html('<a href="{}">{}</a>',
                           reverse("admin:audit_run_timeline", args=[entry.run_id]), entry.run_id)

    @admin.display(description="payload (redacted)")
    def payload_pretty(self, entry: AuditEntry) -> str:
        return pretty_json(entry.data)

    @admin.display(description="integrity")
    def integrity(self, entry: AuditEntry) -> str:
        if intact(entry):
            return "digest and hash match (run audit_verify to check the whole chain)"
        return format_html('<strong style="color: #ba2121">{}</strong>',
                           "this entry does not match its digest or hash: it was altered")

    # --- the run timeline ----------------------------------------------------------------

    def get_urls(self):
        timeline = self.admin_site.admin_view(self.timeline_view)
        return [path("run/<uuid:run_id>/", timeline, name="audit_run_timeline"), *super().get_urls()]

    def timeline_view(self, request, run_id):
        if not can_read_ledger(request.user):
            raise PermissionDenied
        timeline = run_timeline(run_id)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": f"Run {run_id}: audit timeline",
            "timeline": timeline,
            "input_pretty": pretty_json(timeline.input) if timeline.started else "",
            "policy_pretty": pretty_json(timeline.policy) if timeline.started else "",
            # Checked against the steps' rows as they are now, as `audit_verify` checks them.
            "attestation_problems": outputs_check(run_id=run_id),
        }
        return TemplateResponse(request, "audit/run_timeline.html", context)


@admin.register(LedgerVerification)
class LedgerVerificationAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """The auditors' verifications of the whole ledger: *Verify ledger* asks for one
    (`audit.verification.ledger_verification_request`, which decides who may), the `audit`
    queue runs it, and its page shows the progress, reloading until it has finished."""

    list_display = ["id", "state_shown", "progress", "requested_by_label", "created_at",
                    "finished_at", "result_short"]
    list_filter = ["state"]
    fields = readonly_fields = ["state_shown", "progress", "stage", "requested_by_label",
                                "allow_missing_checkpoint", "mode", "created_at", "started_at",
                                "finished_at", "result", "warnings_shown", "from_sequence",
                                "through_sequence", "through_hash", "base_checkpoint"]
    actions = None

    def has_view_permission(self, request, obj=None) -> bool:
        return can_read_ledger(request.user)

    def has_module_permission(self, request) -> bool:
        return can_read_ledger(request.user)

    @admin.display(description="state")
    def state_shown(self, verification: LedgerVerification) -> str:
        colour = {"passed": "#2e7d32", "failed": "#ba2121", "error": "#ba2121"}.get(verification.state)
        if colour is None:
            return verification.get_state_display()
        return format_html('<strong style="color: {}">{}</strong>', colour,
                           verification.get_state_display())

    @admin.display(description="progress")
    def progress(self, verification: LedgerVerification) -> str:
        total = verification.entries_total
        if verification.state == LedgerVerification.State.QUEUED:
            return "waiting for the audit worker"
        if not total:
            return f"{verification.entries_checked} entries"
        percent = min(100, 100 * verification.entries_checked // total)
        return f"{verification.entries_checked} of {total} entries ({percent}%)"

    @admin.display(description="result")
    def result_short(self, verification: LedgerVerification) -> str:
        return verification.result if len(verification.result) <= 160 else verification.result[:157] + "..."

    @admin.display(description="warnings")
    def warnings_shown(self, verification: LedgerVerification) -> str:
        return "; ".join(verification.warnings) or "-"

    def get_urls(self):
        verify = self.admin_site.admin_view(self.verify_view)
        return [path("verify/", verify, name="audit_ledgerverification_verify"), *super().get_urls()]

    def verify_view(self, request):
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        try:
            verification = ledger_verification_request(
                actor=request.user,
                allow_missing_checkpoint=bool(request.POST.get("allow_missing_checkpoint")),
                incremental=bool(request.POST.get("incremental")))
        except Forbidden as exc:
            raise PermissionDenied(str(exc)) from exc
        self.message_user(request, "The ledger is being verified; this page follows its progress.",
                          messages.INFO)
        return HttpResponseRedirect(
            reverse("admin:audit_ledgerverification_change", args=[verification.pk]))


@admin.register(LedgerExport)
class LedgerExportAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """The auditors' exports of the whole ledger: *Export ledger* asks for one
    (`audit.verification.ledger_export_request`, which decides who may), the `audit` queue
    writes it, and its page offers the file and its manifest once it is done."""

    list_display = ["id", "state", "format", "entries", "requested_by_label", "created_at",
                    "finished_at", "downloads"]
    fields = readonly_fields = ["state", "format", "entries", "requested_by_label", "created_at",
                                "finished_at", "result", "downloads"]
    actions = None

    def has_view_permission(self, request, obj=None) -> bool:
        return can_read_ledger(request.user)

    def has_module_permission(self, request) -> bool:
        return can_read_ledger(request.user)

    @admin.display(description="download")
    def downloads(self, export: LedgerExport) -> str:
        if export.state != LedgerExport.State.DONE:
            return "-"
        url = reverse("admin:audit_ledgerexport_download", args=[export.pk])
        return format_html('<a href="{}">{}</a> · <a href="{}?manifest=1">manifest</a>', url,
                           export.file.rsplit("/", 1)[-1], url)

    def get_urls(self):
        wrap = self.admin_site.admin_view
        return [path("export/", wrap(self.export_view), name="audit_ledgerexport_export"),
                path("<int:export_id>/download/", wrap(self.download_view),
                     name="audit_ledgerexport_download"),
                *super().get_urls()]

    def export_view(self, request):
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        try:
            export = ledger_export_request(actor=request.user, fmt=request.POST.get("format", "jsonl"))
        except Forbidden as exc:
            raise PermissionDenied(str(exc)) from exc
        except ValueError as exc:
            return HttpResponseBadRequest(str(exc))
        self.message_user(request, "The ledger is being exported; this page shows when it is ready.",
                          messages.INFO)
        return HttpResponseRedirect(reverse("admin:audit_ledgerexport_change", args=[export.pk]))

    def download_view(self, request, export_id):
        try:
            name, handle = ledger_export_open(actor=request.user, export_id=export_id,
                                              manifest=bool(request.GET.get("manifest")))
        except Forbidden as exc:
            raise PermissionDenied(str(exc)) from exc
        except LedgerExport.DoesNotExist as exc:
            raise Http404(f"no export {export_id}") from exc
        except NotAllowed as exc:
            return HttpResponse(str(exc), status=409)
        return FileResponse(handle, as_attachment=True, filename=name)


@admin.register(CheckpointRecord)
class CheckpointRecordAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """The checkpoints the database notes as written, newest first: when the ledger was last
    anchored, and where. The signed files in the store are what `audit_verify` trusts."""

    list_display = ["sequence", "created_at", "reason", "key_id", "name", "store"]
    list_filter = ["reason"]
    fields = readonly_fields = ["name", "sequence", "hash", "created_at", "reason", "key_id", "store"]
    actions = None
    show_full_result_count = False

    def has_view_permission(self, request, obj=None) -> bool:
        return can_read_ledger(request.user)

    def has_module_permission(self, request) -> bool:
        return can_read_ledger(request.user)
