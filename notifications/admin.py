"""Notifications in the admin: what was said to whom, and whether it arrived. Superusers only
(a notification can concern any team); read-only."""
from django.contrib import admin

from orchestrator.web.admin_display import ReadOnlyAdminMixin, badge_column

from .models import Notification


@admin.register(Notification)
class NotificationAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["created_at", "kind", "subject", badge_column("status"), "attempts", "sent_at"]
    list_filter = ["status", "kind"]
    search_fields = ["subject", "body"]
    fields = readonly_fields = ["kind", "subject", "body", "link", "recipients", "webhook", "team",
                                "status", "attempts", "created_at", "email_sent_at",
                                "webhook_sent_at", "sent_at", "next_attempt_at", "error"]

    def has_view_permission(self, request, obj=None) -> bool:
        return request.user.is_active and request.user.is_superuser

    def has_module_permission(self, request) -> bool:
        return self.has_view_permission(request)
