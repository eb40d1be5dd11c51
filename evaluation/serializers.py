"""The shapes datasets, evaluations and release policies take in the API (responses and request
bodies); no logic. What a case, an evaluation or a policy must be is checked by the services,
which report every problem with its path."""
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from orchestrator.engine.definitions.format import WORKFLOW_NAME_PATTERN

from .evaluations import DEFAULT_CONCURRENCY, MAX_CONCURRENCY
from .expected import SCHEMA as EXPECTED_SCHEMA
from .limits import MAX_CASES_PER_CHANGE, MAX_CASES_PER_VERSION
from .models import (
    Case,
    CaseRunState,
    Dataset,
    DatasetVersion,
    Evaluation,
    EvaluationCase,
    EvaluationState,
    Purpose,
    ReleasePolicy,
    RiskTier,
)
from .policy import POLICY_SCHEMA
from .selectors import cases_by_state, latest_of, pass_rate
from .services import MODES

MAX_ID = 2**31 - 1


class DatasetVersionSerializer(serializers.ModelSerializer):
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    workflow_version = serializers.SlugRelatedField(
        slug_field="number", read_only=True,
        help_text="The workflow version the cases added by this change were checked against.")
    tier_counts = serializers.DictField(child=serializers.IntegerField(), help_text="Cases per risk tier.")

    class Meta:
        model = DatasetVersion
        fields = ["number", "change", "note", "case_count", "tier_counts", "digest", "workflow_version",
                  "created_by", "created_at"]


class DatasetSerializer(serializers.ModelSerializer):
    team = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    workflow = serializers.SlugRelatedField(slug_field="name", read_only=True)
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    latest = serializers.SerializerMethodField(help_text="The latest version.")

    class Meta:
        model = Dataset
        fields = ["id", "team", "workflow", "name", "description", "created_by", "created_at", "latest"]

    @extend_schema_field(DatasetVersionSerializer)
    def get_latest(self, dataset: Dataset) -> dict:
        return DatasetVersionSerializer(latest_of(dataset)).data


class DatasetDetailSerializer(DatasetSerializer):
    versions = DatasetVersionSerializer(many=True, read_only=True, help_text="Newest first.")

    class Meta(DatasetSerializer.Meta):
        fields = [*DatasetSerializer.Meta.fields, "versions"]


@extend_schema_field(EXPECTED_SCHEMA)
class ExpectedField(serializers.JSONField):
    """The expected outcome; its shape is published in the schema and checked by the services."""


class CaseSerializer(serializers.ModelSerializer):
    expected = ExpectedField()
    source_run = serializers.UUIDField(source="source_run_id", allow_null=True, read_only=True)

    class Meta:
        model = Case
        fields = ["key", "input", "expected", "risk_tier", "tags", "responses", "source_run", "digest"]


class CaseInputSerializer(serializers.Serializer):
    """A case as given (documented here; each field is checked by the service)."""

    key = serializers.CharField()
    input = serializers.JSONField(help_text="The run input, valid under the workflow's input_schema.")
    expected = ExpectedField()
    risk_tier = serializers.ChoiceField(choices=RiskTier.choices)
    tags = serializers.ListField(child=serializers.CharField(), required=False)
    responses = serializers.DictField(
        child=serializers.JSONField(), required=False,
        help_text="What each side-effecting tool step (or human_input step) answers when the case is "
                  "evaluated, by step name; such a step never runs in an evaluation.")


class DatasetCreateSerializer(serializers.Serializer):
    team = serializers.SlugField(required=False, help_text="Needed when you belong to several teams.")
    workflow = serializers.RegexField(WORKFLOW_NAME_PATTERN, max_length=100)
    name = serializers.RegexField(r"^[a-z0-9][a-z0-9_-]*$", max_length=100,
                                  help_text="Lowercase letters, digits, - and _; unique among the workflow's datasets.")
    description = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")


class _Change(serializers.Serializer):
    note = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")


class CasesAddSerializer(_Change):
    cases = serializers.ListField(child=serializers.JSONField(), min_length=1, max_length=MAX_CASES_PER_CHANGE,
                                  help_text="Case objects (see CaseInput).")
    mode = serializers.ChoiceField(choices=MODES, default="add", help_text=(
        "add: a key the dataset has is refused; replace: it replaces that case; replace_all: "
        "these cases become the whole dataset."))
    workflow_version = serializers.IntegerField(min_value=1, required=False, allow_null=True, default=None,
                                                help_text="Check against this version (default: the published one).")


class UploadFormSerializer(_Change):
    file = serializers.FileField(help_text="JSON lines (.jsonl) or CSV (.csv).")
    mode = serializers.ChoiceField(choices=MODES, default="add")
    workflow_version = serializers.IntegerField(min_value=1, required=False, allow_null=True, default=None)


class UploadQuerySerializer(serializers.Serializer):
    mode = serializers.ChoiceField(choices=MODES, default="add")
    workflow_version = serializers.IntegerField(min_value=1, required=False, allow_null=True, default=None)
    note = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")


class FromRunSerializer(_Change):
    run = serializers.UUIDField()
    risk_tier = serializers.ChoiceField(choices=RiskTier.choices)
    tags = serializers.ListField(child=serializers.CharField(max_length=50), required=False, default=list)
    key = serializers.CharField(max_length=200, required=False, allow_null=True, default=None,
                                help_text="Default: run-<id>.")
    expected = ExpectedField(required=False, allow_null=True, default=None,
                             help_text="The corrected outcome; default: what the run did.")


class CasesRemoveSerializer(_Change):
    keys = serializers.ListField(child=serializers.CharField(max_length=200), min_length=1,
                                 max_length=MAX_CASES_PER_CHANGE)


class CaseQuerySerializer(serializers.Serializer):
    """The case lists' query parameters, as published; `api.CaseQueryForm` reads them."""

    risk_tier = serializers.ChoiceField(choices=RiskTier.choices, required=False)
    tag = serializers.CharField(max_length=50, required=False, allow_blank=True,
                                help_text="Cases carrying this tag (empty: every case).")


# --- evaluations ---------------------------------------------------------------------------------

def openapi_schema(schema):
    """A JSON Schema as an OpenAPI 3.0 schema object: without the keywords 3.0 does not have
    (`propertyNames`, `$schema`), which the service's own check still applies."""
    if isinstance(schema, dict):
        return {k: openapi_schema(v) for k, v in schema.items() if k not in ("propertyNames", "$schema", "$id")}
    if isinstance(schema, list):
        return [openapi_schema(v) for v in schema]
    return schema


class StrictCharField(serializers.CharField):
    """A JSON string and nothing else (DRF's CharField also takes 0 or true as "0", "True")."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


_FIGURE = {"type": "object", "description": "One metric over a tier's cases.",
           "properties": {"kind": {"type": "string", "description": "proportion, count or mean"},
                          "n": {"type": "integer", "description": "Cases it applies to."},
                          "value": {"type": "number", "nullable": True,
                                    "description": "A share of cases (0 to 1) or a mean per case."},
                          "ci": {"type": "array", "minItems": 2, "maxItems": 2, "nullable": True,
                                 "items": {"type": "number"}, "description": "The 95% interval [low, high]."}}}
_TIER = {"type": "object", "description": "One risk tier's cases, how many passed, and every metric by name "
                                          "(`<metric>` or `<metric>:<step>`, and `pass_rate`).",
         "properties": {"cases": {"type": "integer"}, "passed": {"type": "integer"},
                        "metrics": {"type": "object", "additionalProperties": _FIGURE}}}
SUMMARY_SCHEMA = {
    "type": "object", "nullable": True,
    "description": "Every metric per risk tier and overall with its 95% interval (`scoring.summarize`, "
                   "docs/evaluation.md), and the cases by state; written when the evaluation ends (null "
                   "while it runs).",
    "properties": {**{tier: _TIER for tier in ("overall", "low", "medium", "high")},
                   "cases": {"type": "object", "additionalProperties": {"type": "integer"}}},
}


@extend_schema_field(SUMMARY_SCHEMA)
class SummaryField(serializers.JSONField):
    """An evaluation's summary, published with its shape."""


class CaseCountsSerializer(serializers.Serializer):
    total = serializers.IntegerField(source="case_total")
    scored = serializers.IntegerField(source="case_scored")
    passed = serializers.IntegerField(source="case_passed")


class EvaluationSerializer(serializers.ModelSerializer):
    team = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    workflow = serializers.SlugRelatedField(slug_field="name", read_only=True)
    version = serializers.SlugRelatedField(slug_field="number", read_only=True,
                                           help_text="The workflow version evaluated.")
    purpose = serializers.ChoiceField(choices=Purpose.choices, read_only=True,
                                      help_text="evaluation: over a dataset; shadow: beside live runs.")
    dataset = serializers.SerializerMethodField(help_text="The dataset's id (null in shadow).")
    dataset_name = serializers.SerializerMethodField()
    dataset_version = serializers.SerializerMethodField(help_text="The dataset version whose cases are run.")
    baseline = serializers.SlugRelatedField(slug_field="number", read_only=True, allow_null=True,
                                            help_text="In shadow: the published version it runs beside.")
    state = serializers.ChoiceField(choices=EvaluationState.choices, read_only=True)
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)
    cases = CaseCountsSerializer(source="*", read_only=True, help_text="Its cases: all, scored, passed.")
    pass_rate = serializers.SerializerMethodField(help_text="Passed / scored (null before one is scored).")

    class Meta:
        model = Evaluation
        fields = ["id", "team", "workflow", "version", "purpose", "dataset", "dataset_name", "dataset_version",
                  "baseline", "state",
                  "budget_usd", "cost_usd", "concurrency", "note", "created_by", "created_at", "finished_at",
                  "stop_reason", "cases", "pass_rate"]

    @extend_schema_field({"type": "number", "nullable": True, "minimum": 0, "maximum": 1})
    def get_pass_rate(self, evaluation: Evaluation) -> float | None:
        return pass_rate(evaluation)

    @extend_schema_field({"type": "integer", "nullable": True})
    def get_dataset(self, evaluation: Evaluation) -> int | None:
        return evaluation.dataset_version.dataset_id if evaluation.dataset_version else None

    @extend_schema_field({"type": "string", "nullable": True})
    def get_dataset_name(self, evaluation: Evaluation) -> str | None:
        return evaluation.dataset_version.dataset.name if evaluation.dataset_version else None

    @extend_schema_field({"type": "integer", "nullable": True})
    def get_dataset_version(self, evaluation: Evaluation) -> int | None:
        return evaluation.dataset_version.number if evaluation.dataset_version else None


class EvaluationDetailSerializer(EvaluationSerializer):
    by_state = serializers.SerializerMethodField(help_text="Its cases by state.")
    summary = SummaryField(read_only=True)

    class Meta(EvaluationSerializer.Meta):
        fields = [*EvaluationSerializer.Meta.fields, "by_state", "summary"]

    @extend_schema_field({"type": "object", "properties": {s: {"type": "integer"} for s in CaseRunState.values}})
    def get_by_state(self, evaluation: Evaluation) -> dict:
        return cases_by_state(evaluation)


class EvaluationStartSerializer(serializers.Serializer):
    dataset = serializers.IntegerField(min_value=1, max_value=MAX_ID, help_text="The dataset's id.")
    version = serializers.IntegerField(min_value=1, max_value=MAX_ID,
                                       help_text="The number of the workflow version to evaluate.")
    dataset_version = serializers.IntegerField(min_value=1, max_value=MAX_ID, required=False, allow_null=True,
                                               help_text="The dataset version to run (default: its latest).")
    budget_usd = serializers.DecimalField(max_digits=12, decimal_places=6, coerce_to_string=False,
                                          help_text="No case starts once its runs have cost this much (USD).")
    concurrency = serializers.IntegerField(min_value=1, max_value=MAX_CONCURRENCY, default=DEFAULT_CONCURRENCY,
                                           help_text="At most this many of its runs at a time.")
    note = StrictCharField(max_length=500, required=False, allow_blank=True, default="")
    sandbox_connections = serializers.DictField(
        child=StrictCharField(max_length=100), required=False, allow_empty=True,
        help_text="For a connection the workflow writes through, the connection (same kind, granted to the "
                  "team) its side-effecting calls go to instead of being answered.")


class ShadowStartSerializer(serializers.Serializer):
    team = serializers.SlugField(required=False, help_text="Needed when you belong to several teams.")
    workflow = serializers.RegexField(WORKFLOW_NAME_PATTERN, max_length=100)
    version = serializers.IntegerField(min_value=1, max_value=MAX_ID,
                                       help_text="The draft to run beside the published version.")
    budget_usd = serializers.DecimalField(max_digits=12, decimal_places=6, coerce_to_string=False,
                                          help_text="No case starts once its runs have cost this much (USD).")
    sample_percent = serializers.IntegerField(min_value=1, max_value=100, default=10,
                                              help_text="The share of the published version's live runs run again.")
    max_cases = serializers.IntegerField(min_value=1, max_value=MAX_CASES_PER_VERSION, default=100,
                                         help_text="It ends after scoring this many live runs.")
    concurrency = serializers.IntegerField(min_value=1, max_value=MAX_CONCURRENCY, default=DEFAULT_CONCURRENCY)
    note = StrictCharField(max_length=500, required=False, allow_blank=True, default="")
    sandbox_connections = serializers.DictField(child=StrictCharField(max_length=100), required=False,
                                                allow_empty=True)


class EvaluationCancelSerializer(serializers.Serializer):
    reason = StrictCharField(max_length=500, required=False, allow_blank=True, default="")


class EvaluationCaseSerializer(serializers.ModelSerializer):
    run = serializers.UUIDField(source="run_id", allow_null=True, read_only=True)
    scores = serializers.JSONField(read_only=True, allow_null=True,
                                   help_text="Each metric's value for the case: true/false, a number, "
                                             "or absent where it does not apply.")
    outcome = serializers.JSONField(read_only=True, allow_null=True,
                                    help_text="What the run did, as the scorers read it.")

    class Meta:
        model = EvaluationCase
        fields = ["key", "risk_tier", "state", "passed", "scores", "error", "run", "outcome"]


class EvaluationCaseQuerySerializer(serializers.Serializer):
    """An evaluation's case list's query parameters, as published; `api.EvaluationCaseQueryForm`
    reads them."""

    risk_tier = serializers.ChoiceField(choices=RiskTier.choices, required=False)
    passed = serializers.BooleanField(required=False, help_text="true: the cases that passed; false: the "
                                      "scored cases that did not.")
    state = serializers.ChoiceField(choices=CaseRunState.choices, required=False)


class CompareQuerySerializer(serializers.Serializer):
    base = serializers.IntegerField(min_value=1, max_value=MAX_ID, help_text="The evaluation compared against.")
    new = serializers.IntegerField(min_value=1, max_value=MAX_ID,
                                   help_text="The evaluation compared; of the same dataset version.")


class ChangedCaseSerializer(serializers.Serializer):
    case = serializers.CharField()
    risk_tier = serializers.CharField(allow_null=True)
    metric = serializers.CharField()
    base = serializers.JSONField(allow_null=True)
    new = serializers.JSONField(allow_null=True)
    direction = serializers.CharField(help_text="Whether the new evaluation did better or worse there.")


class ComparisonSerializer(serializers.Serializer):
    base = EvaluationSerializer()
    new = EvaluationSerializer()
    changed = ChangedCaseSerializer(many=True, help_text="Each case and metric whose outcome changed.")
    tiers = serializers.DictField(child=serializers.DictField(child=serializers.JSONField()),
                                  help_text="Per tier, per metric: {base, new, delta} over the cases both scored.")
    only_in_base = serializers.ListField(child=serializers.CharField(), help_text="Cases scored in base only.")
    only_in_new = serializers.ListField(child=serializers.CharField(), help_text="Cases scored in new only.")


@extend_schema_field(openapi_schema(POLICY_SCHEMA))
class ThresholdsField(serializers.JSONField):
    """A release policy's thresholds per risk tier; their shape is published and checked by the
    service."""


class ReleasePolicySerializer(serializers.ModelSerializer):
    workflow = serializers.SlugRelatedField(slug_field="name", read_only=True)
    team = serializers.SlugField(source="workflow.team.slug", read_only=True)
    dataset = serializers.IntegerField(source="dataset_id", read_only=True)
    dataset_name = serializers.CharField(source="dataset.name", read_only=True)
    thresholds = ThresholdsField(read_only=True)
    updated_by = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)

    class Meta:
        model = ReleasePolicy
        fields = ["workflow", "team", "dataset", "dataset_name", "thresholds", "updated_by", "updated_at"]


class ReleasePolicySetSerializer(serializers.Serializer):
    dataset = serializers.IntegerField(min_value=1, max_value=MAX_ID,
                                       help_text="The id of one of the workflow's datasets: a version is "
                                                 "evaluated over its latest version.")
    thresholds = ThresholdsField(help_text="What each tier must show (docs/evaluation.md#the-release-gate).")


class TeamQuerySerializer(serializers.Serializer):
    team = serializers.CharField(required=False, allow_blank=True, max_length=100,
                                 help_text="The team's slug, when two of your teams have a workflow of this name.")
