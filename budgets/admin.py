"""Budgets in the admin: the cost page, limits, prices, a run's raised limits, the reservations.

Entry points only. A limit, a price or an override is added through its service
(`budget_limit_create`, `model_price_create`, `run_budget_raise`), which checks the permission
and audits; nothing here is changed or deleted afterwards (a new limit or price takes over from
its `effective_from`). Each person sees their teams' rows only.
"""
from dataclasses import asdict
from datetime import timedelta
from decimal import Decimal

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.template.response import TemplateResponse

from orchestrator.engine.authz import Action, teams_visible_to, teams_where, visible
from orchestrator.engine.clock import now
from orchestrator.engine.errors import Forbidden, NotAllowed
from orchestrator.engine.services.operators import run_budget_raise
from orchestrator.models import Team, Workflow
from orchestrator.web.admin_display import (
    ReadOnlyAdminMixin,
    TeamScopedAdminMixin,
    badge_column,
    money,
)

from .models import BudgetLimit, BudgetOverride, CostReport, ModelPrice, Reservation
from .selectors import cost_report
from .services import LIMIT_FIELDS, budget_limit_create, limits_in_force, model_price_create

COST_PAGE_DAYS = 30
MAX_COST_PAGE_DAYS = 366


def _readable(rows) -> list[dict]:
    return [{**asdict(row), "cost": money(row.cost_usd)} for row in rows]


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


class CostFilterForm(forms.Form):
    """The cost page's pickers: a date range, a team and a workflow (all of the person's by
    default)."""

    since = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    until = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    team = forms.ChoiceField(required=False)
    workflow = forms.ChoiceField(required=False)

    def __init__(self, data, *, user, initial=None):
        super().__init__(data, initial=initial)
        teams = list(teams_visible_to(user).order_by("slug").values_list("slug", flat=True))
        names = sorted(set(visible(Workflow.objects.all(), user).values_list("name", flat=True)))
        self.fields["team"].choices = [("", "all my teams"), *[(t, t) for t in teams]]
        self.fields["workflow"].choices = [("", "all workflows"), *[(n, n) for n in names]]
        self.teams = teams

    def clean(self):
        data = super().clean()
        until = data.get("until") or now().date()
        since = data.get("since") or until - timedelta(days=COST_PAGE_DAYS - 1)
        if since > until:
            raise ValidationError("The range starts after it ends.")
        if (until - since).days >= MAX_COST_PAGE_DAYS:
            raise ValidationError(f"Pick at most {MAX_COST_PAGE_DAYS} days.")
        return {**data, "since": since, "until": until}


def daily_limit(*, team_slug: str, workflow_name: str) -> Decimal | None:
    """The lowest daily limit in force for the chosen team (and workflow): the line the chart
    draws. None when no team is chosen or no daily limit is set."""
    team = Team.objects.filter(slug=team_slug).first() if team_slug else None
    if team is None:
        return None
    workflow = (Workflow.objects.filter(team=team, name=workflow_name).first()
                if workflow_name else None)
    daily = [limit.daily_usd for limit in limits_in_force(
        team_id=team.id, workflow_id=workflow.id if workflow else None)
             if limit.daily_usd is not None]
    return min(daily) if daily else None


@admin.register(CostReport)
class CostReportAdmin(ReadOnlyAdminMixin, TeamScopedAdminMixin, admin.ModelAdmin):
    """The cost page: spend per day (a chart, with the daily limit as a line), per workflow and
    per model, over a chosen range (30 days by default), team and workflow."""

    def changelist_view(self, request, extra_context=None):
        if not self.has_view_permission(request):
            raise PermissionDenied
        today = now().date()
        form = CostFilterForm(request.GET or None, user=request.user, initial={
            "since": today - timedelta(days=COST_PAGE_DAYS - 1), "until": today})
        if form.is_valid():
            chosen = form.cleaned_data
        else:  # the defaults (the form, when bound, shows why it was not taken)
            until = now().date()
            chosen = {"since": until - timedelta(days=COST_PAGE_DAYS - 1), "until": until}
        since, until = chosen["since"], chosen["until"]
        team = chosen.get("team") or (form.teams[0] if len(form.teams) == 1 else "")
        workflow = chosen.get("workflow") or ""
        report = {g: cost_report(user=request.user, group_by=g, since=since, until=until,
                                 team=team or None, workflow=workflow or None)
                  for g in ("day", "workflow", "model")}
        spent = {row.group: float(row.cost_usd) for row in report["day"]}
        count = (until - since).days + 1
        days = [str(since + timedelta(days=i)) for i in range(count)]
        limit = daily_limit(team_slug=team, workflow_name=workflow)
        context = {
            **self.admin_site.each_context(request),
            "title": f"Costs, {since:%d %b} to {until:%d %b %Y}",
            "opts": self.model._meta, "form": form,
            "chart": {"labels": days, "values": [round(spent.get(d, 0.0), 6) for d in days],
                      "limit": float(limit) if limit is not None else None,
                      "limit_label": f"daily limit {money(limit)}" if limit is not None else ""},
            "by_workflow": _readable(report["workflow"]), "by_model": _readable(report["model"]),
            "total": money(sum(row.cost_usd for row in report["day"])),
            "calls": sum(row.calls for row in report["day"]),
            "daily_limit": money(limit) if limit is not None else "",
            "scope": team or "all your teams", "workflow": workflow,
            "days_with_spend": len(spent),
        }
        return TemplateResponse(request, "admin/budgets/costs.html", context)
