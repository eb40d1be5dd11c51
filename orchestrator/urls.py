"""Root URLconf: the admin at /admin/, the API at /api/v1/; / goes to the admin for now."""
from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", include("orchestrator.api.urls")),
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
]
