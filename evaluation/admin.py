"""Evaluation in the admin.

- Datasets: the list of a person's teams' datasets, a dataset's page (its versions, a version's
  cases, the upload and remove forms, its evaluations and "Evaluate a version"), creating one,
  and the "Add to a dataset" page a finished run's page links to.
- Evaluations: the list, an evaluation's page (progress, every metric per tier with its 95%
  interval, the release gate, its cases, Cancel) and the comparison of two of the same dataset
  version.
- Release policies: the list, and a workflow's policy page (read by its team, edited by owners),
  which the workflow's own page shows through `release_policy_panel`
  (settings.STEPWISE_WORKFLOW_ADMIN_PANELS: the engine's admin imports nothing of this app).

Entry points only: every change calls one service (`evaluation.services`, `.evaluations`,
`.gate`), which checks the person's permission; refusals and every problem with its path are
shown on the page.
"""
import json

from django.contrib import admin, messages
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import Http404, HttpResponseNotAllowed, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from orchestrator.engine.authz import Action, may, teams_where, visible
from orchestrator.engine.errors import Forbidden, InputInvalid, NotAllowed
from orchestrator.models import Run, Workflow
from orchestrator.web.admin_display import (
    ReadOnlyAdminMixin,
    TeamScopedAdminMixin,
    money,
    state_badge,
)

from . import display
from .evaluations import evaluation_cancel, evaluation_start
from .forms import (
    DatasetCreateForm,
    EvaluateForm,
    FromRunForm,
    ReleasePolicyForm,
    RemoveForm,
    UploadForm,
)
from .gate import release_policy_set, release_problems
from .models import CaseRunState, Dataset, Evaluation, ReleasePolicy, RiskTier
from .selectors import (
    cases_by_state,
    cases_of,
    comparable_with,
    comparison,
    datasets_visible_to,
    evaluations_visible_to,
    expected_from_run,
    latest_of,
    pass_rate,
    release_policy_of,
    results_of,
)
from .services import (
    dataset_case_from_run,
    dataset_cases_remove,
    dataset_cases_upload,
    dataset_create,
)
from .uploads import format_of

CASES_PER_PAGE = 50
EVALUATIONS_SHOWN = 20


def _compact(value) -> str:
    """A case's JSON on as few lines as the column allows: a table of cases stays readable."""
    return format_html('<code class="case-json">{}</code>', json.dumps(value, ensure_ascii=False))


@admin.register(Dataset)
class DatasetAdmin(TeamScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["name", "workflow_name", "team", "latest_number", "cases", "by_tier", "created_at"]
    list_filter = ["team", "workflow__name"]
    list_select_related = ["team", "workflow"]
    search_fields = ["name", "workflow__name", "description"]

    def get_urls(self):
        view = self.admin_site.admin_view
        return [
            path("from-run/<uuid:run_id>/", view(self.from_run_view), name="evaluation_dataset_from_run"),
            path("<int:dataset_id>/upload/", view(self.upload_view), name="evaluation_dataset_upload"),
            path("<int:dataset_id>/remove/", view(self.remove_view), name="evaluation_dataset_remove"),
            path("<int:dataset_id>/evaluate/", view(self.evaluate_view), name="evaluation_dataset_evaluate"),
            *super().get_urls(),
        ]

    # --- the list ---------------------------------------------------------------------------

    def get_queryset(self, request) -> QuerySet[Dataset]:
        return datasets_visible_to(request.user)

    def _latest(self, dataset: Dataset):
        return latest_of(dataset)

    @admin.display(description="workflow", ordering="workflow__name")
    def workflow_name(self, dataset: Dataset) -> str:
        return dataset.workflow.name

    @admin.display(description="version")
    def latest_number(self, dataset: Dataset) -> int:
        return self._latest(dataset).number

    @admin.display(description="cases")
    def cases(self, dataset: Dataset) -> int:
        return self._latest(dataset).case_count

    @admin.display(description="low / medium / high")
    def by_tier(self, dataset: Dataset) -> str:
        counts = self._latest(dataset).tier_counts
        return " / ".join(str(counts.get(tier, 0)) for tier in RiskTier.values)

    # --- creating one -----------------------------------------------------------------------

    def has_add_permission(self, request, obj=None) -> bool:
        return teams_where(request.user, Action.DATASET_EDIT).exists()

    def add_view(self, request, form_url="", extra_context=None):
        if not self.has_add_permission(request):
            raise Http404
        workflows = Workflow.objects.filter(team__in=teams_where(request.user, Action.DATASET_EDIT)
                                            ).select_related("team").order_by("name", "team__slug")
        form = DatasetCreateForm(request.POST or None, workflows=workflows)
        problems = []
        if request.method == "POST" and form.is_valid():
            try:
                dataset = dataset_create(actor=request.user, **form.cleaned_data)
            except (InputInvalid, Forbidden) as exc:
                problems = exc.problems
            else:
                self.message_user(request, f"Dataset {dataset} created.", messages.SUCCESS)
                return HttpResponseRedirect(reverse("admin:evaluation_dataset_change", args=[dataset.id]))
        return self._page(request, "admin/evaluation/dataset_add.html", "Add a dataset",
                          form=form, problems=problems)

    # --- a dataset's page -------------------------------------------------------------------

    def change_view(self, request, object_id, form_url="", extra_context=None):
        dataset = self._dataset(request, object_id)
        versions = list(dataset.versions.select_related("created_by", "workflow_version").order_by("-number"))
        number = request.GET.get("version", "")
        shown = next((v for v in versions if str(v.number) == number), versions[0])
        cases = shown.cases.select_related("source_run").order_by("key")
        tier = request.GET.get("risk_tier", "")
        if tier in RiskTier.values:
            cases = cases.filter(risk_tier=tier)
        page = Paginator(cases, CASES_PER_PAGE).get_page(request.GET.get("page"))
        may_edit = may(request.user, Action.DATASET_EDIT, team=dataset.team)
        may_evaluate = may(request.user, Action.EVALUATION_RUN, team=dataset.team)
        evaluations = evaluations_visible_to(request.user).filter(dataset_version__dataset=dataset).order_by(
            "-created_at", "-id")[:EVALUATIONS_SHOWN]
        return self._page(request, "admin/evaluation/dataset.html", str(dataset), dataset=dataset,
                          versions=versions, shown=shown, page=page, tier=tier, tiers=RiskTier.values,
                          rows=[(case, _compact(case.input), _compact(case.expected)) for case in page],
                          may_edit=may_edit, upload_form=UploadForm(), remove_form=RemoveForm(),
                          evaluations=[_evaluation_row(e) for e in evaluations], may_evaluate=may_evaluate,
                          evaluate_form=_evaluate_form(dataset, versions) if may_evaluate else None)

    def evaluate_view(self, request, dataset_id: int):
        """Evaluate a version: `evaluation_start` checks evaluation.run and the values; the
        evaluation's page follows, or the form again with every problem by path."""
        dataset = self._dataset(request, dataset_id)
        versions = list(dataset.versions.order_by("-number"))
        form = _evaluate_form(dataset, versions, request.POST or None)
        problems = []
        if request.method == "POST" and form.is_valid():
            try:
                evaluation = evaluation_start(dataset=dataset, actor=request.user, **form.cleaned_data)
            except (InputInvalid, Forbidden) as exc:
                problems = exc.problems
            else:
                self.message_user(request, f"Evaluation {evaluation.id} started: version "
                                  f"{evaluation.version.number} over {evaluation.dataset_version.case_count} cases.",
                                  messages.SUCCESS)
                return HttpResponseRedirect(reverse("admin:evaluation_evaluation_change", args=[evaluation.id]))
        return self._page(request, "admin/evaluation/evaluate.html", f"Evaluate {dataset.workflow.name}",
                          dataset=dataset, form=form, problems=problems)

    def upload_view(self, request, dataset_id: int):
        dataset = self._dataset(request, dataset_id)
        form = UploadForm(request.POST or None, request.FILES or None)
        if request.method == "POST" and form.is_valid():
            values = dict(form.cleaned_data)
            upload = values.pop("file")
            fmt = format_of(upload.content_type or "", upload.name or "")
            try:
                if fmt is None:
                    raise InputInvalid("not a file of cases", [{"path": "file", "message":
                                       "send a .jsonl or .csv file (JSON lines or CSV)"}])
                version = dataset_cases_upload(dataset=dataset, data=upload.read(), fmt=fmt, actor=request.user,
                                               **values)
            except (InputInvalid, Forbidden) as exc:
                return self._page(request, "admin/evaluation/dataset_upload.html", f"Upload to {dataset}",
                                  dataset=dataset, form=form, problems=exc.problems)
            self.message_user(request, f"Version {version.number}: {version.case_count} cases.", messages.SUCCESS)
            return HttpResponseRedirect(reverse("admin:evaluation_dataset_change", args=[dataset.id]))
        return self._page(request, "admin/evaluation/dataset_upload.html", f"Upload to {dataset}",
                          dataset=dataset, form=form, problems=[])

    def remove_view(self, request, dataset_id: int):
        dataset = self._dataset(request, dataset_id)
        form = RemoveForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            try:
                version = dataset_cases_remove(dataset=dataset, actor=request.user, **form.cleaned_data)
            except (InputInvalid, Forbidden) as exc:
                for problem in exc.problems:
                    self.message_user(request, f"{problem['path']}: {problem['message']}", messages.ERROR)
            else:
                self.message_user(request, f"Version {version.number}: {version.case_count} cases.",
                                  messages.SUCCESS)
        return HttpResponseRedirect(reverse("admin:evaluation_dataset_change", args=[dataset.id]))

    # --- a finished run, added as a case -----------------------------------------------------

    def from_run_view(self, request, run_id):
        run = get_object_or_404(visible(Run.objects.select_related("version__workflow", "team"), request.user),
                                pk=run_id)
        datasets = datasets_visible_to(request.user).filter(workflow=run.version.workflow_id).order_by("name")
        initial = {"expected": json.dumps(expected_from_run(run), indent=2, ensure_ascii=False),
                   "dataset": datasets.first()}
        form = FromRunForm(request.POST or None, initial=initial, datasets=datasets)
        problems = []
        if request.method == "POST" and form.is_valid():
            values = dict(form.cleaned_data)
            try:
                version = dataset_case_from_run(run=run, actor=request.user, key=values.pop("key") or None, **values)
            except (InputInvalid, Forbidden, NotAllowed) as exc:
                problems = exc.problems
            else:
                self.message_user(request, f"Run added to {version.dataset}: version {version.number}, "
                                  f"{version.case_count} cases.", messages.SUCCESS)
                return HttpResponseRedirect(reverse("admin:evaluation_dataset_change", args=[version.dataset_id]))
        return self._page(request, "admin/evaluation/dataset_from_run.html", "Add a run to a dataset",
                          run=run, form=form, problems=problems, datasets=datasets,
                          run_link=format_html('<a href="{}">{}</a>', reverse("admin:orchestrator_run_change",
                                                                             args=[run.id]), run.id))

    # --- shared -----------------------------------------------------------------------------

    def _dataset(self, request, dataset_id) -> Dataset:
        found = self.get_queryset(request).filter(pk=dataset_id).first() if str(dataset_id).isdigit() else None
        if found is None:
            raise Http404("dataset not found")
        return found

    def _page(self, request, template: str, title: str, **context) -> TemplateResponse:
        return TemplateResponse(request, template, {**self.admin_site.each_context(request), "title": title,
                                                    "opts": self.model._meta, **context})


# --- evaluations ---------------------------------------------------------------------------------


def _evaluate_form(dataset: Dataset, versions: list, data=None) -> EvaluateForm:
    """The form offering the workflow's versions (the latest first, the published one said so)
    and the dataset's versions that have cases (the latest first)."""
    workflow = dataset.workflow
    numbers = workflow.versions.order_by("-number").values_list("number", flat=True)
    published = workflow.active_version.number if workflow.active_version_id else None
    choices = [(n, f"v{n}" + (" (published)" if n == published else "")) for n in numbers]
    cases = [(v.number, f"v{v.number} ({v.case_count} cases)") for v in versions if v.case_count]
    return EvaluateForm(data, versions=choices, dataset_versions=cases,
                        initial={"version": choices[0][0] if choices else None,
                                 "dataset_version": cases[0][0] if cases else None})


def cases_text(evaluation: Evaluation) -> str:
    """What its cases are: a dataset version, or in shadow the live runs of the published version."""
    if evaluation.dataset_version is None:
        return f"shadow of v{evaluation.baseline.number}'s live runs" if evaluation.baseline else "shadow"
    return f"{evaluation.dataset_version.dataset.name} v{evaluation.dataset_version.number}"


def _evaluation_row(evaluation: Evaluation) -> dict:
    rate = pass_rate(evaluation)
    return {"evaluation": evaluation, "state": state_badge(evaluation.state), "cases_of": cases_text(evaluation),
            "progress": f"{evaluation.case_scored} / {evaluation.case_total}",
            "pass_rate": "–" if rate is None else f"{rate * 100:.1f}%",
            "cost": f"{money(evaluation.cost_usd)} / {money(evaluation.budget_usd)}"}


@admin.register(Evaluation)
class EvaluationAdmin(TeamScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["name", "workflow_name", "version_number", "dataset_at", "state_column", "progress",
                    "pass_rate_column", "cost", "created_at"]
    list_display_links = ["name"]
    list_filter = ["state", "team", "workflow__name"]
    search_fields = ["workflow__name", "dataset_version__dataset__name", "note"]

    def get_urls(self):
        view = self.admin_site.admin_view
        return [
            path("compare/", view(self.compare_view), name="evaluation_evaluation_compare"),
            path("<int:evaluation_id>/cancel/", view(self.cancel_view), name="evaluation_evaluation_cancel"),
            *super().get_urls(),
        ]

    def get_queryset(self, request) -> QuerySet[Evaluation]:
        return evaluations_visible_to(request.user)

    @admin.display(description="evaluation", ordering="id")
    def name(self, evaluation: Evaluation) -> str:
        return f"{evaluation.id} · {evaluation.note}" if evaluation.note else str(evaluation.id)

    @admin.display(description="workflow", ordering="workflow__name")
    def workflow_name(self, evaluation: Evaluation) -> str:
        return evaluation.workflow.name

    @admin.display(description="version", ordering="version__number")
    def version_number(self, evaluation: Evaluation) -> str:
        return f"v{evaluation.version.number}"

    @admin.display(description="cases of")
    def dataset_at(self, evaluation: Evaluation) -> str:
        return cases_text(evaluation)

    @admin.display(description="state", ordering="state")
    def state_column(self, evaluation: Evaluation) -> str:
        return state_badge(evaluation.state)

    @admin.display(description="cases scored")
    def progress(self, evaluation: Evaluation) -> str:
        return f"{evaluation.case_scored} / {evaluation.case_total}"

    @admin.display(description="pass rate")
    def pass_rate_column(self, evaluation: Evaluation) -> str:
        rate = pass_rate(evaluation)
        return "–" if rate is None else f"{rate * 100:.1f}%"

    @admin.display(description="cost / budget")
    def cost(self, evaluation: Evaluation) -> str:
        return f"{money(evaluation.cost_usd)} / {money(evaluation.budget_usd)}"

    # --- an evaluation's page -------------------------------------------------------------------

    def change_view(self, request, object_id, form_url="", extra_context=None):
        evaluation = self._evaluation(request, object_id)
        counts = cases_by_state(evaluation)
        total = sum(counts.values()) or 1
        passed, scored = evaluation.case_passed, counts[CaseRunState.SCORED]
        segments = [("passed", passed), ("failed", scored - passed), ("running", counts[CaseRunState.RUNNING]),
                    ("pending", counts[CaseRunState.PENDING]), ("not run", counts[CaseRunState.NOT_RUN])]
        cases = cases_of(evaluation)
        tier, outcome = request.GET.get("risk_tier", ""), request.GET.get("outcome", "")
        if tier in RiskTier.values:
            cases = cases.filter(risk_tier=tier)
        if outcome == "failed":
            cases = cases.filter(state=CaseRunState.SCORED, passed=False)
        elif outcome == "passed":
            cases = cases.filter(passed=True)
        elif outcome in CaseRunState.values:
            cases = cases.filter(state=outcome)
        page = Paginator(cases, CASES_PER_PAGE).get_page(request.GET.get("page"))
        policy = release_policy_of(evaluation.workflow)
        return self._page(
            request, "admin/evaluation/evaluation.html", str(evaluation), evaluation=evaluation,
            state=state_badge(evaluation.state), segments=[(name, n, n * 100 / total) for name, n in segments],
            scored=scored, total=sum(counts.values()), row=_evaluation_row(evaluation),
            table=display.tier_table(results_of(evaluation)), policy=policy,
            gate=release_problems(workflow=evaluation.workflow, version=evaluation.version) if policy else None,
            page=page, tier=tier, outcome=outcome, tiers=RiskTier.values,
            rows=[(case, display.failing(case.scores)) for case in page],
            may_cancel=not evaluation.is_finished and may(request.user, Action.EVALUATION_RUN, team=evaluation.team),
            others=list(comparable_with(evaluation, request.user)[:EVALUATIONS_SHOWN]))

    def cancel_view(self, request, evaluation_id: int):
        evaluation = self._evaluation(request, evaluation_id)
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        try:
            evaluation_cancel(evaluation_id=evaluation.id, actor=request.user,
                              reason=request.POST.get("reason", "")[:500])
        except (Forbidden, NotAllowed) as exc:
            self.message_user(request, str(exc), messages.ERROR)
        else:
            self.message_user(request, f"Evaluation {evaluation.id} cancelled.", messages.SUCCESS)
        return HttpResponseRedirect(reverse("admin:evaluation_evaluation_change", args=[evaluation.id]))

    # --- two evaluations compared ---------------------------------------------------------------

    def compare_view(self, request):
        new = self._evaluation(request, request.GET.get("new", ""))
        others = list(comparable_with(new, request.user)[:EVALUATIONS_SHOWN])
        base_id = request.GET.get("base", "")
        base = self._evaluation(request, base_id) if base_id else (others[0] if others else None)
        problems = []
        if base is not None and (base.dataset_version_id is None or base.dataset_version_id != new.dataset_version_id):
            problems = [{"path": "base", "message": f"evaluation {base.id} ran another dataset version: compare "
                         "evaluations of the same dataset version"}]
            base = None
        result = comparison(base, new) if base is not None else None
        return self._page(
            request, "admin/evaluation/compare.html", f"Compare evaluation {new.id}", new=new, base=base,
            others=others, problems=problems, rows={"base": base and _evaluation_row(base), "new": _evaluation_row(new)},
            blocks=display.side_by_side(results_of(base), results_of(new), result["tiers"]) if result else [],
            changed=[{**c, "label": display.label(c.get("metric", "")),
                      "before": display.change_text(c.get("metric", ""), c.get("base")),
                      "after": display.change_text(c.get("metric", ""), c.get("new"))}
                     for c in (result or {}).get("changed", [])],
            only_in_base=(result or {}).get("only_in_base", []), only_in_new=(result or {}).get("only_in_new", []))

    # --- shared -----------------------------------------------------------------------------------

    def _evaluation(self, request, evaluation_id) -> Evaluation:
        found = self.get_queryset(request).filter(pk=evaluation_id).first() if str(evaluation_id).isdigit() else None
        if found is None:
            raise Http404("evaluation not found")
        return found

    def _page(self, request, template: str, title: str, **context) -> TemplateResponse:
        return TemplateResponse(request, template, {**self.admin_site.each_context(request), "title": title,
                                                    "opts": self.model._meta, **context})


# --- release policies ----------------------------------------------------------------------------


@admin.register(ReleasePolicy)
class ReleasePolicyAdmin(TeamScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    """Release policies are set on a workflow's policy page, through `release_policy_set`."""

    team_field = "workflow__team"
    list_display = ["workflow_name", "team", "dataset", "updated_by", "updated_at"]
    list_select_related = ["workflow__team", "dataset", "updated_by"]

    def get_urls(self):
        return [path("workflow/<int:workflow_id>/", self.admin_site.admin_view(self.workflow_view),
                     name="evaluation_releasepolicy_workflow"), *super().get_urls()]

    @admin.display(description="workflow", ordering="workflow__name")
    def workflow_name(self, policy: ReleasePolicy) -> str:
        return format_html('<a href="{}">{}</a>', reverse("admin:evaluation_releasepolicy_workflow",
                                                           args=[policy.workflow_id]), policy.workflow.name)

    @admin.display(description="team")
    def team(self, policy: ReleasePolicy) -> str:
        return policy.workflow.team.slug

    def change_view(self, request, object_id, form_url="", extra_context=None):
        policy = self.get_queryset(request).filter(pk=object_id).first() if str(object_id).isdigit() else None
        if policy is None:
            raise Http404("release policy not found")
        return HttpResponseRedirect(reverse("admin:evaluation_releasepolicy_workflow", args=[policy.workflow_id]))

    def workflow_view(self, request, workflow_id: int):
        """A workflow's release policy: shown to its team, set or removed by an owner through
        `release_policy_set`, which checks workflow.policy and the thresholds (each problem by path)."""
        workflow = visible(Workflow.objects.select_related("team", "active_version"), request.user).filter(
            pk=workflow_id).first()
        if workflow is None:
            raise Http404("no such workflow, or not one of your teams'")
        policy = release_policy_of(workflow)
        datasets = datasets_visible_to(request.user).filter(workflow=workflow).order_by("name")
        initial = {"dataset": policy.dataset if policy else None,
                   "thresholds": json.dumps(policy.thresholds, indent=2, ensure_ascii=False) if policy else ""}
        form = ReleasePolicyForm(request.POST or None, initial=initial, datasets=datasets)
        problems, status = [], 200
        if request.method == "POST" and form.is_valid():
            try:
                release_policy_set(workflow=workflow, dataset=form.cleaned_data["dataset"],
                                   thresholds=form.cleaned_data["thresholds"], actor=request.user)
            except (InputInvalid, Forbidden) as exc:
                problems, status = exc.problems, 403 if isinstance(exc, Forbidden) else 400
            else:
                done = "set" if form.cleaned_data["dataset"] else "removed"
                self.message_user(request, f"The release policy of {workflow.name} was {done}.", messages.SUCCESS)
                return HttpResponseRedirect(reverse("admin:evaluation_releasepolicy_workflow", args=[workflow.id]))
        elif request.method == "POST":
            status = 400
        context = {**self.admin_site.each_context(request), "title": f"Release policy of {workflow.name}",
                   "opts": self.model._meta, "workflow": workflow, "form": form, "problems": problems,
                   "may_edit": may(request.user, Action.WORKFLOW_POLICY, team=workflow.team),
                   **_policy_context(workflow, policy)}
        return TemplateResponse(request, "admin/evaluation/release_policy.html", context, status=status)


def _policy_context(workflow: Workflow, policy: ReleasePolicy | None) -> dict:
    """What a page shows of a release policy: its thresholds as rows, and what the gate finds
    against the latest version and the published one."""
    if policy is None:
        return {"policy": None}
    latest = workflow.versions.order_by("-number").first()
    checked = [v for v in dict.fromkeys([latest, workflow.active_version]) if v is not None]
    return {"policy": policy, "threshold_rows": display.threshold_rows(policy.thresholds),
            "checks": [{"version": v, "published": v.id == workflow.active_version_id,
                        "problems": release_problems(workflow=workflow, version=v)} for v in checked]}


def release_policy_panel(request, workflow: Workflow) -> str:
    """The release policy box of a workflow's admin page (settings.STEPWISE_WORKFLOW_ADMIN_PANELS)."""
    policy = release_policy_of(workflow)
    return render_to_string("admin/evaluation/_release_policy_panel.html", {
        "workflow": workflow, "may_edit": may(request.user, Action.WORKFLOW_POLICY, team=workflow.team),
        "evaluations": [_evaluation_row(e) for e in evaluations_visible_to(request.user).filter(
            workflow=workflow).order_by("-created_at", "-id")[:5]],
        **_policy_context(workflow, policy)}, request=request)
