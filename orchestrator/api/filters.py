"""django-filter FilterSets for the list endpoints (query parameters, nothing else)."""
import django_filters

from approvals.models import ApprovalRequest, ApprovalState

from ..models import DeadLetter, Run, RunState, Workflow


class WorkflowFilter(django_filters.FilterSet):
    team = django_filters.CharFilter(field_name="team__slug", help_text="A team slug.")

    class Meta:
        model = Workflow
        fields = ["team"]


class RunFilter(django_filters.FilterSet):
    workflow = django_filters.CharFilter(
        field_name="version__workflow__name", help_text="A workflow name."
    )
    team = django_filters.CharFilter(field_name="team__slug", help_text="A team slug.")
    state = django_filters.MultipleChoiceFilter(
        choices=RunState.choices, help_text="One or more run states (repeat the parameter)."
    )
    created_after = django_filters.IsoDateTimeFilter(
        field_name="created_at", lookup_expr="gte", help_text="ISO 8601, inclusive."
    )
    created_before = django_filters.IsoDateTimeFilter(
        field_name="created_at", lookup_expr="lt", help_text="ISO 8601, exclusive."
    )

    class Meta:
        model = Run
        fields = ["workflow", "team", "state", "created_after", "created_before"]


class ApprovalFilter(django_filters.FilterSet):
    state = django_filters.MultipleChoiceFilter(choices=ApprovalState.choices)
    run = django_filters.UUIDFilter(field_name="run_id")

    class Meta:
        model = ApprovalRequest
        fields = ["state", "run"]


class DeadLetterFilter(django_filters.FilterSet):
    status = django_filters.ChoiceFilter(choices=DeadLetter.Status.choices)
    run = django_filters.UUIDFilter(field_name="run_id")
    error_class = django_filters.CharFilter()

    class Meta:
        model = DeadLetter
        fields = ["status", "run", "error_class"]
