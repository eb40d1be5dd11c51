"""Budgets in the admin: the cost page, limits, prices, a run's raised limits, the reservations.

Entry points only. A limit, a price or an override is added through its service
(`budget_limit_create`, `model_price_create`, `run_budget_raise`), which checks the permission
and audits; nothing here is changed or deleted afterwards (a new limit or price takes over from
its `effective_from`). Each person sees their teams' rows only.
"""
from datetime import timedelta

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.template.response import TemplateResponse

from orchestrator.admin_display import ReadOnlyAdminMixin, TeamScopedAdminMixin, badge_column
from orchestrator.authz import Action, teams_where
from orchestrator.clock import now
from orchestrator.errors import Forbidden, NotAllowed
from orchestrator.services.operators import run_budget_raise

from .models import BudgetLimit, BudgetOverride, CostReport, ModelPrice, Reservation
from .selectors import cost_report
from .services import LIMIT_FIELDS, budget_limit_create, model_price_create

COST_PAGE_DAYS = 30


class _AddedThroughAService:
    """Add only (through `save_model`, which calls the service); never changed or deleted."""

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def _refuse(self, request, exc: Exception) -> None:
        self.message_user(request, str(exc), messages.ERROR)
        raise PermissionDenied(str(exc)) from exc


@admin.register(BudgetLimit)
class BudgetLimitAdmin(_AddedThroughAService, TeamScopedAdminMixin, admin.ModelAdmin):
    list_display = ["team", "workflow", "daily_usd", "monthly_usd", "max_concurrent_runs", "warn_at",
                    "effective_from", "effective_to", "created_by"]
    list_filter = ["team"]
    list_select_related = ["team", "workflow", "created_by"]
    fields = ["team", "workflow", *LIMIT_FIELDS]

    def has_add_permission(self, request) -> bool:
        return teams_where(request.user, Action.BUDGET_MANAGE).exists()

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        teams = teams_where(request.user, Action.BUDGET_MANAGE)
        if db_field.name == "team":
            kwargs["queryset"] = teams
        elif db_field.name == "workflow":
            kwargs["queryset"] = db_field.related_model.objects.filter(team__in=teams)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def save_model(self, request, obj: BudgetLimit, form, change) -> None:
        try:
            created = budget_limit_create(team=obj.team, workflow=obj.workflow, actor=request.user,
                                          **{k: getattr(obj, k) for k in LIMIT_FIELDS})
        except (Forbidden, ValueError, ValidationError) as exc:
            self._refuse(request, exc)
        obj.pk = created.pk


@admin.register(ModelPrice)
class ModelPriceAdmin(_AddedThroughAService, admin.ModelAdmin):
    list_display = ["model", "input_usd_per_mtok", "output_usd_per_mtok", "effective_from"]
    list_filter = ["model"]
    fields = ["model", "input_usd_per_mtok", "output_usd_per_mtok", "effective_from"]

    def has_view_permission(self, request, obj=None) -> bool:
        return request.user.is_active and request.user.is_staff

    def has_module_permission(self, request) -> bool:
        return self.has_view_permission(request)

    def has_add_permission(self, request) -> bool:
        return request.user.is_active and request.user.is_superuser

    def save_model(self, request, obj: ModelPrice, form, change) -> None:
        try:
            created = model_price_create(model=obj.model, input_usd_per_mtok=obj.input_usd_per_mtok,
                                         output_usd_per_mtok=obj.output_usd_per_mtok,
                                         effective_from=obj.effective_from, actor=request.user)
        except (Forbidden, ValueError, ValidationError) as exc:
            self._refuse(request, exc)
        obj.pk = created.pk


class BudgetOverrideForm(forms.ModelForm):
    class Meta:
        model = BudgetOverride
        fields = ["run", "max_cost_usd", "max_duration_s", "reason"]


@admin.register(BudgetOverride)
class BudgetOverrideAdmin(_AddedThroughAService, TeamScopedAdminMixin, admin.ModelAdmin):
    """An operator raises a run's limit here (or with POST /api/v1/runs/{id}/budget/); a paused
    run is resumed."""

    team_field = "run__team"
    form = BudgetOverrideForm
    list_display = ["run", "max_cost_usd", "max_duration_s", "reason", "actor", "created_at"]
    list_select_related = ["run"]
    raw_id_fields = ["run"]

    def has_add_permission(self, request) -> bool:
        return teams_where(request.user, Action.BUDGET_RAISE).exists()

    def save_model(self, request, obj: BudgetOverride, form, change) -> None:
        try:
            run_budget_raise(run_id=obj.run_id, max_cost_usd=obj.max_cost_usd,
                             max_duration_s=obj.max_duration_s, reason=obj.reason, actor=request.user)
        except (Forbidden, NotAllowed, ValidationError) as exc:
            self._refuse(request, exc)
        obj.pk = BudgetOverride.objects.filter(run_id=obj.run_id).latest("created_at", "id").pk


@admin.register(Reservation)
class ReservationAdmin(ReadOnlyAdminMixin, TeamScopedAdminMixin, admin.ModelAdmin):
    list_display = ["created_at", "run", "step", "attempt", "item", "model", badge_column("state"),
                    "amount", "actual", "settled_at"]
    list_filter = ["state", "model"]
    list_select_related = ["run", "step"]
    fields = readonly_fields = ["run", "step", "team", "workflow", "attempt", "item", "model", "levels",
                                "amount", "actual", "state", "created_at", "settled_at"]


@admin.register(CostReport)
class CostReportAdmin(ReadOnlyAdminMixin, TeamScopedAdminMixin, admin.ModelAdmin):
    """The cost page: spend per day (a chart), per workflow and per model, over 30 days."""

    def changelist_view(self, request, extra_context=None):
        if not self.has_view_permission(request):
            raise PermissionDenied
        until = now().date()
        since = until - timedelta(days=COST_PAGE_DAYS - 1)
        report = {g: cost_report(user=request.user, group_by=g, since=since, until=until)
                  for g in ("day", "workflow", "model")}
        spent = {row.group: float(row.cost_usd) for row in report["day"]}
        days = [str(since + timedelta(days=i)) for i in range(COST_PAGE_DAYS)]
        context = {
            **self.admin_site.each_context(request),
            "title": f"Costs, {since:%d %b} to {until:%d %b %Y}",
            "opts": self.model._meta,
            "chart": {"labels": days, "values": [round(spent.get(d, 0.0), 6) for d in days]},
            "by_workflow": report["workflow"], "by_model": report["model"],
            "total": sum(row.cost_usd for row in report["day"]),
            "calls": sum(row.calls for row in report["day"]),
        }
        return TemplateResponse(request, "admin/budgets/costs.html", context)
