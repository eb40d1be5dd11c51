"""Pagination of the list endpoints: keyset pages behind an opaque `?cursor=`, `?limit=` checked.

A page is read from where the previous one ended, by the list's own ordering (the view's
`order_by`, with the primary key added last so every position is unique), so its cost is that
of the page however many rows lie before it: no COUNT of the filtered set, no OFFSET scanning
past skipped rows. The answer is `{"next", "previous", "results"}`; `next` and `previous` are
links carrying a `cursor` (base64 of the position and direction: opaque to clients, which only
follow links). A cursor that does not decode, or names another ordering, is a 400 naming
`cursor`; `?offset=` is still read for clients written before cursors, but only `0` (the first
page) is served: any other offset is a 400 telling to follow `next`.

A list built in memory (the tool catalogue, cases filtered by tag) is paged by position behind
the same cursor. It must not filter or order anything; the views and their FilterSets do.
"""
import base64
import binascii
import json
from collections.abc import Sequence
from datetime import date, datetime, time
from decimal import Decimal
from uuid import UUID

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import F, Q, QuerySet
from rest_framework import pagination
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.utils.urls import remove_query_param, replace_query_param

from .errors import error_body

MAX_LIMIT = 500
MAX_OFFSET = 2**31 - 1
MAX_CURSOR_CHARS = 1000


class CursorInvalid(Exception):
    pass


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


def _plain(value):
    """A position value as JSON can carry it (to_python reads it back)."""
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, UUID | Decimal):
        return str(value)
    return value


def encode_cursor(payload: dict) -> str:
    text = json.dumps(payload, separators=(",", ":"), default=_plain)
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def decode_cursor(text: str) -> dict:
    if len(text) > MAX_CURSOR_CHARS or not text.isascii():
        raise CursorInvalid
    try:
        payload = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise CursorInvalid from None
    if not isinstance(payload, dict) or payload.get("d") not in ("n", "p"):
        raise CursorInvalid
    return payload


class Key:
    """One column of a list's ordering: its path, direction, model field and nullability."""

    def __init__(self, model, path: str, descending: bool):
        self.path, self.descending = path, descending
        field, current = None, model
        for part in path.split("__"):
            field = current._meta.pk if part == "pk" else current._meta.get_field(part)
            current = field.related_model if field.is_relation else current
        if field.is_relation:  # ordering by a foreign key orders by its column
            field = field.target_field
        self.field = field
        self.nullable = getattr(field, "null", False)

    def order(self, reverse: bool):
        """The ORDER BY term, NULLs taken as larger than any value on every database."""
        descending = self.descending != reverse
        expression = F(self.path)
        if descending:
            return expression.desc(nulls_first=True) if self.nullable else expression.desc()
        return expression.asc(nulls_last=True) if self.nullable else expression.asc()

    def value_of(self, row):
        value = row
        for part in self.path.split("__"):
            value = getattr(value, part)
            if value is None:
                return None
        return value.pk if hasattr(value, "_meta") else value

    def parse(self, raw):
        if raw is None:
            if not self.nullable:
                raise CursorInvalid
            return None
        if not isinstance(raw, str | int | float):
            raise CursorInvalid
        try:
            return self.field.to_python(raw)
        except (DjangoValidationError, TypeError, ValueError, OverflowError):
            raise CursorInvalid from None

    def after(self, value, reverse: bool) -> tuple[Q, Q | None]:
        """(rows strictly after `value` in this column, rows equal to it), in reading order."""
        larger = self.descending == reverse  # reading towards larger values
        column = self.path
        if value is None:  # NULL is the largest value
            equal = Q(**{f"{column}__isnull": True})
            return (Q(pk__in=[]) if larger else Q(**{f"{column}__isnull": False})), equal
        equal = Q(**{column: value})
        strictly = Q(**{f"{column}__{'gt' if larger else 'lt'}": value})
        if self.nullable and larger:
            strictly |= Q(**{f"{column}__isnull": True})
        return strictly, equal

    def bound(self, value, reverse: bool) -> Q | None:
        """A redundant range on this column that an index can start its scan at."""
        if value is None or self.nullable:
            return None
        larger = self.descending == reverse
        return Q(**{f"{self.path}__{'gte' if larger else 'lte'}": value})


def keys_of(queryset: QuerySet) -> list[Key]:
    """The queryset's ordering as keys, the primary key last (a unique position)."""
    model = queryset.model
    terms = list(queryset.query.order_by) or list(model._meta.ordering)
    keys = []
    for term in terms:
        if not isinstance(term, str):
            raise TypeError(f"keyset pagination needs field names in order_by, not {term!r}")
        path = term.lstrip("-")
        keys.append(Key(model, path, term.startswith("-")))
    pk = model._meta.pk
    if not keys or keys[-1].path not in ("pk", "id", pk.name):
        keys.append(Key(model, "pk", keys[-1].descending if keys else True))
    return keys


class KeysetPagination(pagination.BasePagination):
    """Keyset pages of a queryset (positions by `keys_of`), or positional pages of a list."""

    cursor_query_param = "cursor"
    limit_query_param = "limit"
    offset_query_param = "offset"
    default_limit = 50
    cursor_query_description = ("The page to read: the cursor from a `next` or `previous` link, "
                                "as given. Leave it out for the first (newest) page.")
    limit_query_description = f"Number of results to return per page (1 to {MAX_LIMIT})."

    def paginate_queryset(self, queryset, request, view=None):
        self.request = request
        self.base_url = remove_query_param(request.build_absolute_uri(), self.offset_query_param)
        self.limit = _whole(request, self.limit_query_param, 1, MAX_LIMIT, self.default_limit)
        if _whole(request, self.offset_query_param, 0, MAX_OFFSET, 0):
            raise ValidationError(error_body(
                "offset is no longer served (only 0, the first page): follow the `next` link, "
                "which carries a `cursor`", self.offset_query_param))
        cursor = self._cursor(request)
        if isinstance(queryset, QuerySet):
            return self._keyset(queryset, cursor)
        return self._positional(list(queryset), cursor)

    def _cursor(self, request) -> dict | None:
        values = request.query_params.getlist(self.cursor_query_param)
        if not values:
            return None
        if len(values) > 1:
            raise ValidationError(error_body("give cursor once", self.cursor_query_param))
        try:
            return decode_cursor(values[0])
        except CursorInvalid:
            raise self._bad_cursor() from None

    def _bad_cursor(self) -> ValidationError:
        return ValidationError(error_body(
            "cursor is not one this list gave: use the `next` or `previous` link as given, or "
            "leave cursor out for the first page", self.cursor_query_param))

    def _keyset(self, queryset: QuerySet, cursor: dict | None) -> list:
        keys = keys_of(queryset)
        backward = bool(cursor) and cursor["d"] == "p"
        if cursor is not None:
            raw = cursor.get("k")
            if not isinstance(raw, list) or len(raw) != len(keys):
                raise self._bad_cursor()
            try:
                values = [key.parse(value) for key, value in zip(keys, raw, strict=True)]
            except CursorInvalid:
                raise self._bad_cursor() from None
            inclusive = cursor.get("i", False)
            if not isinstance(inclusive, bool):
                raise self._bad_cursor()
            queryset = queryset.filter(self._after(keys, values, backward, inclusive))
        rows = list(queryset.order_by(*(key.order(backward) for key in keys))[:self.limit + 1])
        more = len(rows) > self.limit
        rows = rows[:self.limit]
        if backward:
            rows.reverse()
        position = lambda row: [key.value_of(row) for key in keys]  # noqa: E731
        first, last = (position(rows[0]), position(rows[-1])) if rows else (None, None)
        self.next_cursor = self.previous_cursor = None
        if rows and (more if not backward else True):
            self.next_cursor = {"d": "n", "k": last}
        if rows and (more if backward else cursor is not None):
            self.previous_cursor = {"d": "p", "k": first}
        if not rows and cursor is not None:  # past either end: back to the row it was read from
            other = {"d": "n" if backward else "p", "k": cursor["k"], "i": True}
            if backward:
                self.next_cursor = other
            else:
                self.previous_cursor = other
        return rows

    @staticmethod
    def _after(keys: Sequence[Key], values: Sequence, backward: bool, inclusive: bool) -> Q:
        """Rows after the position, in reading order: (k1 > v1) or (k1 = v1 and k2 > v2) ...,
        and the row at the position itself when `inclusive`."""
        condition, equal_so_far = Q(pk__in=[]), Q()
        for key, value in zip(keys, values, strict=True):
            strictly, equal = key.after(value, backward)
            condition |= equal_so_far & strictly
            equal_so_far &= equal
        if inclusive:
            condition |= equal_so_far
        bound = keys[0].bound(values[0], backward)
        return condition & bound if bound is not None else condition

    def _positional(self, rows: list, cursor: dict | None) -> list:
        start = 0
        if cursor is not None:
            start = cursor.get("o")
            if not isinstance(start, int) or isinstance(start, bool) or not 0 <= start <= MAX_OFFSET:
                raise self._bad_cursor()
            if cursor["d"] == "p":
                start = max(0, start - self.limit)
        page = rows[start:start + self.limit]
        self.next_cursor = ({"d": "n", "o": start + self.limit}
                            if start + self.limit < len(rows) else None)
        self.previous_cursor = {"d": "p", "o": start} if start > 0 else None
        return page

    def _link(self, cursor: dict | None) -> str | None:
        if cursor is None:
            return None
        return replace_query_param(self.base_url, self.cursor_query_param, encode_cursor(cursor))

    def get_next_link(self) -> str | None:
        return self._link(self.next_cursor)

    def get_previous_link(self) -> str | None:
        return self._link(self.previous_cursor)

    def get_paginated_response(self, data) -> Response:
        return Response({"next": self.get_next_link(), "previous": self.get_previous_link(),
                         "results": data})

    def get_paginated_response_schema(self, schema: dict) -> dict:
        link = {"type": "string", "nullable": True, "format": "uri"}
        return {
            "type": "object",
            "required": ["next", "previous", "results"],
            "properties": {
                "next": {**link, "description": "The following page, or null on the last."},
                "previous": {**link, "description": "The page before, or null on the first."},
                "results": schema,
            },
        }

    def get_schema_operation_parameters(self, view) -> list[dict]:
        return [
            {"name": self.cursor_query_param, "required": False, "in": "query",
             "description": self.cursor_query_description,
             "schema": {"type": "string", "maxLength": MAX_CURSOR_CHARS}},
            {"name": self.limit_query_param, "required": False, "in": "query",
             "description": self.limit_query_description,
             "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT,
                        "default": self.default_limit}},
        ]

