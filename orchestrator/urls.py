"""Root URLconf: the admin at /admin/, the API at /api/v1/, Prometheus at /metrics; / goes to
the admin for now.

The error handlers answer in the API's error shape under /api/ (orchestrator/api/errors.py).
"""
from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

from .api.metrics import metrics_view

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", include("orchestrator.api.urls")),
    path("metrics", metrics_view, name="metrics"),  # Prometheus (docs/operations.md#metrics)
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
]

handler400 = "orchestrator.api.errors.bad_request"
handler403 = "orchestrator.api.errors.permission_denied"
handler404 = "orchestrator.api.errors.not_found"
handler500 = "orchestrator.api.errors.server_error"
