"""Routes of the API, mounted at /api/v1/ under the `api` namespace."""
from django.urls import path, re_path
from drf_spectacular.views import (
    SpectacularAPIView,
    SpectacularSwaggerSplitView,
)
from rest_framework.routers import DefaultRouter

from budgets.api import BudgetLimitViewSet, CostsView, ModelPriceViewSet
from evaluation.api import DatasetViewSet, EvaluationViewSet, ReleasePolicyView
from triggers.api.views import EventDeadLetterViewSet, TriggerViewSet, webhook

from .docs import RedocView, redoc_bundle
from .forks import RunForkView
from .gate_policies import GatePolicyViewSet
from .health import DefinitionSchemaView, HealthDetailsView, HealthView, ReadinessView
from .ledger import (
    LedgerEntriesView,
    LedgerExportsView,
    LedgerExportView,
    LedgerManifestView,
    LedgerStatusView,
    LedgerVerificationsView,
    LedgerVerificationView,
    LedgerWholeExportFileView,
    LedgerWholeExportManifestView,
    LedgerWholeExportView,
)
from .moves import RunsMoveView
from .reruns import RerunStartView, RerunViewSet
from .templates import TemplateViewSet
from .tools import ToolViewSet
from .views import (
    ApprovalViewSet,
    DeadLetterViewSet,
    InputTaskViewSet,
    RunViewSet,
    WorkflowViewSet,
)

app_name = "api"

router = DefaultRouter()
router.register("workflows", WorkflowViewSet, basename="workflow")
router.register("runs", RunViewSet, basename="run")
router.register("approvals", ApprovalViewSet, basename="approval")
router.register("input-tasks", InputTaskViewSet, basename="inputtask")
router.register("dead-letters", DeadLetterViewSet, basename="deadletter")
router.register("triggers", TriggerViewSet, basename="trigger")
router.register("event-dead-letters", EventDeadLetterViewSet, basename="eventdeadletter")
router.register("tools", ToolViewSet, basename="tool")
router.register("budget-limits", BudgetLimitViewSet, basename="budgetlimit")
router.register("model-prices", ModelPriceViewSet, basename="modelprice")
router.register("templates", TemplateViewSet, basename="template")
router.register("gate-policies", GatePolicyViewSet, basename="gatepolicy")
router.register("datasets", DatasetViewSet, basename="dataset")
router.register("evaluations", EvaluationViewSet, basename="evaluation")
router.register("reruns", RerunViewSet, basename="rerun")

urlpatterns = [
    path("health/", HealthView.as_view(), name="health"),
    path("health/ready/", ReadinessView.as_view(), name="health-ready"),
    path("health/details/", HealthDetailsView.as_view(), name="health-details"),
    path("hooks/<uuid:trigger_id>/", webhook, name="trigger-webhook"),
    path("costs/", CostsView.as_view(), name="costs"),
    path("schema/definition.json", DefinitionSchemaView.as_view(), name="definition-schema"),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerSplitView.as_view(url_name="api:schema"), name="docs"),
    path("redoc/", RedocView.as_view(url_name="api:schema"), name="redoc"),
    path("redoc/redoc.standalone.js", redoc_bundle, name="redoc-bundle"),
    re_path(r"^workflows/(?P<name>[a-z][a-z0-9_-]*)/release-policy/$", ReleasePolicyView.as_view(),
            name="workflow-release-policy"),
    # Before the router's runs/<id>/, which would take "move" or "rerun" for a run's id.
    path("runs/move/", RunsMoveView.as_view(), name="runs-move"),
    path("runs/rerun/", RerunStartView.as_view(), name="runs-rerun"),
    path("runs/<uuid:pk>/fork/", RunForkView.as_view(), name="run-fork"),
    path("ledger/entries/", LedgerEntriesView.as_view(), name="ledger-entries"),
    path("ledger/entries/export/", LedgerExportView.as_view(), name="ledger-export"),
    path("ledger/entries/manifest/", LedgerManifestView.as_view(), name="ledger-export-manifest"),
    path("ledger/status/", LedgerStatusView.as_view(), name="ledger-status"),
    path("ledger/verifications/", LedgerVerificationsView.as_view(), name="ledger-verifications"),
    path("ledger/verifications/<int:pk>/", LedgerVerificationView.as_view(), name="ledger-verification"),
    path("ledger/exports/", LedgerExportsView.as_view(), name="ledger-exports"),
    path("ledger/exports/<int:pk>/", LedgerWholeExportView.as_view(), name="ledger-whole-export"),
    path("ledger/exports/<int:pk>/file/", LedgerWholeExportFileView.as_view(),
         name="ledger-whole-export-file"),
    path("ledger/exports/<int:pk>/manifest/", LedgerWholeExportManifestView.as_view(),
         name="ledger-whole-export-manifest"),
    *router.urls,
]
