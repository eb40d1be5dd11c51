"""`/metrics`: the Prometheus scrape (orchestrator/operations/metrics.py,
docs/operations.md#metrics).

Protected: the metrics map the whole deployment — every team's runs, queues, approvals, model
tokens and costs, with no team label to filter by. A Prometheus server sends
`Authorization: Bearer <STEPWISE_METRICS_TOKEN>`; a person must be a superuser, signed in or with
their API token: a team's operator or owner would see the other teams' counts and costs. Anyone
else gets a 401 or 403 in the API's error shape.
"""
import hmac

from django.conf import settings
from django.http import HttpResponse, JsonResponse
from prometheus_client import CONTENT_TYPE_LATEST
from rest_framework.authentication import TokenAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed

from orchestrator.engine.limits import known_dependencies, saturation_of
from orchestrator.engine.quotas import quota_usage
from orchestrator.operations.metrics import dependency_families, metrics_text, quota_families

from .errors import error_body


def _bearer_ok(request) -> bool:
    token = settings.STEPWISE_METRICS_TOKEN
    sent = get_authorization_header(request).decode("latin-1")
    return bool(token) and hmac.compare_digest(sent, f"Bearer {token}")


def _person(request):
    try:
        found = TokenAuthentication().authenticate(request)
    except AuthenticationFailed:
        return None
    if found is not None:
        return found[0]
    return request.user if request.user.is_authenticated else None


def metrics_view(request):
    if request.method != "GET":
        return JsonResponse(error_body("method not allowed"), status=405)
    if not _bearer_ok(request):
        user = _person(request)
        if user is None:
            response = JsonResponse(error_body("authentication credentials were not provided"),
                                    status=401)
            response["WWW-Authenticate"] = "Bearer"
            return response
        if not (user.is_active and user.is_superuser):
            return JsonResponse(error_body(
                "metrics span every team: they are for superusers and the Prometheus token "
                "(docs/operations.md#metrics)"), status=403)
    return HttpResponse(metrics_text(_dependencies), content_type=CONTENT_TYPE_LATEST)


def _dependencies():
    return [*dependency_families(saturation_of(known_dependencies())),
            *quota_families(quota_usage())]
