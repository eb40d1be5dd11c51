"""How exceptions become HTTP error responses, all in one shape.

Every error body under /api/ is `{"errors": [{"path", "message"}, ...]}`, listing every
problem at once, whatever raised it:

* the services' exceptions, mapped by `ServiceErrorsMixin`: DefinitionInvalid and InputInvalid
  -> 400, Forbidden -> 403, IdempotencyConflict and NotAllowed -> 409, BudgetExceeded -> 429
  (with Retry-After);
* DRF's own (401 not authenticated, 403, 404, 405, 406, 415, a body or a query parameter that
  does not parse), through `exception_handler` (settings `REST_FRAMEWORK["EXCEPTION_HANDLER"]`);
* Django's, for a URL no view matches and for an unhandled error (`not_found`, `server_error`:
  the root URLconf's handlers), so even a 404 outside every route and a 500 are JSON there.

It must not decide anything; the services do.
"""
from django.http import JsonResponse
from django.views import defaults
from rest_framework import status
from rest_framework.exceptions import APIException, NotAuthenticated, ParseError, ValidationError
from rest_framework.response import Response

from orchestrator.engine.definitions import DefinitionInvalid, Problem
from orchestrator.engine.errors import (
    BudgetExceeded,
    Forbidden,
    IdempotencyConflict,
    InputInvalid,
    NotAllowed,
    ServiceError,
)

from .authentication import HOW

_STATUS = {
    InputInvalid: status.HTTP_400_BAD_REQUEST,
    Forbidden: status.HTTP_403_FORBIDDEN,
    IdempotencyConflict: status.HTTP_409_CONFLICT,
    NotAllowed: status.HTTP_409_CONFLICT,
    BudgetExceeded: status.HTTP_429_TOO_MANY_REQUESTS,
}


def problems_body(problems) -> dict:
    """`{"errors": [...]}` from Problem values or {"path", "message"} dicts."""
    return {
        "errors": [
            {"path": p.path, "message": p.message} if isinstance(p, Problem) else dict(p)
            for p in problems
        ]
    }


def error_body(message: str, path: str = "") -> dict:
    return {"errors": [{"path": path, "message": message}]}


class DefinitionParseError(ParseError):
    """A body that could not be read as a definition, in the `errors` shape."""

    def __init__(self, problems):
        super().__init__(detail=problems_body(problems))


class ServiceErrorsMixin:
    """Turn the services' exceptions into 400/403/409 responses with an `errors` list."""

    def handle_exception(self, exc):
        if isinstance(exc, DefinitionInvalid):
            return Response(problems_body(exc.problems), status=status.HTTP_400_BAD_REQUEST)
        if isinstance(exc, ServiceError):
            code = next((c for cls, c in _STATUS.items() if isinstance(exc, cls)),
                        status.HTTP_400_BAD_REQUEST)
            retry_after = getattr(exc, "retry_after_s", None)
            return Response(problems_body(exc.problems), status=code,
                            headers={"Retry-After": str(retry_after)} if retry_after else None)
        return super().handle_exception(exc)


def flatten_serializer_errors(errors, prefix: str = "") -> list[dict]:
    """DRF's nested `{field: [messages]}` as a flat list of {"path", "message"}."""
    if isinstance(errors, dict):
        found = []
        for key, value in errors.items():
            if key in ("non_field_errors", "detail"):
                found += flatten_serializer_errors(value, prefix)
            else:
                found += flatten_serializer_errors(value, f"{prefix}.{key}" if prefix else str(key))
        return found
    if isinstance(errors, list):
        found = []
        for index, value in enumerate(errors):
            if isinstance(value, dict | list):
                found += flatten_serializer_errors(value, f"{prefix}[{index}]")
            else:
                found.append({"path": prefix, "message": str(value)})
        return found
    return [{"path": prefix, "message": str(errors)}]


def valid_data(serializer) -> dict:
    """The serializer's validated data, or a 400 in the `errors` shape."""
    if not serializer.is_valid():
        raise ValidationError({"errors": flatten_serializer_errors(serializer.errors)})
    return serializer.validated_data


def errors_of(exc: APIException) -> list[dict]:
    """The `errors` list of a 4xx raised while reading a request, whatever its detail shape."""
    return _errors_in(exc.detail)


def _errors_in(detail) -> list[dict]:
    if isinstance(detail, dict) and isinstance(detail.get("errors"), list):
        return [{k: str(v) for k, v in e.items()} for e in detail["errors"]]
    return flatten_serializer_errors(detail)


def exception_handler(exc, context):
    """DRF's exception handler with the body in the one error shape.

    DRF's handler does the rest as before: it maps Http404 and PermissionDenied, sets the
    headers (WWW-Authenticate on a 401, Allow on a 405, Retry-After) and rolls back an atomic
    request. An exception it does not know stays unhandled: a 500, answered by `server_error`.
    """
    # Imported here: DRF's views module reads the parser settings as it loads, and a parser of
    # ours imports this module.
    from rest_framework.views import exception_handler as drf_exception_handler

    response = drf_exception_handler(exc, context)
    if response is not None:
        response.data = {"errors": _errors_in(response.data)}
        if isinstance(exc, NotAuthenticated):  # say how, not only that nothing came
            response.data = error_body(f"{exc.detail}: {HOW}, or sign in.")
    return response


def _is_api(request) -> bool:
    return request.path.startswith("/api/")


def not_found(request, exception=None):
    """404 for a URL no route matches: JSON under /api/, Django's page elsewhere."""
    if _is_api(request):
        return JsonResponse(error_body("not found"), status=status.HTTP_404_NOT_FOUND)
    return defaults.page_not_found(request, exception)


def server_error(request):
    """500: JSON under /api/ (the details are in the server's log, never in the answer)."""
    if _is_api(request):
        return JsonResponse(error_body("internal server error"),
                            status=status.HTTP_500_INTERNAL_SERVER_ERROR)
    return defaults.server_error(request)


def bad_request(request, exception=None):
    """400 Django raised before any view (e.g. a body over DATA_UPLOAD_MAX_MEMORY_SIZE)."""
    if _is_api(request):
        return JsonResponse(error_body("bad request"), status=status.HTTP_400_BAD_REQUEST)
    return defaults.bad_request(request, exception)


def permission_denied(request, exception=None):
    """403 Django raised outside DRF's own checks."""
    if _is_api(request):
        return JsonResponse(error_body("permission denied"), status=status.HTTP_403_FORBIDDEN)
    return defaults.permission_denied(request, exception)
