"""`/metrics`: the Prometheus scrape (orchestrator/metrics.py, docs/operations.md#metrics).

Protected: the metrics map the deployment (queues, models, teams' alert counts). A Prometheus
server sends `Authorization: Bearer <STEPWISE_METRICS_TOKEN>`; a person needs to be an operator
(the same rule as the health details), signed in or with their API token. Anyone else gets a
401 or 403 in the API's error shape.
"""
import hmac

from django.conf import settings
from django.http import HttpResponse, JsonResponse
from prometheus_client import CONTENT_TYPE_LATEST
from rest_framework.authentication import TokenAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed

from ..health import user_may_see_health
from ..metrics import metrics_text
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
        if not user_may_see_health(user):
            return JsonResponse(error_body("metrics are for operators (docs/permissions.md)"),
                                status=403)
    return HttpResponse(metrics_text(), content_type=CONTENT_TYPE_LATEST)
