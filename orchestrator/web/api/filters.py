"""django-filter FilterSets for the list endpoints (query parameters, nothing else).

Every FilterSet here refuses what django-filter would quietly ignore (`QueryForm`): a typed
parameter given empty (`?run=` listed every run's approvals, as if no filter were given) and a
single-valued parameter given more than once (the last one won). Either is a 400 naming it.
"""
from datetime import UTC, datetime

import django_filters
from django import forms

from approvals.authority import input_inbox
from approvals.models import ApprovalRequest, ApprovalState, InputState, InputTask
from orchestrator.models import DeadLetter, Run, RunState, Team, Workflow


class QueryForm(forms.Form):
    """The form behind a FilterSet, reading the raw query string too."""

    def clean(self):
        for name, field in self.fields.items():
            if isinstance(field, forms.MultipleChoiceField):
                continue  # repeatable, and it refuses an empty value itself
            values = self.data.getlist(name) if hasattr(self.data, "getlist") else []
            if len(values) > 1:
                self.add_error(name, f"give {name} once, not {len(values)} times")
            elif values == [""] and type(field) is not forms.CharField:  # text may be empty
                self.add_error(name, f"{name} must not be empty; leave it out to not filter")
        return super().clean()


class UtcDateTimeFilter(django_filters.IsoDateTimeFilter):
    """An ISO 8601 time, compared in UTC: ISO 8601 (and Python) allow UTC offsets that
    PostgreSQL refuses (beyond 15:59), and a time at the edge of the calendar may have no UTC
    equivalent - it is then the calendar's edge, which compares the same."""

    def filter(self, qs, value):
        if value is not None and value.tzinfo is not None:
            try:
                value = value.astimezone(UTC)
            except OverflowError:
                value = (datetime.min if value.year < 2 else datetime.max).replace(tzinfo=UTC)
        return super().filter(qs, value)


class FilterSet(django_filters.FilterSet):
    class Meta:
        form = QueryForm


class WorkflowFilter(FilterSet):
    team = django_filters.CharFilter(field_name="team__slug", help_text="A team slug.")

    class Meta(FilterSet.Meta):
        model = Workflow
        fields = ["team"]


class RunFilter(FilterSet):
    workflow = django_filters.CharFilter(
        field_name="version__workflow__name", help_text="A workflow name."
    )
    team = django_filters.CharFilter(method="of_team", help_text="A team slug.")
    # distinct=False: a column of the run itself repeats no row, and DISTINCT would sort every
    # matching run before the page could be read.
    state = django_filters.MultipleChoiceFilter(
        choices=RunState.choices, distinct=False,
        help_text="One or more run states (repeat the parameter).",
    )
    created_after = UtcDateTimeFilter(
        field_name="created_at", lookup_expr="gte", help_text="ISO 8601, inclusive."
    )
    created_before = UtcDateTimeFilter(
        field_name="created_at", lookup_expr="lt", help_text="ISO 8601, exclusive."
    )
    forked_from = django_filters.UUIDFilter(
        field_name="forked_from_id", help_text="The forks of this run (a run id).")

    def of_team(self, queryset, name, value):
        """By the team's id, read first: a join to the team would hide from the planner how
        many runs match, and it could then scan every run rather than the team's index."""
        return queryset.filter(team_id__in=list(Team.objects.filter(slug=value)
                                                .values_list("id", flat=True)))

    class Meta(FilterSet.Meta):
        model = Run
        fields = ["workflow", "team", "state", "created_after", "created_before", "forked_from"]


class ApprovalFilter(FilterSet):
    state = django_filters.MultipleChoiceFilter(choices=ApprovalState.choices, distinct=False)
    run = django_filters.UUIDFilter(field_name="run_id")

    class Meta(FilterSet.Meta):
        model = ApprovalRequest
        fields = ["state", "run"]


class InputTaskFilter(FilterSet):
    state = django_filters.MultipleChoiceFilter(choices=InputState.choices, distinct=False)
    run = django_filters.UUIDFilter(field_name="run_id")
    # `?for=me`: `for` is a Python keyword, so the filter is named through the class namespace.
    locals()["for"] = django_filters.ChoiceFilter(
        choices=[("me", "me")], method="waiting_for_me",
        label="`me`: only the open tasks waiting for your answer (yours, or your groups').")

    def waiting_for_me(self, queryset, name, value):
        return queryset.filter(id__in=input_inbox(self.request.user).values("id"))

    class Meta(FilterSet.Meta):
        model = InputTask
        fields = ["state", "run"]


class DeadLetterFilter(FilterSet):
    status = django_filters.ChoiceFilter(choices=DeadLetter.Status.choices)
    run = django_filters.UUIDFilter(field_name="run_id")
    error_class = django_filters.CharFilter()

    class Meta(FilterSet.Meta):
        model = DeadLetter
        fields = ["status", "run", "error_class"]
