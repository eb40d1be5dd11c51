"""Alerts in the admin: the list a team's people see, acknowledge and resolve (through
`alerts.services`, which checks `alert.handle`), and the rule overrides (superusers, like teams).
"""
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.urls import reverse
from django.utils.html import format_html

from orchestrator.engine.authz import Action, teams_where
from orchestrator.engine.errors import Forbidden, NotAllowed
from orchestrator.web.admin_display import ReadOnlyAdminMixin, TeamScopedAdminMixin, badge_column
from orchestrator.web.admin_paging import HistoryListMixin

from .models import Alert, AlertRule
from .services import alert_acknowledge, alert_resolve


@admin.register(Alert)
class AlertAdmin(HistoryListMixin, TeamScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["created_at", "rule", "severity", "subject", "team", badge_column("state"),
                    "run_live", "acknowledged_by", "resolved_by"]
    list_filter = ["state", "rule", "severity", "team"]
    ordering = ["-created_at", "-id"]  # along `created_at`'s index
    search_fields = ["subject", "body", "key", "run__id"]
    fields = readonly_fields = ["key", "rule", "severity", "team", "run", "subject", "body",
                                "state", "notification", "created_at", "acknowledged_at",
                                "acknowledged_by", "resolved_at", "resolved_by"]
    actions = ["acknowledge", "resolve"]

    @admin.display(description="run")
    def run_live(self, alert: Alert) -> str:
        if alert.run_id is None:
            return "-"
        return format_html('<a href="{}">live page</a>',
                           reverse("admin:orchestrator_run_live", args=[alert.run_id]))

    def get_queryset(self, request) -> QuerySet[Alert]:
        return super().get_queryset(request).select_related("team", "acknowledged_by",
                                                            "resolved_by")

    def has_handle_permission(self, request) -> bool:
        return teams_where(request.user, Action.ALERT_HANDLE).exists()

    def _each(self, request, queryset, service, verb: str) -> None:
        done = 0
        for alert_id in queryset.values_list("id", flat=True):
            try:
                service(alert_id=alert_id, actor=request.user)
                done += 1
            except (NotAllowed, Forbidden) as exc:
                self.message_user(request, f"alert {alert_id}: {exc}", messages.ERROR)
        if done:
            self.message_user(request, f"{verb} {done} alert(s).", messages.SUCCESS)

    @admin.action(description="Acknowledge selected alerts", permissions=["handle"])
    def acknowledge(self, request, queryset: QuerySet[Alert]) -> None:
        self._each(request, queryset, alert_acknowledge, "Acknowledged")

    @admin.action(description="Resolve selected alerts", permissions=["handle"])
    def resolve(self, request, queryset: QuerySet[Alert]) -> None:
        self._each(request, queryset, alert_resolve, "Resolved")


@admin.register(AlertRule)
class AlertRuleAdmin(admin.ModelAdmin):
    """Overrides of the default rules (docs/operations.md#alerts), per team or workflow:
    configuration, like teams, for superusers."""

    list_display = ["kind", "team", "workflow", "enabled", "threshold"]
    list_filter = ["kind", "enabled", "team"]
    list_select_related = ["team", "workflow"]
    autocomplete_fields = ["team"]

    def has_module_permission(self, request) -> bool:
        return request.user.is_active and request.user.is_superuser

    def has_view_permission(self, request, obj=None) -> bool:
        return self.has_module_permission(request)

    has_add_permission = has_change_permission = has_delete_permission = has_view_permission
