"""Pagination of the list endpoints: `?limit=` and `?offset=`, checked, with sane maxima.

DRF's LimitOffsetPagination reads a value it cannot use as "not given": `offset=null`,
`offset=false` or `limit=abc` quietly returned the first page, and a limit of 10**25 reached
the database and gave a 500. Here a value that is not one whole number in range is a 400 in the
API's error shape, naming the parameter, and the published schema says the range. It must not
filter or order anything; the views and their FilterSets do.
"""
from rest_framework import pagination
from rest_framework.exceptions import ValidationError

from .errors import error_body

MAX_LIMIT = 500
MAX_OFFSET = 2**31 - 1


class LimitOffsetPagination(pagination.LimitOffsetPagination):
    max_limit = MAX_LIMIT
    limit_query_description = f"Number of results to return per page (1 to {MAX_LIMIT})."
    offset_query_description = "The initial index from which to return the results."

    def paginate_queryset(self, queryset, request, view=None):
        self.get_offset(request)  # a bad offset is refused before anything is counted
        return super().paginate_queryset(queryset, request, view)

    def get_limit(self, request) -> int:
        return self._whole(request, self.limit_query_param, 1, MAX_LIMIT, self.default_limit)

    def get_offset(self, request) -> int:
        return self._whole(request, self.offset_query_param, 0, MAX_OFFSET, 0)

    @staticmethod
    def _whole(request, name: str, low: int, high: int, default: int) -> int:
        """The parameter as an int in [low, high], `default` when absent; else a 400."""
        values = request.query_params.getlist(name)
        if not values:
            return default
        problem = f"{name} must be one whole number from {low} to {high}"
        if len(values) > 1:
            raise ValidationError(error_body(f"{problem}, given once", name))
        text = values[0]
        # ASCII digits only: int() would also take "+5", " 5", "5_000" and other scripts' digits.
        if not (text.isascii() and text.isdigit()):
            raise ValidationError(error_body(f"{problem}, not {text[:40]!r}", name))
        value = int(text) if len(text.lstrip("0")) <= len(str(high)) else None
        if value is None or not low <= value <= high:
            raise ValidationError(error_body(f"{problem}, not {text[:40]}", name))
        return value

    def get_schema_operation_parameters(self, view) -> list[dict]:
        limit, offset = super().get_schema_operation_parameters(view)
        limit["schema"] = {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT,
                           "default": self.default_limit}
        offset["schema"] = {"type": "integer", "minimum": 0, "maximum": MAX_OFFSET, "default": 0}
        return [limit, offset]
