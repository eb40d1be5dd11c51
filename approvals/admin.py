"""Admin screens for approval requests: browse them, and decide them in bulk.

Requests are opened and decided only by the human gate's services; the screens are read-only
and scoped to the viewer's teams, and the "Approve selected" / "Reject selected" actions call
`approval_grant` / `approval_reject`, the same services the API uses, which check the decider's
authority themselves — one request at a time, reporting each refusal.
"""

from django.contrib import admin, messages
from django.db.models import QuerySet

from orchestrator.admin_display import (
    ReadOnlyAdminMixin,
    TeamScopedAdminMixin,
    badge_column,
    pretty_json,
)
from orchestrator.errors import Forbidden, NotAllowed
from orchestrator.services.kinds.human_gate import approval_grant, approval_reject

from .models import ApprovalRequest


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(TeamScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    team_field = "run__team"
    list_display = ["id", "run", "step_name", badge_column("state"), "approvers", "requested_at",
                    "deadline_at", "decided_by"]
    list_filter = ["state", "approvers"]
    list_select_related = ["run", "step", "decided_by"]
    search_fields = ["run__id", "step__name", "approvers"]
    fields = readonly_fields = [
        "run", "step", "state", "approvers", "instructions", "context_pretty", "proposal_hash",
        "requested_at", "deadline_at", "decided_at", "decided_by", "note",
    ]
    actions = ["approve_selected", "reject_selected"]

    def has_decide_permission(self, request) -> bool:
        return request.user.groups.exists() or request.user.is_superuser

    @admin.display(description="step", ordering="step__name")
    def step_name(self, approval: ApprovalRequest) -> str:
        return approval.step.name

    @admin.display(description="context")
    def context_pretty(self, approval: ApprovalRequest) -> str:
        return pretty_json(approval.context)

    @admin.action(description="Approve selected", permissions=["decide"])
    def approve_selected(self, request, queryset: QuerySet[ApprovalRequest]) -> None:
        self._decide(request, queryset, approval_grant, "Approved")

    @admin.action(description="Reject selected", permissions=["decide"])
    def reject_selected(self, request, queryset: QuerySet[ApprovalRequest]) -> None:
        self._decide(request, queryset, approval_reject, "Rejected")

    def _decide(self, request, queryset, service, verb: str) -> None:
        done = 0
        for approval_id in queryset.values_list("id", flat=True):
            try:
                service(approval_id=approval_id, user=request.user, note="(decided in the admin)")
                done += 1
            except (NotAllowed, Forbidden) as exc:
                self.message_user(request, f"Approval {approval_id}: {exc}", messages.ERROR)
        if done:
            self.message_user(request, f"{verb} {done} request(s).", messages.SUCCESS)
