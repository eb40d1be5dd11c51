"""Datasets in the admin: the list of a person's teams' datasets, a dataset's page (its
versions, a version's cases, the upload and remove forms), creating one, and the "Add to a
dataset" page a finished run's page links to.

Entry points only: every change calls one service of `evaluation.services`, which checks the
person's permission; refusals and every problem with its path are shown on the page.
"""
import json

from django.contrib import admin, messages
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import Http404, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from orchestrator.engine.authz import Action, may, teams_where, visible
from orchestrator.engine.errors import Forbidden, InputInvalid, NotAllowed
from orchestrator.models import Run, Workflow
from orchestrator.web.admin_display import ReadOnlyAdminMixin, TeamScopedAdminMixin

from .forms import DatasetCreateForm, FromRunForm, RemoveForm, UploadForm
from .models import Dataset, RiskTier
from .selectors import datasets_visible_to, expected_from_run, latest_of
from .services import (
    dataset_case_from_run,
    dataset_cases_remove,
    dataset_cases_upload,
    dataset_create,
)
from .uploads import format_of

CASES_PER_PAGE = 50


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
        return self._page(request, "admin/evaluation/dataset.html", str(dataset), dataset=dataset,
                          versions=versions, shown=shown, page=page, tier=tier, tiers=RiskTier.values,
                          rows=[(case, _compact(case.input), _compact(case.expected)) for case in page],
                          may_edit=may_edit, upload_form=UploadForm(), remove_form=RemoveForm())

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
