"""Budgets in the API: where the money went (`/api/v1/costs/`), team and workflow limits
(`/api/v1/budget-limits/`), model prices (`/api/v1/model-prices/`), a run's spent / reserved /
remaining, raising a run's limit, and a run's estimate before it starts.

Entry points only: they parse, call one service or selector, and serialize. Mounted by
`orchestrator/web/api/urls.py` (costs) and `orchestrator/web/api/views.py` (the run and workflow
actions).
"""
from datetime import timedelta

from django import forms
from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_view,
)
from rest_framework import mixins, status, viewsets
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from orchestrator.engine.authz import visible
from orchestrator.engine.clock import now
from orchestrator.web.api.errors import (
    ServiceErrorsMixin,
    error_body,
    flatten_serializer_errors,
    valid_data,
)
from orchestrator.web.api.filters import QueryForm
from orchestrator.web.api.parsers import JSONBodyParser
from orchestrator.web.api.permissions import team_and_workflow_for_write
from orchestrator.web.api.serializers import ErrorsSerializer

from .models import BudgetLimit, ModelPrice
from .selectors import GROUPS, cost_report
from .serializers import (
    BudgetLimitCreateSerializer,
    BudgetLimitSerializer,
    CostReportSerializer,
    ModelPriceCreateSerializer,
    ModelPriceSerializer,
)
from .services import budget_limit_create, model_price_create

# The longest range one report covers: a year and a day (a leap year).
MAX_RANGE_DAYS = 366
DEFAULT_RANGE_DAYS = 30
# Grouped by run, a report has a row per run of its range; it lists the costliest of them.
DEFAULT_RUN_ROWS = 100
MAX_RUN_ROWS = 1000


class CostQueryForm(QueryForm):
    """The report's query; QueryForm refuses a parameter given twice or given empty."""

    group_by = forms.ChoiceField(choices=[(g, g) for g in GROUPS], required=False)
    to = forms.DateField(required=False, input_formats=["%Y-%m-%d"])
    team = forms.SlugField(required=False, max_length=50)
    limit = forms.IntegerField(required=False, min_value=1, max_value=MAX_RUN_ROWS)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["from"] = forms.DateField(required=False, input_formats=["%Y-%m-%d"])  # a keyword

    def clean(self):
        cleaned = super().clean()
        since, until = cleaned.get("from"), cleaned.get("to")
        if since and until and since > until:
            self.add_error("from", "from must not be after to")
        elif since and until and (until - since).days >= MAX_RANGE_DAYS:
            self.add_error("to", f"a report covers at most {MAX_RANGE_DAYS} days")
        if cleaned.get("limit") is not None and cleaned.get("group_by") != "run":
            self.add_error("limit", "limit applies to group_by=run only: every other grouping lists all its groups")
        return cleaned


class CostsView(ServiceErrorsMixin, APIView):
    """What model calls cost, grouped, over the teams you may see."""

    @extend_schema(
        operation_id="costs_retrieve",
        parameters=[
            OpenApiParameter("group_by", str, enum=list(GROUPS), default="day",
                             description="How to group: per day, workflow, model, team or run."),
            OpenApiParameter("from", OpenApiTypes.DATE, description=(
                f"First day (YYYY-MM-DD, inclusive); default {DEFAULT_RANGE_DAYS - 1} days before `to`.")),
            OpenApiParameter("to", OpenApiTypes.DATE, description="Last day (inclusive); default today. "
                             f"At most {MAX_RANGE_DAYS} days after `from`."),
            OpenApiParameter("team", {"type": "string", "pattern": r"^[-a-zA-Z0-9_]+$", "maxLength": 50},
                             description="One team's slug (default: every team of yours)."),
            OpenApiParameter("limit", {"type": "integer", "minimum": 1, "maximum": MAX_RUN_ROWS},
                             description=f"With group_by=run, how many runs to list, costliest first "
                                         f"(default {DEFAULT_RUN_ROWS}). Other groupings list every group."),
        ],
        responses={200: CostReportSerializer,
                   400: OpenApiResponse(ErrorsSerializer, description="A parameter is not valid.")},
        description="Cost and tokens of model calls (attempts and map items), by the day they "
                    "finished, grouped. Largest first; by day, in date order.",
    )
    def get(self, request):
        form = CostQueryForm(request.query_params)
        if not form.is_valid():
            raise ValidationError({"errors": flatten_serializer_errors(dict(form.errors))})
        values = form.cleaned_data
        until = values.get("to") or now().date()
        since = values.get("from") or until - timedelta(days=DEFAULT_RANGE_DAYS - 1)
        if since > until:  # only `from` given, after today
            raise ValidationError({"errors": [{"path": "from", "message": "from must not be after to"}]})
        group_by = values.get("group_by") or "day"
        team = values.get("team") or None
        rows = cost_report(user=request.user, group_by=group_by, since=since, until=until, team=team)
        listed = rows[:values.get("limit") or DEFAULT_RUN_ROWS] if group_by == "run" else rows
        body = {"group_by": group_by, "from_date": since, "to_date": until, "team": team,
                "total_usd": sum((r.cost_usd for r in rows), start=0), "groups": len(rows),
                "rows": [r.__dict__ for r in listed]}
        return Response(CostReportSerializer(body).data)


# --- limits -----------------------------------------------------------------------------------


@extend_schema_view(list=extend_schema(description="The budget limits of your teams, newest first "
                                                   "(each in force from its effective_from)."))
class BudgetLimitViewSet(ServiceErrorsMixin, mixins.ListModelMixin, viewsets.GenericViewSet):
    """A team's and its workflows' limits: effective-dated records, added, never edited."""

    serializer_class = BudgetLimitSerializer
    parser_classes = [JSONBodyParser]

    def get_queryset(self):
        rows = BudgetLimit.objects.select_related("team", "workflow", "created_by")
        return visible(rows, self.request.user).order_by("-effective_from", "-id")

    @extend_schema(request=BudgetLimitCreateSerializer,
                   responses={201: BudgetLimitSerializer, 400: ErrorsSerializer, 403: ErrorsSerializer},
                   description="Record a limit from effective_from (now) on. Owners (budget.manage); "
                               "audited. docs/budgets.md.")
    def create(self, request):
        body = dict(valid_data(BudgetLimitCreateSerializer(data=request.data)))
        team, workflow = team_and_workflow_for_write(request.user, body)
        try:
            row = budget_limit_create(team=team, workflow=workflow, actor=request.user, **body)
        except DjangoValidationError as exc:
            raise _invalid(exc) from exc
        return Response(BudgetLimitSerializer(row).data, status=status.HTTP_201_CREATED)


def _invalid(exc: DjangoValidationError) -> ValidationError:
    """A model's validation errors in the one error shape (a 400)."""
    return ValidationError({"errors": [{"path": "" if field == "__all__" else field, "message": message}
                                       for field, messages in exc.message_dict.items()
                                       for message in messages]})


# --- prices -----------------------------------------------------------------------------------


class PriceQueryForm(QueryForm):
    model = forms.CharField(required=False, max_length=100)


@extend_schema_view(list=extend_schema(
    parameters=[OpenApiParameter("model", str, description="One model's prices only.")],
    description="Model prices, per model newest first; each applies to calls made from its "
                "effective_from until the next one's. Without one, the registry's price applies."))
class ModelPriceViewSet(ServiceErrorsMixin, mixins.ListModelMixin, viewsets.GenericViewSet):
    """What a model's tokens cost: effective-dated records, added, never edited, so a new price
    never rewrites what a past call cost."""

    serializer_class = ModelPriceSerializer
    parser_classes = [JSONBodyParser]

    def get_queryset(self):
        form = PriceQueryForm(self.request.query_params)
        if not form.is_valid():
            raise ValidationError({"errors": flatten_serializer_errors(dict(form.errors))})
        rows = ModelPrice.objects.order_by("model", "-effective_from", "-id")
        if model := form.cleaned_data.get("model"):
            rows = rows.filter(model=model)
        return rows

    @extend_schema(request=ModelPriceCreateSerializer,
                   responses={201: ModelPriceSerializer, 400: ErrorsSerializer, 403: ErrorsSerializer},
                   description="Record a model's price from effective_from (now) on. Superusers "
                               "only (a price applies to every team); audited. docs/budgets.md.")
    def create(self, request):
        body = valid_data(ModelPriceCreateSerializer(data=request.data))
        try:
            row = model_price_create(actor=request.user, **body)
        except ValueError as exc:
            raise ValidationError(error_body(str(exc), "model")) from exc
        except DjangoValidationError as exc:
            raise _invalid(exc) from exc
        return Response(ModelPriceSerializer(row).data, status=status.HTTP_201_CREATED)
