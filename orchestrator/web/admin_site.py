"""Stepwise's admin site: who may sign in, and what every page shows about pending approvals.

Django's own site admits staff only. Here a reviewer — a person in a team and in a group, such
as a member of the approvers group who is not staff — may sign in too, to decide; what anyone
sees inside is still scoped by each screen (`TeamScopedAdminMixin`, `approvals.authority`), so
signing in grants nothing by itself. Every page gets `approvals_waiting` and `inputs_waiting`:
how many pending requests and open input tasks wait for the person (the header and the admin
home show them).

Someone who entered only as a reviewer (not staff) is shown only the reviewer's pages in the
index, the sidebar and the header (`REVIEWER_PAGES`); the other screens still answer by their
own scoping if opened, but are not offered to a person who came to decide.
"""
from django.contrib import admin
from django.contrib.admin.forms import AdminAuthenticationForm
from django.core.exceptions import ValidationError

from approvals.authority import inbox, input_inbox, is_reviewer, on_the_way
from orchestrator.engine.authz import teams_visible_to


def may_enter(user) -> bool:
    return user.is_active and (user.is_staff or is_reviewer(user))


class ReviewerAuthenticationForm(AdminAuthenticationForm):
    """Django's admin login form, letting reviewers in as well as staff."""

    def confirm_login_allowed(self, user) -> None:
        if not may_enter(user):
            raise ValidationError(self.error_messages["invalid_login"], code="invalid_login",
                                  params={"username": self.username_field.verbose_name})


# (app label, model name) of the pages a reviewer who is not staff is offered.
REVIEWER_PAGES = frozenset({("approvals", "approvalrequest"), ("approvals", "inputtask")})


def reviewer_only(user) -> bool:
    """Signed in to decide, not to operate: a reviewer who is neither staff nor superuser."""
    return user.is_authenticated and not (user.is_staff or user.is_superuser)


class StepwiseAdminSite(admin.AdminSite):
    site_header = "Stepwise operations"
    site_title = "Stepwise"
    index_title = "Operations"
    login_form = ReviewerAuthenticationForm

    def has_permission(self, request) -> bool:
        return may_enter(request.user)

    def get_app_list(self, request, app_label=None) -> list[dict]:
        apps = super().get_app_list(request, app_label)
        if not reviewer_only(request.user):
            return apps
        shown = []
        for app in apps:
            models = [m for m in app["models"]
                      if (app["app_label"], m["object_name"].lower()) in REVIEWER_PAGES]
            if models:
                shown.append({**app, "models": models})
        return shown

    def each_context(self, request) -> dict:
        context = super().each_context(request)
        user = request.user
        context["approvals_waiting"] = inbox(user).count() if user.is_authenticated else 0
        context["inputs_waiting"] = input_inbox(user).count() if user.is_authenticated else 0
        context["waiting_total"] = context["approvals_waiting"] + context["inputs_waiting"]
        context["reviewer_only"] = reviewer_only(user)
        # The header offers only pages that open for this person: the inbox to reviewers, the
        # operations pages to people of some team (an auditor may be in none).
        context["may_review"] = user.is_authenticated and (user.is_superuser or is_reviewer(user))
        context["sees_teams"] = teams_visible_to(user).exists()
        return context

    def index(self, request, extra_context=None):
        # Only the home page counts the runs on their way to a gate: it is where a reviewer
        # decides whether to wait.
        on_way = on_the_way(request.user) if request.user.is_authenticated else 0
        return super().index(request, {"approvals_on_the_way": on_way, **(extra_context or {})})
