"""The reviewer's screens: the inbox (the request list) and the decision page (a request).

The inbox lists, by default, the pending requests waiting for one of the reviewer's groups,
oldest deadline first. The decision page shows what the action is and what it will do
(`approvals.review`), and its forms call the decision services — `approval_grant`,
`approval_reject`, `approval_edit`, `approval_revoke`, the same ones the API calls, which check
the reviewer's authority and the hash they saw, and audit a refusal. Nothing is decided here:
a refusal comes back as a form error, with nothing changed.

A person who is not a superuser sees the requests of their teams that wait (or waited) for one
of their groups, or that they acted on (`approvals.authority.requests_visible_to`).
"""
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Count, F, QuerySet
from django.http import Http404, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html
from django.utils.timesince import timesince, timeuntil

from orchestrator.engine.authz import visible
from orchestrator.engine.clock import now
from orchestrator.engine.errors import Forbidden, InputInvalid, NotAllowed, ServiceError
from orchestrator.engine.services.kinds.human_gate import (
    approval_edit,
    approval_grant,
    approval_reject,
    approval_revoke,
)
from orchestrator.engine.services.kinds.human_input import input_answer
from orchestrator.models import Run, StepRun, Workflow, WorkflowVersion
from orchestrator.web.admin_display import ReadOnlyAdminMixin, badge_column, money, state_badge
from orchestrator.web.admin_paging import HistoryListMixin, documents, recent_values_filter

from .actions import action_summary
from .authority import (
    input_inbox,
    input_tasks_visible_to,
    is_reviewer,
    may_answer,
    requests_visible_to,
)
from .forms import ABSTAIN, AnswerForm, DecisionForm, EditForm, RevokeForm
from .models import ApprovalDecision, ApprovalRequest, ApprovalState, InputState, InputTask
from .review import review_of

STATUS_OF = {Forbidden: 403, NotAllowed: 409, InputInvalid: 400}


class StateFilter(admin.SimpleListFilter):
    """Pending unless another state (or all) is chosen."""

    title = "state"
    parameter_name = "state"
    states = ApprovalState
    default = ApprovalState.PENDING

    def lookups(self, request, model_admin):
        return [*self.states.choices, ("all", "All")]

    def queryset(self, request, queryset):
        value = self.value() or self.default
        return queryset if value == "all" else queryset.filter(state=value)

    def choices(self, changelist):
        current = self.value() or self.default
        for value, label in self.lookup_choices:
            yield {"selected": current == value, "display": label,
                   "query_string": changelist.get_query_string({self.parameter_name: value})}


class AssignedFilter(admin.SimpleListFilter):
    """Waiting for one of my groups (the default, for a person in a group), or everything I
    may see."""

    title = "waiting for"
    parameter_name = "for"

    def __init__(self, request, params, model, model_admin):
        super().__init__(request, params, model, model_admin)
        self.default = "mine" if request.user.groups.exists() else "all"

    def lookups(self, request, model_admin):
        return [("mine", "My groups"), ("all", "Anyone I can see")]

    def queryset(self, request, queryset):
        if (self.value() or self.default) == "all":
            return queryset
        return queryset.filter(approvers__in=request.user.groups.values_list("name", flat=True))

    def choices(self, changelist):
        current = self.value() or self.default
        for value, label in self.lookup_choices:
            yield {"selected": current == value, "display": label,
                   "query_string": changelist.get_query_string({self.parameter_name: value})}


class TierFilter(admin.SimpleListFilter):
    title = "risk tier"
    parameter_name = "risk"

    def lookups(self, request, model_admin):
        return [(tier, tier) for tier in ("low", "medium", "high", "critical")]

    def queryset(self, request, queryset):
        return queryset.filter(risk_tier=self.value()) if self.value() else queryset


class WorkflowFilter(admin.SimpleListFilter):
    title = "workflow"
    parameter_name = "workflow"

    def lookups(self, request, model_admin):
        # The workflows of the teams the person sees, not the names behind every request ever
        # made (a join of every request with its run).
        names = (visible(Workflow.objects.all(), request.user)
                 .order_by().values_list("name", flat=True).distinct())
        return [(name, name) for name in sorted(set(names))]

    def queryset(self, request, queryset):
        return queryset.filter(run__version__workflow__name=self.value()) if self.value() else queryset


_UNREAD = object()


def tier_badge(tier: str) -> str:
    return format_html('<span class="tier-badge tier-{}">{}</span>', tier, tier)


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(HistoryListMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["summary", "workflow", "risk", "amount", "requester", "age", "deadline",
                    "progress", badge_column("state")]
    list_display_links = ["summary"]
    list_filter = [StateFilter, AssignedFilter, TierFilter, WorkflowFilter,
                   recent_values_filter("approvers")]
    list_select_related = ["run__version__workflow", "run__created_by", "step"]
    list_defer = (documents(Run, "run__") + documents(WorkflowVersion, "run__version__")
                  + documents(Workflow, "run__version__workflow__") + documents(StepRun, "step__"))
    search_fields = ["run__id", "step__name", "approvers", "instructions"]
    ordering = ["deadline_at", "id"]

    def get_ordering(self, request):
        # Requests waiting: the nearest deadline first (along `approval_state_deadline`);
        # decided ones, or all of them: the newest first (along `approval_requested_id`).
        if request.GET.get(StateFilter.parameter_name, StateFilter.default) == ApprovalState.PENDING:
            return self.ordering
        return ["-requested_at", "-id"]
    actions = None
    change_form_template = "admin/approvals/approvalrequest/decision.html"
    change_list_template = "admin/approvals/approvalrequest/change_list.html"

    # --- who sees what ----------------------------------------------------------------------

    def get_queryset(self, request) -> QuerySet[ApprovalRequest]:
        return requests_visible_to(request.user, super().get_queryset(request))

    def has_view_permission(self, request, obj=None) -> bool:
        user = request.user
        return user.is_active and (user.is_superuser or is_reviewer(user))

    def has_module_permission(self, request) -> bool:
        return self.has_view_permission(request)

    # --- the inbox's columns ----------------------------------------------------------------

    @admin.display(description="request")
    def summary(self, approval: ApprovalRequest) -> str:
        return format_html("<strong>{}</strong><br><span class='quiet'>step {} · for {}</span>",
                           action_summary(approval, limit=80), approval.step.name,
                           approval.approvers)

    @admin.display(description="workflow", ordering="run__version__workflow__name")
    def workflow(self, approval: ApprovalRequest) -> str:
        return approval.run.version.workflow.name

    @admin.display(description="risk", ordering="risk_tier")
    def risk(self, approval: ApprovalRequest) -> str:
        return tier_badge(approval.risk_tier)

    @admin.display(description="requester", ordering="run__created_by__username")
    def requester(self, approval: ApprovalRequest) -> str:
        user = approval.run.created_by
        return user.get_username() if user else approval.run.trigger

    @admin.display(description="age", ordering="requested_at")
    def age(self, approval: ApprovalRequest) -> str:
        return timesince(approval.requested_at, now())

    @admin.display(description="deadline", ordering="deadline_at")
    def deadline(self, approval: ApprovalRequest) -> str:
        at = approval.deadline_at
        if approval.state != ApprovalState.PENDING:
            text, tone = at.strftime("%Y-%m-%d %H:%M"), ""
        elif at < now():
            text, tone = f"overdue by {timesince(at, now())}", "overdue"
        else:
            text, tone = f"in {timeuntil(at, now())}", ""
        return format_html('<span class="{}" title="{} UTC">{}</span>', tone,
                           at.strftime("%Y-%m-%d %H:%M"), text)

    @admin.display(description="approvals")
    def progress(self, approval: ApprovalRequest) -> str:
        given = getattr(approval, "approvals_given", _UNREAD)
        if given is _UNREAD:  # a request the changelist did not count for
            given = (approval.decisions.filter(verdict="approve", proposal_hash=approval.proposal_hash)
                     .values("user").distinct().count())
        return f"{given} of {approval.approvals_required}"

    def changelist_view(self, request, extra_context=None):
        # The same inbox lists the input tasks waiting for this person's answer, above.
        tasks = (input_inbox(request.user)
                 .select_related("run__version__workflow", "step").order_by("deadline_at", "id"))
        response = super().changelist_view(request, {"title": "Approval inbox",
                                                     "input_tasks": list(tasks[:100]),
                                                     **(extra_context or {})})
        listed = getattr(response, "context_data", None) or {}
        if "cl" in listed:  # the page's approvals counted in one query, not one per row
            page = list(listed["cl"].result_list)
            given = dict(ApprovalDecision.objects
                         .filter(request__in=page, verdict="approve",
                                 proposal_hash=F("request__proposal_hash"))
                         .order_by().values("request").annotate(n=Count("user", distinct=True))
                         .values_list("request", "n"))
            for approval in page:
                approval.approvals_given = given.get(approval.pk, 0)
        return response

    # --- the decision page ------------------------------------------------------------------

    def change_view(self, request, object_id, form_url="", extra_context=None):
        approval = self.get_object(request, object_id)
        if approval is None:
            raise Http404("No such approval request, or not one of yours.")
        if not self.has_view_permission(request, approval):
            raise PermissionDenied
        review = review_of(approval, request.user)
        decision = DecisionForm(initial={"proposal_hash": approval.proposal_hash},
                                needs_confirmation=review.needs_confirmation)
        edit = EditForm(initial={"proposal_hash": approval.proposal_hash},
                        current=approval.action.get("params") or {}, editable=[r.name for r in review.editable])
        revoke = RevokeForm()
        status = 200
        if request.method == "POST":
            handled = self._post(request, approval, review)
            if isinstance(handled, HttpResponseRedirect):
                return handled
            status, form = handled
            decision = form if isinstance(form, DecisionForm) else decision
            edit = form if isinstance(form, EditForm) else edit
            revoke = form if isinstance(form, RevokeForm) else revoke
        context = {
            **self.admin_site.each_context(request),
            "title": review.summary, "subtitle": f"approval {approval.id}",
            "opts": self.model._meta, "original": approval, "review": review,
            "decision_form": decision, "edit_form": edit, "revoke_form": revoke,
            "state_badge": state_badge(approval.state), "tier_badge": tier_badge(approval.risk_tier),
            "inbox_url": reverse("admin:approvals_approvalrequest_changelist"),
            "run_cost": money(review.cost_usd),
            "run_budget": money(review.budget_usd) if review.budget_usd is not None else "",
            "has_view_permission": True,
        }
        return TemplateResponse(request, self.change_form_template, context, status=status)

    def _post(self, request, approval: ApprovalRequest, review):
        """Call the service the submitted form asks for: a redirect when it succeeded, else
        (HTTP status, the bound form carrying the refusal as its error)."""
        kind = request.POST.get("form", "decision")
        if kind == "edit":
            form = EditForm(request.POST, current=approval.action.get("params") or {},
                            editable=[row.name for row in review.editable])
        elif kind == "revoke":
            form = RevokeForm(request.POST)
        else:
            form = DecisionForm(request.POST, needs_confirmation=review.needs_confirmation)
        if not form.is_valid():
            return 400, form
        data = form.cleaned_data
        try:
            if isinstance(form, EditForm):
                changes = form.changes()
                if form.errors:
                    return 400, form
                if not changes:
                    form.add_error(None, "Nothing changed: edit a value first.")
                    return 400, form
                approval_edit(approval_id=approval.id, user=request.user,
                              proposal_hash=data["proposal_hash"], params=changes, note=data["note"])
                message = ("Saved your changes: the request now binds the new parameters, "
                           "and another approver must approve them.")
                target = request.path
            elif isinstance(form, RevokeForm):
                approval_revoke(approval_id=approval.id, user=request.user, note=data["note"])
                message, target = "Approval revoked: its action will not run.", request.path
            else:
                service = approval_grant if data["decision"] == "approve" else approval_reject
                decided = service(approval_id=approval.id, user=request.user,
                                  proposal_hash=data["proposal_hash"], note=data["note"])
                message = self._decided_message(decided, data["decision"])
                target = reverse("admin:approvals_approvalrequest_changelist")
        except ServiceError as exc:
            for problem in exc.problems:
                path = problem.get("path") or ""
                field = ("param_" + path.split(".")[1] if path.startswith("params.")
                         else path or None)
                visible_field = field in form.fields and not form.fields[field].widget.is_hidden
                form.add_error(field if visible_field else None, problem["message"])
            return next((code for cls, code in STATUS_OF.items() if isinstance(exc, cls)), 400), form
        self.message_user(request, message, messages.SUCCESS)
        return HttpResponseRedirect(target)

    @staticmethod
    def _decided_message(approval: ApprovalRequest, decision: str) -> str:
        what = action_summary(approval, limit=100)
        if decision == "reject":
            return f"Rejected: {what}. The run goes on under its on-error policy."
        if approval.state == ApprovalState.APPROVED:
            return f"Approved: {what}. The run goes on."
        given = (approval.decisions.filter(verdict="approve", proposal_hash=approval.proposal_hash)
                 .values("user").distinct().count())
        return (f"Your approval is recorded ({given} of {approval.approvals_required}); "
                "it waits for another approver.")


class InputStateFilter(StateFilter):
    """Open unless another state (or all) is chosen."""

    states = InputState
    default = InputState.OPEN


@admin.register(InputTask)
class InputTaskAdmin(HistoryListMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    """Input tasks of `human_input` steps: listed in the approvals inbox (and here, with their
    history), answered on their own page, whose form is drawn from the step's JSON Schema
    (`forms.AnswerForm`) and posts to `input_answer`, the service the API calls. A refusal
    (not yours to answer, stale, an answer the form rejects) comes back as a form error."""

    list_display = ["summary", "workflow", "asked_of", "deadline", badge_column("state")]
    list_display_links = ["summary"]
    list_filter = [InputStateFilter, "group"]
    list_select_related = ["run__version__workflow", "step", "answered_by"]
    search_fields = ["run__id", "step__name", "group", "assignee"]
    ordering = ["deadline_at", "id"]

    def get_ordering(self, request):
        # Requests waiting: the nearest deadline first (along `approval_state_deadline`);
        # decided ones, or all of them: the newest first (along `approval_requested_id`).
        if request.GET.get(StateFilter.parameter_name, StateFilter.default) == ApprovalState.PENDING:
            return self.ordering
        return ["-requested_at", "-id"]
    actions = None
    change_form_template = "admin/approvals/inputtask/answer.html"

    def get_queryset(self, request) -> QuerySet[InputTask]:
        return input_tasks_visible_to(request.user, super().get_queryset(request))

    def has_view_permission(self, request, obj=None) -> bool:
        user = request.user
        return user.is_active and (user.is_superuser or is_reviewer(user))

    def has_module_permission(self, request) -> bool:
        return self.has_view_permission(request)

    @admin.display(description="task")
    def summary(self, task: InputTask) -> str:
        return format_html("<strong>Input for {}</strong><br><span class='quiet'>run {}</span>",
                           task.step.name, str(task.run_id)[:8])

    @admin.display(description="workflow", ordering="run__version__workflow__name")
    def workflow(self, task: InputTask) -> str:
        return task.run.version.workflow.name

    @admin.display(description="asked of", ordering="group")
    def asked_of(self, task: InputTask) -> str:
        return task.assignee or task.group

    @admin.display(description="deadline", ordering="deadline_at")
    def deadline(self, task: InputTask) -> str:
        at = task.deadline_at
        if task.state != InputState.OPEN:
            text = at.strftime("%Y-%m-%d %H:%M")
        elif at < now():
            text = f"overdue by {timesince(at, now())}"
        else:
            text = f"in {timeuntil(at, now())}"
        return format_html('<span title="{} UTC">{}</span>', at.strftime("%Y-%m-%d %H:%M"), text)

    def changelist_view(self, request, extra_context=None):
        return super().changelist_view(request, {"title": "Input tasks", **(extra_context or {})})

    def change_view(self, request, object_id, form_url="", extra_context=None):
        task = self.get_object(request, object_id)
        if task is None:
            raise Http404("No such input task, or not one of yours.")
        form = AnswerForm(schema=task.form)
        status = 200
        if request.method == "POST":
            form = AnswerForm(request.POST, schema=task.form)
            abstain = request.POST.get("decision") == ABSTAIN
            if abstain or form.is_valid():
                note = request.POST.get("note", "") if abstain else form.cleaned_data["note"]
                try:
                    input_answer(task_id=task.id, user=request.user, abstain=abstain,
                                 answer=None if abstain else form.answer(), note=note)
                except ServiceError as exc:
                    form = AnswerForm(request.POST, schema=task.form)
                    form.is_valid()
                    for problem in exc.problems:
                        form.add_error(form.field_name(problem.get("path") or ""), problem["message"])
                    status = next((code for cls, code in STATUS_OF.items()
                                   if isinstance(exc, cls)), 400)
                else:
                    what = "You abstained" if abstain else "Your answer is recorded"
                    self.message_user(request, f"{what}: the run goes on.", messages.SUCCESS)
                    return HttpResponseRedirect(reverse("admin:approvals_approvalrequest_changelist"))
            else:
                status = 400
        task.refresh_from_db()
        context = {
            **self.admin_site.each_context(request),
            "title": f"Input for {task.step.name}", "subtitle": f"input task {task.id}",
            "opts": self.model._meta, "original": task, "task": task, "form": form,
            "answer_fields": [field for field in form if field.name != "note"],
            "may_answer": task.state == InputState.OPEN and may_answer(request.user, task),
            "overdue": task.state == InputState.OPEN and task.deadline_at < now(),
            "state_badge": state_badge(task.state), "workflow": task.run.version.workflow.name,
            "inbox_url": reverse("admin:approvals_approvalrequest_changelist"),
            "has_view_permission": True,
        }
        return TemplateResponse(request, self.change_form_template, context, status=status)
