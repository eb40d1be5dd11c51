"""The admin's paginator and filters for tables that grow with history: a count of at most
COUNT_CAP rows, and filter choices read from the newest rows rather than the whole table.

Django's changelist counts the filtered rows on every page (and, unless
`show_full_result_count = False`, the whole table too), a cost that grows with history. Here
the count reads at most COUNT_CAP + 1 rows (`SELECT COUNT(*) FROM (... LIMIT n)`): a list with
more shows COUNT_CAP + 1 results and pages up to them; filters and search narrow it further.
"""
from functools import cached_property

from django.contrib import admin
from django.core.paginator import Paginator
from django.db import models

COUNT_CAP = 10_000


class CappedCountPaginator(Paginator):
    @cached_property
    def count(self) -> int:
        rows = self.object_list
        if hasattr(rows, "count") and hasattr(rows, "query"):
            return rows[:COUNT_CAP + 1].count()
        return len(rows)


class HistoryListMixin:
    """For a ModelAdmin over a table that grows with history: no whole-table count, a capped
    filtered count. Its `ordering` should be one an index serves (read backwards for newest
    first) and its filters fixed choices or RecentValuesFilter, never Django's DISTINCT over a
    column or a date hierarchy (tests/perf/test_query_plans.py EXPLAINs them)."""

    paginator = CappedCountPaginator
    show_full_result_count = False
    # Columns the list never shows, of its rows or of the rows it joins (documents such as a
    # run's input or a version's definition): loaded, each would be parsed for every row shown.
    list_defer: tuple[str, ...] = ()

    def get_changelist(self, request, **kwargs):
        changelist = super().get_changelist(request, **kwargs)
        if not self.list_defer:
            return changelist
        defer = self.list_defer

        class Deferring(changelist):
            def get_queryset(self, request, exclude_parameters=None):
                return super().get_queryset(request, exclude_parameters).defer(*defer)

        return Deferring


def documents(model, path: str = "") -> tuple[str, ...]:
    """The JSON documents of `model`, reached through `path` (for `list_defer`)."""
    return tuple(f"{path}{field.name}" for field in model._meta.get_fields()
                 if isinstance(field, models.JSONField) and field.concrete)


# How many of the newest rows a filter's choices are read from (RecentValuesFilter).
RECENT_ROWS = 500


class RecentValuesFilter(admin.SimpleListFilter):
    """A filter on a column without fixed choices, offering the values found among the newest
    RECENT_ROWS rows (read along the primary key): Django's own for such a column reads
    DISTINCT over the whole table on every page. A value chosen from a link, or typed into the
    address, filters the whole table all the same."""

    field = ""
    newest = ("-pk",)  # an order an index serves (a UUID key is not in time order)

    def lookups(self, request, model_admin):
        rows = (model_admin.get_queryset(request).order_by(*self.newest)
                .values_list(self.field, flat=True)[:RECENT_ROWS])
        values = sorted({str(value) for value in rows if value not in (None, "")})
        if self.value() and self.value() not in values:
            values.append(self.value())  # the one in force stays shown and can be cleared
        return [(value, value) for value in values]

    def queryset(self, request, queryset):
        return queryset.filter(**{self.field: self.value()}) if self.value() else queryset


def recent_values_filter(field: str, title: str | None = None,
                         newest: tuple[str, ...] = ("-pk",)) -> type[RecentValuesFilter]:
    """A RecentValuesFilter on `field`, its parameter named after it as Django's is."""
    return type(f"Recent{field.title().replace('_', '')}Filter", (RecentValuesFilter,), {
        "field": field, "title": title or field.split("__")[-1].replace("_", " "),
        "parameter_name": f"{field}__exact", "newest": newest})
