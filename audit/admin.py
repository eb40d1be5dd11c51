"""Browsing the ledger in the admin: a read-only list, each entry, and a run's timeline.

No one may add, change or delete an entry here, superusers included; there are no actions.
Who may look is `audit.access.can_read_ledger` (the `auditors` group and staff), not the
model permissions. The timeline page (`…/auditentry/run/<run id>/`) explains one run from its
entries alone (`audit.timeline`).
"""

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import F
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from orchestrator.admin_display import ReadOnlyAdminMixin, pretty_json

from .access import can_read_ledger
from .models import AuditEntry
from .timeline import intact, run_timeline

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
class AuditEntryAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["sequence", "created_at", "actor", "action", "subject", "workflow",
                    "outcome", "run_link"]
    list_filter = [RunFilter, ActorFilter, "actor_kind", "action", "subject_type", "workflow",
                   "outcome", "created_at"]
    search_fields = ["action", "actor", "idempotency_key", "correlation_id", "proposal_hash",
                     "step_name", "subject_id"]
    date_hierarchy = "created_at"
    actions = None
    # Newest first: what an operator opens the ledger for just happened (entries not yet
    # chained have no sequence and are the newest of all).
    ordering = [F("sequence").desc(nulls_first=True), "-id"]
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
        }
        return TemplateResponse(request, "audit/run_timeline.html", context)
