"""Root URLconf: the admin at /admin/, the API at /api/v1/, Prometheus at /metrics; / goes to
the admin for now.

The error handlers answer in the API's error shape under /api/ (orchestrator/web/api/errors.py).
"""
from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

from .web.api.metrics import metrics_view

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", include("orchestrator.web.api.urls")),
    path("metrics", metrics_view, name="metrics"),  # Prometheus (docs/operations.md#metrics)
    path("sso/", include("orchestrator.web.sso.urls")),  # docs/operations.md#single-sign-on
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
]

handler400 = "orchestrator.web.api.errors.bad_request"
handler403 = "orchestrator.web.api.errors.permission_denied"
handler404 = "orchestrator.web.api.errors.not_found"
handler500 = "orchestrator.web.api.errors.server_error"
