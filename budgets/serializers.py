"""The shapes budgets take in the API (responses and request bodies); no logic."""
from rest_framework import serializers

from orchestrator.engine.definitions.limits import MAX_RUN_DURATION_S

from .selectors import GROUPS


class CostRowSerializer(serializers.Serializer):
    group = serializers.CharField(help_text="The day (YYYY-MM-DD), workflow name, model, team "
                                            "slug or run id; \"-\" for calls with no model recorded.")
    cost_usd = serializers.DecimalField(max_digits=14, decimal_places=6)
    tokens_in = serializers.IntegerField(min_value=0)
    tokens_out = serializers.IntegerField(min_value=0)
    calls = serializers.IntegerField(min_value=0, help_text="Attempts and map item attempts.")


class CostReportSerializer(serializers.Serializer):
    group_by = serializers.ChoiceField(choices=GROUPS)
    from_date = serializers.DateField(help_text="First day covered (inclusive).")
    to_date = serializers.DateField(help_text="Last day covered (inclusive).")
    team = serializers.CharField(allow_null=True, help_text="The team asked for, or null: all yours.")
    total_usd = serializers.DecimalField(max_digits=14, decimal_places=6,
                                         help_text="What every group of the range cost, listed or not.")
    groups = serializers.IntegerField(help_text="How many groups the range has; grouped by run, "
                                                "rows lists the costliest `limit` of them.")
    rows = CostRowSerializer(many=True)


# --- a run's budget ---------------------------------------------------------------------------


class RunBudgetSerializer(serializers.Serializer):
    limit_usd = serializers.DecimalField(max_digits=14, decimal_places=6, allow_null=True,
                                         help_text="The run's cost limit (null: none).")
    spent_usd = serializers.DecimalField(max_digits=14, decimal_places=6)
    reserved_usd = serializers.DecimalField(max_digits=14, decimal_places=6,
                                            help_text="Held for model calls dispatched and not yet settled.")
    remaining_usd = serializers.DecimalField(max_digits=14, decimal_places=6, allow_null=True)
    overridden = serializers.BooleanField(help_text="An operator raised the limit.")


class StrictCharField(serializers.CharField):
    """A JSON string and nothing else (DRF's CharField also takes 0 or true as "0", "True")."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class BudgetRaiseSerializer(serializers.Serializer):
    # Any number in range (the override column holds 12 digits, 6 after the point): stored to
    # the micro-dollar.
    max_cost_usd = serializers.DecimalField(max_digits=None, decimal_places=None, min_value=0,
                                            max_value=999_999, coerce_to_string=False, required=False,
                                            help_text="The run's new cost limit.")
    max_duration_s = serializers.IntegerField(min_value=1, max_value=MAX_RUN_DURATION_S, required=False,
                                              help_text="The run's new wall-clock limit, in seconds "
                                                        "from its start.")
    # Not trimmed: a reason of only spaces reaches the service, which refuses it (409).
    reason = StrictCharField(min_length=1, max_length=500, trim_whitespace=False)

    def validate(self, attrs):
        if "max_cost_usd" not in attrs and "max_duration_s" not in attrs:
            raise serializers.ValidationError(
                {"max_cost_usd": "give max_cost_usd, max_duration_s or both"})
        return attrs


class StepEstimateSerializer(serializers.Serializer):
    step = serializers.CharField()
    calls = serializers.IntegerField(min_value=0, help_text="Model calls (a map: one per item).")
    cost_usd = serializers.DecimalField(max_digits=14, decimal_places=6)
    duration_s = serializers.FloatField(allow_null=True, help_text="Average of past runs; null: none yet.")


class RunEstimateSerializer(serializers.Serializer):
    cost_usd = serializers.DecimalField(max_digits=14, decimal_places=6,
                                        help_text="Projected cost of one attempt of every model step.")
    duration_s = serializers.FloatField(help_text="The longest chain of steps, from past runs' averages.")
    limit_usd = serializers.DecimalField(max_digits=14, decimal_places=6, allow_null=True)
    within_budget = serializers.BooleanField()
    steps = StepEstimateSerializer(many=True)


class BudgetLimitSerializer(serializers.Serializer):
    id = serializers.IntegerField(read_only=True)
    team = serializers.SlugField(source="team.slug", read_only=True)
    workflow = serializers.CharField(source="workflow.name", read_only=True, allow_null=True,
                                     help_text="null: the whole team's limit.")
    daily_usd = serializers.DecimalField(max_digits=12, decimal_places=6, allow_null=True, read_only=True)
    monthly_usd = serializers.DecimalField(max_digits=12, decimal_places=6, allow_null=True, read_only=True)
    max_concurrent_runs = serializers.IntegerField(allow_null=True, read_only=True)
    warn_at = serializers.DecimalField(max_digits=4, decimal_places=3, read_only=True)
    effective_from = serializers.DateTimeField(read_only=True)
    effective_to = serializers.DateTimeField(allow_null=True, read_only=True)
    created_by = serializers.CharField(source="created_by.username", read_only=True, allow_null=True)
    created_at = serializers.DateTimeField(read_only=True)


class BudgetLimitCreateSerializer(serializers.Serializer):
    team = serializers.SlugField(required=False, help_text="Needed when you belong to several teams.")
    workflow = serializers.CharField(required=False, allow_null=True, max_length=100,
                                     help_text="A workflow of the team; leave out for the team's own limit.")
    daily_usd = serializers.DecimalField(max_digits=12, decimal_places=6, min_value=0, required=False,
                                         allow_null=True)
    monthly_usd = serializers.DecimalField(max_digits=12, decimal_places=6, min_value=0, required=False,
                                           allow_null=True)
    max_concurrent_runs = serializers.IntegerField(min_value=0, max_value=1_000_000, required=False,
                                                   allow_null=True)
    warn_at = serializers.DecimalField(max_digits=4, decimal_places=3, min_value=0, max_value=1,
                                       required=False)
    effective_from = serializers.DateTimeField(required=False)
    effective_to = serializers.DateTimeField(required=False, allow_null=True)


class ModelPriceSerializer(serializers.Serializer):
    id = serializers.IntegerField(read_only=True)
    model = serializers.CharField(read_only=True)
    input_usd_per_mtok = serializers.DecimalField(max_digits=12, decimal_places=6, read_only=True)
    output_usd_per_mtok = serializers.DecimalField(max_digits=12, decimal_places=6, read_only=True)
    effective_from = serializers.DateTimeField(read_only=True,
                                               help_text="Calls made from then on are priced at it.")
    created_at = serializers.DateTimeField(read_only=True)


class ModelPriceCreateSerializer(serializers.Serializer):
    model = serializers.CharField(max_length=100, help_text="A model of the registry (STEPWISE_MODELS).")
    # Numbers in the schema (a decimal string's published pattern would also admit "").
    input_usd_per_mtok = serializers.DecimalField(max_digits=12, decimal_places=6, min_value=0,
                                                  coerce_to_string=False)
    output_usd_per_mtok = serializers.DecimalField(max_digits=12, decimal_places=6, min_value=0,
                                                   coerce_to_string=False)
    effective_from = serializers.DateTimeField(required=False, help_text="Default: now.")
