"""How service exceptions become HTTP responses.

Every error body has one shape, `{"errors": [{"path", "message"}, ...]}`, listing every
problem at once. Views let service exceptions propagate; `ServiceErrorsMixin` maps them:
DefinitionInvalid and InputInvalid -> 400, Forbidden -> 403, IdempotencyConflict and
NotAllowed -> 409.
It must not decide anything; the services do.
"""
from rest_framework import status
from rest_framework.exceptions import APIException, ParseError, ValidationError
from rest_framework.response import Response

from ..definitions import DefinitionInvalid, Problem
from ..errors import Forbidden, IdempotencyConflict, InputInvalid, NotAllowed, ServiceError

_STATUS = {
    InputInvalid: status.HTTP_400_BAD_REQUEST,
    Forbidden: status.HTTP_403_FORBIDDEN,
    IdempotencyConflict: status.HTTP_409_CONFLICT,
    NotAllowed: status.HTTP_409_CONFLICT,
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
            return Response(problems_body(exc.problems), status=code)
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
    detail = exc.detail
    if isinstance(detail, dict) and "errors" in detail:
        return [{k: str(v) for k, v in e.items()} for e in detail["errors"]]
    return flatten_serializer_errors(detail)
