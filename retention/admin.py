"""Retention in the admin: an owner sets how long the team's rows are kept (a policy per kind,
for the team or one of its workflows), and owners or auditors place and release legal holds.

Entry points only: saving a policy calls `retention_policy_set` (deleting it,
`retention_policy_clear`), adding a hold `legal_hold_place`, filling in a hold's release reason
`legal_hold_release`; the services check the permission and the deployment's limits and audit.
"""
from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError

from audit.access import can_read_ledger
from orchestrator.engine.authz import Action, may, teams_where
from orchestrator.engine.errors import Forbidden, NotAllowed
from orchestrator.models import Team, Workflow
from orchestrator.web.admin_display import TeamScopedAdminMixin

from .models import LegalHold, RetentionPolicy
from .services import (
    legal_hold_place,
    legal_hold_release,
    limits_of,
    policy_problems,
    retention_policy_clear,
    retention_policy_set,
)


def _refuse(model_admin, request, exc: Exception) -> None:
    model_admin.message_user(request, "; ".join(getattr(exc, "messages", [str(exc)])), messages.ERROR)
    raise PermissionDenied(str(exc)) from exc


class RetentionPolicyForm(forms.ModelForm):
    class Meta:
        model = RetentionPolicy
        fields = ["team", "workflow", "kind", "days"]

    def clean(self):
        data = super().clean()
        if data.get("kind") and data.get("days") is not None:
            for problem in policy_problems(kind=data["kind"], days=data["days"],
                                           workflow=data.get("workflow")):
                self.add_error("days" if "days" in problem else "workflow", problem)
        return data


@admin.register(RetentionPolicy)
class RetentionPolicyAdmin(TeamScopedAdminMixin, admin.ModelAdmin):
    form = RetentionPolicyForm
    list_display = ["team", "workflow", "kind", "days", "limits", "updated_by", "updated_at"]
    list_filter = ["kind", "team"]
    list_select_related = ["team", "workflow", "updated_by"]

    @admin.display(description="deployment limits")
    def limits(self, obj: RetentionPolicy) -> str:
        low, high = limits_of(obj.kind)
        return f"{low}–{high if high is not None else '∞'} days"

    def has_add_permission(self, request) -> bool:
        return teams_where(request.user, Action.RETENTION_MANAGE).exists()

    def has_change_permission(self, request, obj=None) -> bool:
        if obj is None:
            return self.has_add_permission(request)
        return may(request.user, Action.RETENTION_MANAGE, team=obj.team)

    has_delete_permission = has_change_permission

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        teams = teams_where(request.user, Action.RETENTION_MANAGE)
        if db_field.name == "team":
            kwargs["queryset"] = teams
        elif db_field.name == "workflow":
            kwargs["queryset"] = Workflow.objects.filter(team__in=teams)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def save_model(self, request, obj: RetentionPolicy, form, change) -> None:
        if change and {"team", "workflow", "kind"} & set(form.changed_data):
            old = RetentionPolicy.objects.get(pk=obj.pk)
            try:
                retention_policy_clear(policy=old, actor=request.user)
            except Forbidden as exc:
                _refuse(self, request, exc)
        try:
            saved = retention_policy_set(team=obj.team, workflow=obj.workflow, kind=obj.kind,
                                         days=obj.days, actor=request.user)
        except (Forbidden, ValidationError) as exc:
            _refuse(self, request, exc)
        obj.pk = saved.pk

    def delete_model(self, request, obj: RetentionPolicy) -> None:
        try:
            retention_policy_clear(policy=obj, actor=request.user)
        except Forbidden as exc:
            _refuse(self, request, exc)

    def delete_queryset(self, request, queryset) -> None:
        for policy in queryset:
            self.delete_model(request, policy)


def _may_hold(user, team: Team | None = None) -> bool:
    if can_read_ledger(user):
        return True
    if team is None:
        return teams_where(user, Action.LEGAL_HOLD).exists()
    return may(user, Action.LEGAL_HOLD, team=team)


@admin.register(LegalHold)
class LegalHoldAdmin(admin.ModelAdmin):
    list_display = ["__str__", "team", "reason", "placed_by", "placed_at", "released_by", "released_at"]
    list_filter = ["team"]
    raw_id_fields = ["run"]
    list_select_related = ["team"]

    def get_queryset(self, request):
        queryset = super().get_queryset(request)
        if can_read_ledger(request.user):
            return queryset
        return queryset.filter(team__in=teams_where(request.user, Action.LEGAL_HOLD))

    def has_view_permission(self, request, obj=None) -> bool:
        return _may_hold(request.user, obj.team if obj else None)

    def has_module_permission(self, request) -> bool:
        return _may_hold(request.user)

    has_add_permission = lambda self, request: _may_hold(request.user)  # noqa: E731

    def has_change_permission(self, request, obj=None) -> bool:
        return _may_hold(request.user, obj.team if obj else None) and (obj is None or obj.in_force)

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # released, never deleted: the record stays

    def get_fields(self, request, obj=None):
        return ["team", "run", "reason"] if obj is None else [
            "team", "run", "reason", "placed_by", "placed_at", "release_reason"]

    def get_readonly_fields(self, request, obj=None):
        return [] if obj is None else ["team", "run", "reason", "placed_by", "placed_at"]

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if db_field.name == "team" and not can_read_ledger(request.user):
            kwargs["queryset"] = teams_where(request.user, Action.LEGAL_HOLD)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def save_model(self, request, obj: LegalHold, form, change) -> None:
        try:
            if change:
                saved = legal_hold_release(hold=obj, reason=obj.release_reason, actor=request.user)
            else:
                saved = legal_hold_place(reason=obj.reason, actor=request.user,
                                         run=obj.run, team=None if obj.run_id else obj.team)
        except (Forbidden, NotAllowed, ValidationError) as exc:
            _refuse(self, request, exc)
        obj.pk = saved.pk
