"""Admin screens for approval requests: browse them, and decide them in bulk.

Requests are opened and decided only by `approvals.services`; the screens are read-only and
the "Approve selected" / "Reject selected" actions call `approval_grant` / `approval_reject`,
the same services the API uses, one request at a time, reporting each refusal.
"""

from django.contrib import admin, messages
from django.db.models import QuerySet

from orchestrator.admin_display import ReadOnlyAdminMixin, badge_column, pretty_json
from orchestrator.services.errors import NotAllowed

from .models import ApprovalRequest
from .services import approval_grant, approval_reject, user_may_decide


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
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
        return request.user.has_perm("approvals.change_approvalrequest")

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
        for approval in queryset.select_related("run__team"):
            if not user_may_decide(request.user, approval):
                self.message_user(request, f"Approval {approval.id}: you are not one of its "
                                  f"approvers ({approval.approvers}).", messages.ERROR)
                continue
            try:
                service(approval_id=approval.id, user=request.user, note="(decided in the admin)")
                done += 1
            except NotAllowed as exc:
                self.message_user(request, f"Approval {approval.id}: {exc}", messages.ERROR)
        if done:
            self.message_user(request, f"{verb} {done} request(s).", messages.SUCCESS)
