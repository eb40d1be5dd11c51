"""The API's ReDoc page, with nothing asked of another host.

ReDoc's bundle (from drf-spectacular-sidecar) shows Redocly's logo in its footer, fetched from
Redocly's CDN. The bundle is served here with that one address pointed at a blank image among
our static files, so the page makes no request beyond this server (and needs no exception in a
Content-Security-Policy).
"""
from functools import lru_cache
from pathlib import Path

import drf_spectacular_sidecar
from django.http import HttpResponse
from django.templatetags.static import static
from django.urls import reverse
from django.views.decorators.http import require_GET
from drf_spectacular.views import SpectacularRedocView

BUNDLE = Path(drf_spectacular_sidecar.__file__).parent / "static/drf_spectacular_sidecar/redoc/bundles/redoc.standalone.js"
CDN_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"


@lru_cache(maxsize=1)
def _bundle(logo: str) -> bytes:
    return BUNDLE.read_bytes().replace(CDN_LOGO.encode(), logo.encode())


@require_GET
def redoc_bundle(request) -> HttpResponse:
    response = HttpResponse(_bundle(static("stepwise/blank.svg")),
                            content_type="application/javascript; charset=utf-8")
    response["Cache-Control"] = "public, max-age=3600"
    return response


class RedocView(SpectacularRedocView):
    @staticmethod
    def _redoc_standalone() -> str:
        return reverse("api:redoc-bundle")
