"""Admin screens for workflows, runs, steps and events: a window, not a control panel.

Runs, steps, attempts, events and versions are written only by the services, so their screens
are read-only (no add, change or delete), every state field is read-only, and each person sees
their teams' objects only. What an operator can do here is what the API allows too, through the
same services, which check the permission themselves: "Cancel selected runs" calls `run_cancel`,
"Redrive selected dead letters" calls `dead_letter_redrive`.
"""

import json
import uuid
from datetime import UTC
from functools import partial

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.options import IncorrectLookupParameters
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Max, QuerySet
from django.http import Http404
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.module_loading import import_string
from django.utils.safestring import mark_safe

from budgets.selectors import run_budget
from orchestrator.web.admin_paging import HistoryListMixin, documents, recent_values_filter

from .engine.authz import Action, may, teams_where, visible
from .engine.clock import now
from .engine.definitions import DefinitionInvalid
from .engine.definitions.format import WORKFLOW_NAME_PATTERN
from .engine.errors import BudgetExceeded, Forbidden, IdempotencyConflict, InputInvalid, NotAllowed
from .engine.gallery import sample_input_of, templates
from .engine.provenance import describe
from .engine.services.gallery import template_instantiate
from .engine.services.gate_policies import gate_policy_create, gate_policy_delete
from .engine.services.moves import runs_move, runs_move_plan
from .engine.services.operators import dead_letter_redrive
from .engine.services.reruns import MAX_RERUN_RUNS, rerun_version, rerun_workflow, runs_rerun
from .engine.services.runs import run_cancel, run_start
from .engine.services.workflows import (
    workflow_archive,
    workflow_policy_set,
    workflow_publish,
    workflow_restore,
)
from .engine.states import RUN_TERMINAL
from .models import (
    DeadLetter,
    Effect,
    Event,
    GatePolicy,
    Rerun,
    Run,
    Signal,
    StepAttempt,
    StepResult,
    StepRun,
    Team,
    TeamMembership,
    WorkerHeartbeat,
    Workflow,
    WorkflowVersion,
)
from .web.admin_display import (
    ReadOnlyAdminMixin,
    TeamScopedAdminMixin,
    badge_column,
    pretty_json,
    state_badge,
)
from .web.builder import views as builder_views
from .web.live import views as live_views


class ReadOnlyInline(ReadOnlyAdminMixin, admin.TabularInline):
    extra = 0
    can_delete = False
    show_change_link = True

    def get_readonly_fields(self, request, obj=None):
        return self.fields


class TeamMembershipInline(admin.TabularInline):
    model = TeamMembership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    """Teams and who is in them with which role: for superusers (docs/permissions.md)."""

    list_display = ["slug", "name"]
    search_fields = ["slug", "name"]
    inlines = [TeamMembershipInline]


class WorkflowVersionInline(ReadOnlyInline):
    model = WorkflowVersion
    fields = ["number", "digest", "created_at", "created_by"]
    ordering = ["-number"]


@admin.register(Workflow)
class WorkflowAdmin(TeamScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["name", "team", "latest_version", "published_version", "archived_at",
                    "created_at", "builder_link"]
    list_filter = ["team"]
    search_fields = ["name"]
    list_select_related = ["team", "active_version"]
    fields = readonly_fields = ["team", "name", "created_at", "published_version",
                                "publish_on_save", "archived_at"]
    inlines = [WorkflowVersionInline]
    actions = ["archive", "restore", "publish_on_save", "drafts_on_save"]

    change_list_template = "admin/orchestrator/workflow/change_list.html"
    change_form_template = "admin/orchestrator/workflow/change_form.html"

    def get_queryset(self, request) -> QuerySet[Workflow]:
        return super().get_queryset(request).annotate(latest_number=Max("versions__number"))

    @admin.display(description="latest version", ordering="latest_number")
    def latest_version(self, workflow: Workflow) -> int | None:
        return workflow.latest_number

    @admin.display(description="published version", ordering="active_version__number")
    def published_version(self, workflow: Workflow) -> int | None:
        return workflow.active_version.number if workflow.active_version else None

    def has_archive_permission(self, request) -> bool:
        return teams_where(request.user, Action.WORKFLOW_ARCHIVE).exists()

    @admin.action(description="Archive selected workflows (no new runs)", permissions=["archive"])
    def archive(self, request, queryset: QuerySet[Workflow]) -> None:
        _each(self, request, queryset, workflow_archive, "Archived")

    @admin.action(description="Restore selected workflows", permissions=["archive"])
    def restore(self, request, queryset: QuerySet[Workflow]) -> None:
        _each(self, request, queryset, workflow_restore, "Restored")


    def has_policy_permission(self, request) -> bool:
        return teams_where(request.user, Action.WORKFLOW_POLICY).exists()

    @admin.action(description="Saving publishes the new version", permissions=["policy"])
    def publish_on_save(self, request, queryset: QuerySet[Workflow]) -> None:
        _each(self, request, queryset, partial(workflow_policy_set, publish_on_save=True), "Changed")

    @admin.action(description="Saving leaves a draft to publish", permissions=["policy"])
    def drafts_on_save(self, request, queryset: QuerySet[Workflow]) -> None:
        _each(self, request, queryset, partial(workflow_policy_set, publish_on_save=False), "Changed")

    @admin.display(description="builder")
    def builder_link(self, workflow: Workflow) -> str:
        # Shown as get_list_display's per-person version of it; this one is what Django's
        # checks see.
        return format_html('<a href="{}">open in builder</a>', reverse(
            "admin:orchestrator_workflow_builder_edit", args=[workflow.id]))

    def get_list_display(self, request):
        # The builder opens for whoever may save in the workflow's team: nobody else is
        # offered a link that answers 403.
        saving = set(teams_where(request.user, Action.WORKFLOW_SAVE).values_list("id", flat=True))

        @admin.display(description="builder")
        def builder_link(workflow: Workflow) -> str:
            if workflow.team_id not in saving:
                return "-"
            return format_html('<a href="{}">open in builder</a>', reverse(
                "admin:orchestrator_workflow_builder_edit", args=[workflow.id]))

        return [builder_link if column == "builder_link" else column
                for column in self.list_display if column != "builder_link" or saving]

    def change_view(self, request, object_id, form_url="", extra_context=None):
        # What other apps show on a workflow's page (settings.STEPWISE_WORKFLOW_ADMIN_PANELS: the
        # evaluation app's release policy), each a function (request, workflow) -> HTML; named
        # in settings so that this module imports none of them.
        workflow = self.get_queryset(request).filter(pk=object_id).first() if str(object_id).isdigit() else None
        panels = [mark_safe(import_string(panel)(request, workflow))
                  for panel in settings.STEPWISE_WORKFLOW_ADMIN_PANELS] if workflow is not None else []
        return super().change_view(request, object_id, form_url, {**(extra_context or {}), "panels": panels})

    def changelist_view(self, request, extra_context=None):
        may_save = teams_where(request.user, Action.WORKFLOW_SAVE).exists()
        return super().changelist_view(request, {**(extra_context or {}), "may_save": may_save})

    def get_urls(self):
        # The visual builder (orchestrator/web/builder/views.py, docs/builder.md).
        def page(view):
            def wrapped(request, *args, **kwargs):
                return view(request, *args, admin_context=self.admin_site.each_context(request), **kwargs)
            return self.admin_site.admin_view(wrapped)

        view = self.admin_site.admin_view(self.from_template_view)
        return [path("from-template/", view, name="orchestrator_workflow_from_template"),
                path("builder/", page(builder_views.builder_page), name="orchestrator_workflow_builder"),
                path("builder/layout/", self.admin_site.admin_view(builder_views.builder_layout),
                     name="orchestrator_workflow_builder_layout"),
                path("<int:workflow_id>/builder/", page(builder_views.builder_page),
                     name="orchestrator_workflow_builder_edit"),
                path("<int:workflow_id>/run/", self.admin_site.admin_view(self.run_view),
                     name="orchestrator_workflow_run"),
                *super().get_urls()]

    def run_view(self, request, workflow_id: int):
        """Run...: the published version with an input the person edits, offered as the
        workflow's template's sample input (`gallery.sample_input_of`). `run_start` checks
        run.start and the input; a refusal comes back on the form, each problem with its path."""
        workflow = self.get_queryset(request).select_related("active_version").filter(
            id=workflow_id).first()
        if workflow is None:
            raise Http404("no such workflow, or not one of your teams'")
        text = json.dumps(sample_input_of(workflow), indent=2, ensure_ascii=False)
        problems, status = [], 200
        if request.method == "POST":
            text = request.POST.get("input", "")
            try:
                run_input = json.loads(text or "{}")
            except ValueError as exc:
                problems, status = [{"path": "input", "message": f"not JSON: {exc}"}], 400
            else:
                try:
                    if workflow.active_version is None:
                        raise NotAllowed(f"workflow {workflow.name} has no published version")
                    run = run_start(version=workflow.active_version, input=run_input,
                                    actor=request.user, trigger="admin")
                except (InputInvalid, Forbidden, NotAllowed, BudgetExceeded) as exc:
                    problems = getattr(exc, "problems", None) or [{"path": "", "message": str(exc)}]
                    status = 403 if isinstance(exc, Forbidden) else 400
                else:
                    return redirect("admin:orchestrator_run_live", run.id)
        context = {**self.admin_site.each_context(request), "title": f"Run {workflow.name}",
                   "workflow": workflow, "input_text": text, "problems": problems,
                   "opts": self.model._meta, "original": workflow}
        return TemplateResponse(request, "admin/orchestrator/workflow/run.html", context,
                                status=status)

    def from_template_view(self, request):
        """New workflow from template: the gallery, and a form per template that calls
        `template_instantiate` (which checks workflow.save in the chosen team)."""
        teams = teams_where(request.user, Action.WORKFLOW_SAVE).order_by("slug")
        posted = request.POST.get("template") if request.method == "POST" else None
        form = None
        if posted:
            form = TemplateForm(request.POST, teams=teams)
            if form.is_valid():
                try:
                    version, created = template_instantiate(
                        template=posted, team=form.cleaned_data["team"], actor=request.user,
                        name=form.cleaned_data["name"] or None)
                except (Forbidden, InputInvalid, DefinitionInvalid) as exc:
                    problems = getattr(exc, "problems", [])
                    form.add_error(None, "; ".join(str(p) for p in problems) or str(exc))
                else:
                    verb = "created" if created else "already existed, unchanged"
                    self.message_user(request, f"Workflow {version.workflow.name} v{version.number} {verb}.",
                                      messages.SUCCESS)
                    return redirect("admin:orchestrator_workflow_change", version.workflow_id)
        cards = [{"template": t, "form": form if t.name == posted else TemplateForm(teams=teams, initial={
                    "template": t.name, "team": teams.first()})} for t in templates()]
        context = {**self.admin_site.each_context(request), "title": "New workflow from template",
                   "cards": cards, "may_save": teams.exists(), "opts": self.model._meta}
        return TemplateResponse(request, "admin/orchestrator/workflow/from_template.html", context,
                                status=400 if form is not None else 200)


def _each(model_admin, request, queryset, service, done_label: str) -> None:
    done = 0
    for workflow_id, name in queryset.values_list("id", "name"):
        try:
            service(workflow_id=workflow_id, actor=request.user)
            done += 1
        except (NotAllowed, Forbidden) as exc:
            model_admin.message_user(request, f"workflow {name}: {exc}", messages.ERROR)
    if done:
        model_admin.message_user(request, f"{done_label} {done} workflow(s).", messages.SUCCESS)


@admin.register(GatePolicy)
class GatePolicyAdmin(TeamScopedAdminMixin, admin.ModelAdmin):
    """Mandatory gate policies: owners add and remove them here, through the same services as
    the API (`gate_policies`), never change one in place."""

    list_display = ["tool", "target", "team", "workflow", "approvers", "required_approvals",
                    "self_approval_up_to", "created_by", "created_at"]
    list_filter = ["team"]
    list_select_related = ["team", "workflow", "created_by"]
    fields = ["team", "workflow", "tool", "target", "approvers", "required_approvals",
              "self_approval_up_to"]
    actions = None  # each removal goes through the service, one at a time

    def has_add_permission(self, request) -> bool:
        return teams_where(request.user, Action.WORKFLOW_POLICY).exists()

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        teams = teams_where(request.user, Action.WORKFLOW_POLICY)
        return teams.filter(pk=obj.team_id).exists() if obj else teams.exists()

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        teams = teams_where(request.user, Action.WORKFLOW_POLICY)
        if db_field.name == "team":
            kwargs["queryset"] = teams
        elif db_field.name == "workflow":
            kwargs["queryset"] = Workflow.objects.filter(team__in=teams)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def save_model(self, request, obj: GatePolicy, form, change) -> None:
        try:
            created = gate_policy_create(
                team=obj.team, workflow=obj.workflow, actor=request.user, tool=obj.tool,
                target=obj.target, approvers=obj.approvers,
                required_approvals=obj.required_approvals,
                self_approval_up_to=obj.self_approval_up_to)
        except (Forbidden, InputInvalid) as exc:
            self.message_user(request, str(exc), messages.ERROR)
            raise PermissionDenied(str(exc)) from exc
        obj.pk = created.pk

    def delete_model(self, request, obj: GatePolicy) -> None:
        try:
            gate_policy_delete(policy_id=obj.pk, actor=request.user)
        except (Forbidden, NotAllowed) as exc:
            self.message_user(request, str(exc), messages.ERROR)
            raise PermissionDenied(str(exc)) from exc


class TemplateForm(forms.Form):
    """Which team the template's workflow is saved to, and under which name."""

    template = forms.CharField(widget=forms.HiddenInput)
    team = forms.ModelChoiceField(queryset=None, empty_label=None)
    name = forms.RegexField(WORKFLOW_NAME_PATTERN, required=False, max_length=100,
                            help_text="Leave empty to use the template's name.")

    def __init__(self, *args, teams, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["team"].queryset = teams


@admin.register(WorkflowVersion)
class WorkflowVersionAdmin(TeamScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    team_field = "workflow__team"
    list_display = ["workflow", "number", "digest", "created_at", "created_by"]
    list_filter = ["workflow__team", "workflow__name"]
    list_select_related = ["workflow__team", "created_by"]
    search_fields = ["workflow__name", "digest"]
    fields = readonly_fields = ["workflow", "number", "digest", "created_at", "created_by",
                                "definition_pretty", "normalized_pretty"]
    actions = ["publish"]

    def has_publish_permission(self, request) -> bool:
        return teams_where(request.user, Action.WORKFLOW_PUBLISH).exists()

    @admin.action(description="Publish the selected version (runs and triggers start it)",
                  permissions=["publish"])
    def publish(self, request, queryset: QuerySet[WorkflowVersion]) -> None:
        versions = list(queryset.select_related("workflow"))
        if len({v.workflow_id for v in versions}) != len(versions):
            self.message_user(request, "Select one version per workflow to publish.", messages.ERROR)
            return
        for version in versions:
            try:
                workflow_publish(workflow_id=version.workflow_id, number=version.number,
                                 actor=request.user)
            except (NotAllowed, Forbidden) as exc:
                paths = "; ".join(f"{p['path']}: {p['message']}" for p in exc.problems if p["path"])
                self.message_user(request, f"{version}: {exc}" + (f" ({paths})" if paths else ""),
                                  messages.ERROR)
            else:
                self.message_user(request, f"Published {version}.", messages.SUCCESS)

    def get_queryset(self, request) -> QuerySet[WorkflowVersion]:
        queryset = super().get_queryset(request)
        if request.resolver_match and request.resolver_match.url_name.endswith("changelist"):
            queryset = queryset.defer("definition", "normalized")
        return queryset

    @admin.display(description="definition")
    def definition_pretty(self, version: WorkflowVersion) -> str:
        return pretty_json(version.definition)

    @admin.display(description="normalized (defaults filled in)")
    def normalized_pretty(self, version: WorkflowVersion) -> str:
        return pretty_json(version.normalized)


class StepRunInline(ReadOnlyInline):
    model = StepRun
    fields = ["position", "name", "kind", "state", "attempts", "cost_usd", "tokens_in",
              "tokens_out", "queued_at", "started_at", "finished_at", "skip_reason", "error"]
    ordering = ["position"]


class EventInline(ReadOnlyInline):
    model = Event
    fields = ["created_at", "kind", "step", "actor", "payload"]
    show_change_link = False

    def get_queryset(self, request) -> QuerySet[Event]:
        return super().get_queryset(request).select_related("step")


_RUN_FIELDS = ["id", "live_page", "team", "version", "state", "trigger", "started_by_trigger", "created_by",
               "set_in_motion_by",
               "idempotency_key",
               "parent_step", "created_at", "started_at", "finished_at", "progressed_at",
               "cost_usd", "budget", "tokens_in", "tokens_out", "input_pretty", "output_pretty",
               "error_pretty", "audit_timeline"]


class RunViewFilter(admin.SimpleListFilter):
    """Named views of the run list an operator comes back to; Django keeps the chosen one (with
    the other filters) across the change pages and back."""

    title = "view"
    parameter_name = "view"
    VIEWS = {
        "attention": ("needs a person (waiting, paused)", {"state__in": ["waiting", "paused"]}),
        "failed": ("failed or timed out", {"state__in": ["failed", "timed_out",
                                                          "compensation_failed"]}),
        "active": ("running now", {"state__in": ["pending", "running", "cancelling",
                                                 "compensating"]}),
        "triggered": ("started by a trigger", {"trigger_firing__isnull": False}),
    }

    def lookups(self, request, model_admin):
        return [("mine", "started by me"),
                *((key, label) for key, (label, _) in self.VIEWS.items())]

    def queryset(self, request, queryset):
        if self.value() == "mine":
            return queryset.filter(created_by=request.user)
        if self.value() in self.VIEWS:
            return queryset.filter(**self.VIEWS[self.value()][1])
        return queryset


def _moment(value) -> str:
    """A time as "3 minutes ago", with the exact time (UTC) in its title; run_list_live.js
    keeps the words current from `datetime`."""
    if value is None:
        return "-"
    exact = value.astimezone(UTC)
    return format_html('<time datetime="{}" title="{}">{}</time>', exact.isoformat(),
                       exact.strftime("%Y-%m-%d %H:%M:%S UTC"), _ago((now() - value).total_seconds()))


def _ago(seconds: float) -> str:
    """How long ago, in the words run_list_live.js uses too."""
    minutes = int(seconds // 60)
    if minutes < 1:
        return "just now"
    if minutes < 60:
        return f"{minutes} min ago"
    if minutes < 24 * 60:
        return f"{minutes // 60} h {minutes % 60} min ago"
    return f"{minutes // (24 * 60)} d ago"


def _seconds(total: float) -> str:
    total = int(total)
    if total < 60:
        return f"{total} s"
    if total < 3600:
        return f"{total // 60} min {total % 60} s"
    return f"{total // 3600} h {total % 3600 // 60} min"


@admin.register(Run)
class RunAdmin(HistoryListMixin, TeamScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["run_id", "workflow", "version_number", "team", badge_column("state"),
                    "cost_usd", "trigger_column", "started_by", "created", "duration", "live_page"]
    list_display_links = ["run_id"]
    list_filter = [RunViewFilter, "state", "version__workflow__name", "team",
                   recent_values_filter("trigger", newest=("-created_at", "-id")), "created_at"]
    list_select_related = ["team", "version__workflow", "created_by", "trigger_firing__trigger",
                           "parent_step__run"]
    list_defer = (tuple(f for f in documents(Run) if f != "provenance")  # "started by" reads it
                  + documents(Workflow, "version__workflow__") + documents(StepRun, "parent_step__")
                  + documents(Run, "parent_step__run__"))
    search_fields = ["id", "idempotency_key", "version__workflow__name"]
    # Newest first along `run_created_id`; no date hierarchy (it reads every run's day).
    ordering = ["-created_at", "-id"]
    fields = readonly_fields = _RUN_FIELDS
    inlines = [StepRunInline, EventInline]
    actions = ["cancel_runs", "move_runs", "rerun_runs"]

    def get_queryset(self, request) -> QuerySet[Run]:
        return super().get_queryset(request).defer("version__definition", "version__normalized")

    def changelist_view(self, request, extra_context=None):
        return super().changelist_view(request, {**(extra_context or {}),
                                                 "may_rerun": self.has_rerun_permission(request)})

    def get_fields(self, request, obj: Run | None = None) -> list[str]:
        # A finished run may become an evaluation case (evaluation/), offered to whoever may add one.
        if obj is not None and obj.state in RUN_TERMINAL and may(request.user, Action.DATASET_ADD_RUN, team=obj.team):
            return [*_RUN_FIELDS, "add_to_dataset"]
        return _RUN_FIELDS

    def get_readonly_fields(self, request, obj: Run | None = None) -> list[str]:
        return self.get_fields(request, obj)

    @admin.display(description="evaluation")
    def add_to_dataset(self, run: Run) -> str:
        return format_html('<a href="{}" id="add-to-dataset">Add to a dataset</a> (its outcome corrected)',
                           reverse("admin:evaluation_dataset_from_run", args=[run.id]))

    def get_urls(self):
        # The live run page, its JSON state and its operator controls; the operations page
        # (orchestrator/web/live/views.py, docs/live.md).
        def page(view):
            def wrapped(request, *args, **kwargs):
                return view(request, *args, admin_context=self.admin_site.each_context(request), **kwargs)
            return self.admin_site.admin_view(wrapped)

        return [
            path("operations/", page(live_views.operations_page), name="orchestrator_operations"),
            path("operations/state/", self.admin_site.admin_view(live_views.operations_state),
                 name="orchestrator_operations_state"),
            path("<uuid:run_id>/live/", page(live_views.run_page), name="orchestrator_run_live"),
            path("<uuid:run_id>/live/state/", self.admin_site.admin_view(live_views.run_state),
                 name="orchestrator_run_state"),
            path("<uuid:run_id>/live/operate/<str:operation>/", page(live_views.run_operate),
                 name="orchestrator_run_operate"),
            path("rerun/", self.admin_site.admin_view(self.rerun_view), name="orchestrator_run_rerun"),
            path("reruns/<int:rerun_id>/", self.admin_site.admin_view(self.rerun_progress_view),
                 name="orchestrator_run_rerun_progress"),
            *super().get_urls(),
        ]

    @admin.display(description="id", ordering="id")
    def run_id(self, run: Run) -> str:
        # The run list's live script finds each row's run by this attribute.
        return format_html('<span data-run-id="{}">{}</span>', run.id, run.id)

    @admin.display(description="trigger", ordering="trigger")
    def trigger_column(self, run: Run) -> str:
        firing = getattr(run, "trigger_firing", None)
        if firing is None:
            return run.trigger
        link = reverse("admin:triggers_trigger_change", args=[firing.trigger_id])
        return format_html('{} <a href="{}">{}</a>', run.trigger, link, firing.trigger.name)

    @admin.display(description="started by", ordering="created_by__username")
    def started_by(self, run: Run) -> str:
        # The people who set it in motion (orchestrator/engine/provenance.py): the starter, or the
        # trigger's creator and last changer, or the parent run's people.
        people = [p["username"] for p in (run.provenance or {}).get("people") or []]
        if people:
            return ", ".join(people)
        if run.created_by_id:
            return run.created_by.get_username()
        firing = getattr(run, "trigger_firing", None)
        if firing is not None:
            return f"trigger {firing.trigger.name}"
        if run.parent_step_id:
            return format_html('<a href="{}">parent run</a>', reverse(
                "admin:orchestrator_run_change", args=[run.parent_step.run_id]))
        return "-"

    @admin.display(description="created", ordering="created_at")
    def created(self, run: Run) -> str:
        return _moment(run.created_at)

    @admin.display(description="duration")
    def duration(self, run: Run) -> str:
        if run.started_at is None:
            return "-"
        if run.finished_at is not None:
            return _seconds((run.finished_at - run.started_at).total_seconds())
        return format_html('<span data-since="{}">{} so far</span>', run.started_at.isoformat(),
                           _seconds((now() - run.started_at).total_seconds()))

    @admin.display(description="live page")
    def live_page(self, run: Run) -> str:
        return format_html('<a href="{}">watch</a>', reverse("admin:orchestrator_run_live", args=[run.id]))

    @admin.display(description="workflow", ordering="version__workflow__name")
    def workflow(self, run: Run) -> str:
        return run.version.workflow.name

    @admin.display(description="version", ordering="version__number")
    def version_number(self, run: Run) -> int:
        return run.version.number

    @admin.display(description="input")
    def input_pretty(self, run: Run) -> str:
        return pretty_json(run.input)

    @admin.display(description="set in motion by")
    def set_in_motion_by(self, run: Run) -> str:
        # Everyone separation of duties refuses as the run's approver
        # (orchestrator/engine/provenance.py).
        return describe(run.provenance) or "-"

    @admin.display(description="started by trigger")
    def started_by_trigger(self, run: Run) -> str:
        # The firing that started it, if a trigger did (triggers app; reached by its reverse
        # accessor so this module imports nothing of it).
        firing = getattr(run, "trigger_firing", None)
        if firing is None:
            return "-"
        link = reverse("admin:triggers_trigger_change", args=[firing.trigger_id])
        return format_html('<a href="{}">{}</a> ({}, {})', link, firing.trigger.name,
                           firing.trigger.kind, firing.key)

    @admin.display(description="why it happened")
    def audit_timeline(self, run: Run) -> str:
        return format_html('<a href="{}">audit timeline of this run</a>',
                           reverse("admin:audit_run_timeline", args=[run.id]))

    @admin.display(description="output")
    def output_pretty(self, run: Run) -> str:
        return pretty_json(run.output)

    @admin.display(description="error")
    def error_pretty(self, run: Run) -> str:
        return pretty_json(run.error)

    @admin.display(description="budget")
    def budget(self, run: Run) -> str:
        figures = run_budget(run)
        limit = "no limit" if figures.limit_usd is None else (
            f"limit ${figures.limit_usd:.4f}" + (" (raised by an operator)" if figures.overridden else ""))
        remaining = "" if figures.remaining_usd is None else f", ${figures.remaining_usd:.4f} remaining"
        return (f"${figures.spent_usd:.4f} spent, ${figures.reserved_usd:.4f} reserved{remaining}; {limit}"
                + (f" — paused: {run.error['message']}" if run.state == "paused" and (run.error or {}).get("class") == "budget" else ""))

    def has_cancel_permission(self, request) -> bool:
        # Offered to whoever may cancel runs in some team, or has started runs; the service
        # decides for each run.
        user = request.user
        return teams_where(user, Action.RUN_CANCEL).exists() or Run.objects.filter(created_by=user).exists()

    @admin.action(description="Cancel selected runs", permissions=["cancel"])
    def cancel_runs(self, request, queryset: QuerySet[Run]) -> None:
        cancelled = 0
        for run_id in queryset.values_list("id", flat=True):
            try:
                run_cancel(run_id=run_id, actor=request.user)
                cancelled += 1
            except (NotAllowed, Forbidden) as exc:
                self.message_user(request, f"run {run_id}: {exc}", messages.ERROR)
        if cancelled:
            self.message_user(request, f"Cancelled (or cancelling) {cancelled} run(s).",
                              messages.SUCCESS)

    # Bulk re-run (services/reruns.py, docs/operations.md#re-running-in-bulk): the selected runs,
    # or every run the list's filters match, confirmed on a page that picks the version and
    # carries the batch's key (a double submit is one batch), then the batch's progress page.

    def has_rerun_permission(self, request) -> bool:
        return teams_where(request.user, Action.RUN_START).exists()

    @admin.action(description="Re-run selected runs…", permissions=["rerun"])
    def rerun_runs(self, request, queryset: QuerySet[Run]):
        return self._rerun_confirm(request, list(queryset.values_list("id", flat=True)[:MAX_RERUN_RUNS + 1]))

    def rerun_view(self, request):
        """GET: the confirmation for every run the list's filters (this page's query) match;
        POST: the confirmed batch, through `runs_rerun`, then its progress page."""
        if request.method == "POST":
            return self._rerun_submit(request)
        try:
            runs = self.get_changelist_instance(request).get_queryset(request)
        except IncorrectLookupParameters:
            self.message_user(request, "The list's filters are not understood: choose them on the list.",
                              messages.ERROR)
            return redirect("admin:orchestrator_run_changelist")
        return self._rerun_confirm(request, list(runs.values_list("id", flat=True)[:MAX_RERUN_RUNS + 1]))

    def _rerun_confirm(self, request, run_ids: list, *, problems=(), status: int = 200, key: str = ""):
        if len(run_ids) > MAX_RERUN_RUNS:
            self.message_user(request, f"More than {MAX_RERUN_RUNS} runs are chosen: narrow the list "
                              "(by workflow, state or date) to re-run them.", messages.ERROR)
            return redirect("admin:orchestrator_run_changelist")
        try:
            workflow = rerun_workflow(actor=request.user, run_ids=[str(i) for i in run_ids])
        except InputInvalid as exc:
            self.message_user(request, f"Nothing to re-run: {exc.problems[0]['message']}.", messages.ERROR)
            return redirect("admin:orchestrator_run_changelist")
        chosen = self.get_queryset(request).filter(id__in=run_ids)
        by_state = {row["state"]: row["n"] for row in chosen.values("state").annotate(n=Count("id"))}
        versions = list(workflow.versions.defer("definition", "normalized").order_by("-number"))
        picked = request.POST.get("version") or (workflow.active_version.number if workflow.active_version
                                                 else versions[0].number)
        context = {**self.admin_site.each_context(request), "opts": self.model._meta,
                   "title": f"Re-run {_runs(len(run_ids))} of {workflow.name}", "workflow": workflow,
                   "versions": versions, "picked": str(picked), "count": len(run_ids),
                   "by_state": [(state_badge(state), n) for state, n in sorted(by_state.items())],
                   "runs": ",".join(str(i) for i in run_ids),
                   "key": key or uuid.uuid4().hex, "problems": problems}
        return TemplateResponse(request, "admin/orchestrator/run/rerun_confirm.html", context, status=status)

    def _rerun_submit(self, request):
        run_ids = [part for part in request.POST.get("runs", "").split(",") if part]
        key = request.POST.get("key", "")
        try:
            workflow = rerun_workflow(actor=request.user, run_ids=run_ids)
            number = request.POST.get("version", "")
            version = rerun_version(workflow, int(number) if number.isascii() and number.isdigit() else number)
            rerun = runs_rerun(run_ids=run_ids, version=version, actor=request.user, key=key)
        except Forbidden as exc:
            raise PermissionDenied(str(exc)) from exc
        except (InputInvalid, IdempotencyConflict) as exc:
            # Asked again with what it said; a key used for another batch is not offered again.
            return self._rerun_confirm(request, run_ids, problems=exc.problems, status=400,
                                       key="" if isinstance(exc, IdempotencyConflict) else key)
        return redirect("admin:orchestrator_run_rerun_progress", rerun.id)

    def rerun_progress_view(self, request, rerun_id: int):
        """A batch's progress, refreshed while its runs are being started: each source run with
        its new run or the reason it was refused."""
        rerun = visible(Rerun.objects.select_related("team", "version__workflow"), request.user).defer(
            "version__definition", "version__normalized").filter(pk=rerun_id).first()
        if rerun is None:
            raise Http404("no such re-run, or not one of your teams'")
        items = rerun.items.select_related("source_run", "new_run").only(
            "position", "outcome", "reason", "source_run__id", "source_run__state", "new_run__id",
            "new_run__state").order_by("position")
        items = list(items)
        for item in items:  # shown as the run list shows states
            item.badges = [state_badge(item.source_run.state), format_html(
                '<span class="state-badge state-{}">{}</span>', _OUTCOME_TONES[item.outcome], item.outcome),
                state_badge(item.new_run.state) if item.new_run else ""]
        context = {**self.admin_site.each_context(request), "opts": self.model._meta,
                   "title": f"Re-run of {_runs(rerun.total)} of {rerun.version.workflow.name} on "
                            f"version {rerun.version.number}",
                   "rerun": rerun, "items": items,
                   "pending": max(rerun.total - rerun.started - rerun.refused, 0)}
        return TemplateResponse(request, "admin/orchestrator/run/rerun_progress.html", context)


    def has_move_permission(self, request) -> bool:
        # Offered to whoever may move runs in some team; the service decides for each run.
        return teams_where(request.user, Action.RUN_MOVE).exists()

    @admin.action(description="Move to another version…", permissions=["move"])
    def move_runs(self, request, queryset: QuerySet[Run]):
        """Choose a version of the selected runs' workflow, see the dry run (`runs_move_plan`),
        then confirm with a reason (`runs_move`); the services check run.move and each run."""
        ids = [str(i) for i in queryset.values_list("id", flat=True)]
        versions = (WorkflowVersion.objects.select_related("workflow")
                    .filter(workflow__in=queryset.values("version__workflow"))
                    .defer("definition", "normalized").order_by("workflow__name", "-number"))
        version = versions.filter(id=request.POST.get("version") or 0).first()
        reason = request.POST.get("reason", "").strip()
        plans, problems = [], []
        if version is not None:
            try:
                if request.POST.get("confirm") and reason:
                    done = runs_move(run_ids=ids, version=version, actor=request.user, reason=reason)
                    self._moved_message(request, done, version)
                    return None
                if request.POST.get("confirm"):
                    problems.append("Say why the runs are moved: the reason is recorded in the audit ledger.")
                plans = runs_move_plan(run_ids=ids, version=version, actor=request.user)
            except (Forbidden, InputInvalid, Run.DoesNotExist) as exc:
                self.message_user(request, str(exc), messages.ERROR)
                return None
        context = {**self.admin_site.each_context(request), "title": "Move runs to another version",
                   "opts": self.model._meta, "ids": ids, "versions": versions, "version": version,
                   "plans": plans, "movable": sum(p.movable for p in plans), "reason": reason,
                   "problems": problems, "action_checkbox_name": "_selected_action"}
        return TemplateResponse(request, "admin/orchestrator/run/move.html", context,
                                status=400 if problems else 200)

    def _moved_message(self, request, plans, version) -> None:
        moved = [p for p in plans if p.movable]
        if moved:
            self.message_user(request, f"Moved {len(moved)} run(s) to {version.workflow.name} "
                              f"v{version.number}.", messages.SUCCESS)
        for plan in plans:
            if not plan.movable:
                self.message_user(request, f"Run {plan.run} was not moved: "
                                  + "; ".join(r["message"] for r in plan.refusals), messages.ERROR)


_OUTCOME_TONES = {"pending": "attention", "started": "good", "refused": "bad"}


def _runs(count: int) -> str:
    return f"{count} run" if count == 1 else f"{count} runs"


class StepAttemptInline(ReadOnlyInline):
    model = StepAttempt
    fields = ["number", "worker", "started_at", "finished_at", "outcome", "error_class",
              "error_message", "tokens_in", "tokens_out", "cost_usd", "model", "idempotency_key",
              "model_id", "prompt_hash", "proposal_hash", "risk_tier", "repair_count", "routes"]
    show_change_link = False


@admin.register(StepRun)
class StepRunAdmin(HistoryListMixin, TeamScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    team_field = "run__team"

    list_display = ["name", "run", "kind", badge_column("state"), "attempts", "cost_usd", "started_at",
                    "finished_at"]
    list_filter = ["state", "kind"]
    list_select_related = ["run"]
    list_defer = ("input", "output", "error") + documents(Run, "run__")
    search_fields = ["name", "run__id"]
    # Newest first along the primary key: the model's own order (by its run's creation) sorts
    # the join of every step with its run.
    ordering = ["-id"]
    fields = readonly_fields = [
        "run", "name", "kind", "position", "state", "queue", "attempts", "lease_owner",
        "lease_expires_at", "deadline_at", "next_attempt_at", "ready_at", "queued_at",
        "started_at", "finished_at", "cost_usd", "tokens_in", "tokens_out", "skip_reason",
        "input", "output", "error",
    ]
    inlines = [StepAttemptInline]


@admin.register(Event)
class EventAdmin(HistoryListMixin, TeamScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    team_field = "run__team"

    list_display = ["created_at", "kind", "run", "step", "actor"]
    list_filter = [recent_values_filter("kind")]
    list_select_related = ["run", "step"]
    list_defer = ("payload",) + documents(Run, "run__") + documents(StepRun, "step__")
    search_fields = ["run__id", "kind", "actor"]
    ordering = ["-id"]
    fields = readonly_fields = ["created_at", "run", "step", "kind", "actor", "payload"]


@admin.register(Signal)
class SignalAdmin(TeamScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    """Signals sent to runs: consumed by a wait step, or buffered until one waits for them."""

    team_field = "run__team"

    list_display = ["created_at", "name", "run", badge_column("state"), "step", "sent_by", "key"]
    list_filter = ["state", "name"]
    list_select_related = ["run", "step"]
    search_fields = ["run__id", "name", "key"]
    fields = readonly_fields = ["created_at", "run", "name", "key", "state", "step", "sent_by",
                                "origin", "consumed_at", "payload"]


@admin.register(StepResult)
class StepResultAdmin(TeamScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    """Steps' outputs kept for reuse (docs/operations.md#reusing-results): each team's own."""

    team_field = "team"

    list_display = ["created_at", "expires_at", "key", "run", "step", "fingerprint"]
    list_select_related = ["run", "step"]
    search_fields = ["fingerprint", "key", "run__id"]
    fields = readonly_fields = ["team", "fingerprint", "key", "run", "step", "created_at",
                                "expires_at", "output"]


@admin.register(WorkerHeartbeat)
class WorkerHeartbeatAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["hostname", "queues", "pid", "last_seen"]
    fields = readonly_fields = ["hostname", "queues", "pid", "last_seen"]


@admin.register(DeadLetter)
class DeadLetterAdmin(HistoryListMixin, TeamScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    """Dead-lettered work. "Redrive selected" calls the same service as the API."""

    team_field = "run__team"

    list_display = ["id", "run", "step", "error_class", "attempts", badge_column("status"), "created_at",
                    "redriven_by"]
    list_filter = ["status", recent_values_filter("error_class"), "created_at"]
    search_fields = ["run__id", "step__name", "trace_id", "error_message"]
    ordering = ["-created_at", "-id"]  # `dead_letter_created_id`
    list_defer = documents(Run, "run__") + documents(StepRun, "step__")
    readonly_fields = ["run", "step", "error_class", "error_message", "attempts", "payload_ref",
                       "trace_id", "status", "created_at", "redriven_at", "redriven_by"]
    actions = ["redrive"]

    def get_queryset(self, request) -> QuerySet[DeadLetter]:
        return super().get_queryset(request).select_related("run", "step", "redriven_by")

    def has_redrive_permission(self, request) -> bool:
        return teams_where(request.user, Action.DEAD_LETTER_REDRIVE).exists()

    @admin.action(description="Redrive selected dead letters", permissions=["redrive"])
    def redrive(self, request, queryset: QuerySet[DeadLetter]) -> None:
        done = 0
        for letter_id in queryset.values_list("id", flat=True):
            try:
                dead_letter_redrive(dead_letter_id=letter_id, actor=request.user)
                done += 1
            except (NotAllowed, Forbidden) as exc:
                self.message_user(request, f"dead letter {letter_id}: {exc}", messages.ERROR)
        if done:
            self.message_user(request, f"Redrove {done} dead letter(s).", messages.SUCCESS)


@admin.register(Effect)
class EffectAdmin(TeamScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    """The idempotency ledger of side effects: one row per logical action."""

    team_field = "run__team"

    list_display = ["key", "tool", "action", badge_column("status"), "attempts", "started_at", "finished_at"]
    list_filter = ["status", "action", "tool"]
    search_fields = ["key"]
