"""The shapes datasets take in the API (responses and request bodies); no logic. What a case
must be is checked by the services, which report every problem with its path."""
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from orchestrator.engine.definitions.format import WORKFLOW_NAME_PATTERN

from .expected import SCHEMA as EXPECTED_SCHEMA
from .limits import MAX_CASES_PER_CHANGE
from .models import Case, Dataset, DatasetVersion, RiskTier
from .selectors import latest_of
from .services import MODES


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
