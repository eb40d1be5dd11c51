"""Request shapes and representations of triggers, firings and event dead letters.

Request serializers check only the shape of a body; what a trigger must satisfy is decided by
`triggers.services.config` (every problem with its path). A secret is never a field of a
representation: the create and rotate answers add it once, outside the serializer.
"""
from django.urls import reverse
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from ..models import EventDeadLetter, Firing, Trigger, TriggerKind
from ..services.config import EDITABLE
from ..services.schedules import next_slots, schedule_of


def _absolute(serializer: serializers.Serializer, path: str) -> str:
    request = serializer.context.get("request")
    return request.build_absolute_uri(path) if request else path


def webhook_path(trigger: Trigger) -> str:
    return reverse("api:trigger-webhook", kwargs={"trigger_id": trigger.id})


class NextSlotSerializer(serializers.Serializer):
    at = serializers.DateTimeField(help_text="The slot, in UTC.")
    label = serializers.CharField(help_text='As read in the schedule\'s zone: "Mon 7 Dec 09:00 CET".')


class TriggerSerializer(serializers.ModelSerializer):
    url = serializers.HyperlinkedIdentityField(view_name="api:trigger-detail")
    team = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    workflow = serializers.CharField(source="workflow.name", read_only=True)
    webhook_url = serializers.SerializerMethodField()
    created_by = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True,
        help_text="Who created the trigger; null once that user is deleted.")
    updated_by = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True,
        help_text="Who last changed the trigger or rotated its secret; null until then.")
    next_slots = serializers.SerializerMethodField()

    class Meta:
        model = Trigger
        fields = ["id", "url", "team", "name", "description", "kind", "workflow",
                  "workflow_version", "enabled", "input_template", "filter", "correlate",
                  "uncorrelated", "debounce_s", "debounce_key", "debounce_max_s", "max_per_minute",
                  "when_limited", "max_queued", "capacity", "cron", "timezone", "interval_s", "missed_slots",
                  "catch_up_max", "last_slot", "next_slots", "webhook_url", "secret_fingerprint",
                  "previous_secret_until", "replay_window_s", "max_body_bytes", "source",
                  "exchange", "binding_key", "queue", "stream", "created_by", "created_at",
                  "updated_by", "updated_at", "revision"]

    @extend_schema_field(NextSlotSerializer(many=True, allow_null=True))
    def get_next_slots(self, trigger: Trigger) -> list[dict] | None:
        """A schedule's next five slots (UTC, and as read in its time zone); null for another
        kind of trigger, empty while it is disabled."""
        if trigger.kind != TriggerKind.SCHEDULE:
            return None
        if not trigger.enabled or trigger.schedule_anchor is None:
            return []
        return next_slots(schedule_of(trigger), last_slot=trigger.last_slot)[0]

    def get_webhook_url(self, trigger: Trigger) -> str | None:
        """POST signed deliveries here (webhook triggers only)."""
        return _absolute(self, webhook_path(trigger)) if trigger.kind == TriggerKind.WEBHOOK else None


class TriggerWriteSerializer(serializers.ModelSerializer):
    """A new trigger (`kind`, `name`, `workflow` and the settings of its kind), or the settings
    to change on one (PATCH: any of them but `team` and `kind`)."""

    team = serializers.SlugField(required=False, help_text="Needed when you belong to several teams.")
    workflow = serializers.CharField(max_length=100, required=False,
                                     help_text="A workflow of the team, by name.")

    class Meta:
        model = Trigger
        fields = ["team", "kind", *EDITABLE]
        extra_kwargs = {name: {"required": False} for name in ["kind", *EDITABLE]}
        validators = []  # uniqueness and the rest are the service's to check

    def validate(self, attrs: dict) -> dict:
        unknown = set(self.initial_data) - set(self.fields)
        if unknown:
            raise serializers.ValidationError(f"unknown field(s): {', '.join(sorted(unknown))}")
        return attrs

    def given(self) -> dict:
        """The validated settings the body named (not the model's defaults)."""
        return {k: v for k, v in self.validated_data.items()
                if k in self.initial_data and k not in ("team", "kind")}


class TriggerSecretSerializer(serializers.Serializer):
    """Shown once: store it with the sender now; Stepwise keeps it encrypted and never shows
    it again."""

    secret = serializers.CharField()
    secret_fingerprint = serializers.CharField()
    webhook_url = serializers.CharField()


class FiringSerializer(serializers.ModelSerializer):
    run_url = serializers.HyperlinkedRelatedField(source="run", view_name="api:run-detail",
                                                  read_only=True)
    fired_by = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True,
        help_text="Who fired it; null for a webhook, a schedule or a queue event (no person).")

    class Meta:
        model = Firing
        fields = ["id", "key", "state", "run", "run_url", "reason", "problems", "origin",
                  "fired_by", "created_at", "started_at", "group", "due_at", "coalesced_into"]


class FireOutcomeSerializer(serializers.Serializer):
    """What became of a firing (webhook deliveries, programmatic fires)."""

    status = serializers.CharField(help_text="started, signalled, duplicate, queued, debounced or ignored")
    run = serializers.UUIDField(allow_null=True)
    run_url = serializers.CharField(allow_null=True)
    firing = serializers.IntegerField(allow_null=True)
    key = serializers.CharField(allow_null=True)


class EventDeadLetterSerializer(serializers.ModelSerializer):
    url = serializers.HyperlinkedIdentityField(view_name="api:eventdeadletter-detail")
    trigger = serializers.CharField(source="trigger.name", read_only=True)
    run_url = serializers.HyperlinkedRelatedField(source="run", view_name="api:run-detail",
                                                  read_only=True)
    replayed_by = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True,
        help_text="Who replayed the dead letter; null until it is replayed.")

    class Meta:
        model = EventDeadLetter
        fields = ["id", "url", "trigger", "key", "reason_class", "problems", "status", "attempts",
                  "body", "body_complete", "meta", "run", "run_url", "created_at", "replayed_at",
                  "replayed_by"]
