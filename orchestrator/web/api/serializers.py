"""Request shapes and response representations. No business logic lives here.

Request serializers only check the shape of a body (types, known keys); what a definition or a
run input must satisfy is decided by the services. Response serializers read what the views
hand them (querysets prefetched by the views) and never query per row.
"""
from django.core.exceptions import ObjectDoesNotExist
from django.core.validators import RegexValidator
from django.urls import reverse
from drf_spectacular.utils import OpenApiExample, extend_schema_field
from rest_framework import serializers

from approvals.models import ApprovalDecision, ApprovalRequest, InputTask
from budgets.selectors import run_budget
from budgets.serializers import RunBudgetSerializer
from orchestrator.engine.executors import ATTEMPT_META_FIELDS
from orchestrator.engine.provenance import describe
from orchestrator.engine.selectors import definition_of, place_in_line
from orchestrator.engine.states import StepKind, StepState
from orchestrator.models import (
    DeadLetter,
    Run,
    Signal,
    StepAttempt,
    StepRun,
    Workflow,
    WorkflowVersion,
)

from ..progress import latest_event_of, run_progress


def _absolute(serializer: serializers.Serializer, path: str) -> str:
    request = serializer.context.get("request")
    return request.build_absolute_uri(path) if request else path


def workflow_path(workflow: Workflow, view: str = "workflow-detail", **kwargs) -> str:
    """A workflow URL; `?team=` keeps it unambiguous when a user sees two of the same name."""
    path = reverse(f"api:{view}", kwargs={"name": workflow.name, **kwargs})
    return f"{path}?team={workflow.team.slug}"


class ErrorSerializer(serializers.Serializer):
    path = serializers.CharField(help_text='Where the problem is, e.g. "steps[2].after[0]".')
    message = serializers.CharField()


class ErrorsSerializer(serializers.Serializer):
    """Every error response: all the problems at once."""

    errors = ErrorSerializer(many=True)


class ValidationResultSerializer(serializers.Serializer):
    valid = serializers.BooleanField()
    errors = ErrorSerializer(many=True)


# --- requests ----------------------------------------------------------------------------


class DefinitionRequestSerializer(serializers.Serializer):
    """The wrapped form of a definition body. A bare definition object or YAML text also works."""

    definition = serializers.JSONField(help_text="The definition (an object, or YAML/JSON text).")
    team = serializers.SlugField(
        required=False, help_text="Team slug; needed only when you belong to several teams."
    )


# The body Swagger's "Try it out" starts from: a run of the support example (examples/
# support.yaml) as `make run` saves it, valid as it stands. Without it, the generated body
# (`{"input": {"additionalProp1": ...}, "callback_url": "string", ...}`) is a 400.
RUN_START_EXAMPLES = [
    OpenApiExample(
        "A support ticket (support-reply)", request_only=True,
        value={"input": {"ticket_id": "T-1001", "customer_email": "sam@example.com",
                         "body": "Hello, I was charged twice for my March invoice. Thanks, Sam"}},
        description="The input must satisfy the workflow's input_schema: see the workflow's "
                    "`input_schema` (GET /api/v1/workflows/{name}/) or its template's sample "
                    "input. `callback_url` and `callback_secret` are optional."),
]


class RunStartRequestSerializer(serializers.Serializer):
    input = serializers.DictField(
        required=False, default=dict, help_text="Must satisfy the workflow's input_schema."
    )
    version = serializers.IntegerField(
        required=False, min_value=1, help_text="Pin an older version (default: the latest)."
    )
    callback_url = serializers.URLField(
        required=False, max_length=2000, default="", allow_blank=True,
        help_text="POSTed (signed, at least once) when the run waits, completes or fails; must "
        "be allowed by the egress policy (docs/live.md#callbacks).")
    callback_secret = serializers.CharField(
        required=False, max_length=200, default="", write_only=True, allow_blank=True,
        help_text="The key the callback's X-Stepwise-Signature (HMAC-SHA256) is made with; "
        "required with callback_url, at least 16 characters.")
    capacity = serializers.CharField(
        required=False, max_length=16, default=None, allow_null=True,
        help_text="The capacity class the run goes to: interactive, batch, evaluation or one "
        "the deployment adds (default: the workflow's `capacity`, else interactive; "
        "docs/operations.md#capacity). An unknown class is a 400.")

    def validate(self, attrs: dict) -> dict:
        unknown = set(self.initial_data) - set(self.fields)
        if unknown:
            raise serializers.ValidationError(
                f"unknown field(s): {', '.join(sorted(unknown))}; put the run input under 'input'"
            )
        return attrs


class ApprovalDecisionSerializer(serializers.Serializer):
    proposal_hash = serializers.CharField(
        required=False, allow_blank=True, default="", max_length=64,
        help_text="The hash of the action you reviewed (the request's `proposal_hash`). A "
        "missing or stale hash is refused with 409 and nothing changes.")
    note = serializers.CharField(required=False, allow_blank=True, default="", max_length=10000,
                                 help_text="Your reason (optional).")


# A reason is words, not blanks: the published schema says so (`pattern`), so a client (or the
# fuzzer) that follows the schema is never refused for an empty note.
_SAYS_SOMETHING = RegexValidator(r"\S", message="say why: the note is empty")


class ApprovalRejectSerializer(serializers.Serializer):
    proposal_hash = serializers.CharField(
        required=False, allow_blank=True, default="", max_length=64,
        help_text="The hash of the action you reviewed (the request's `proposal_hash`). A "
        "missing or stale hash is refused with 409 and nothing changes.")
    note = serializers.CharField(max_length=10000, validators=[_SAYS_SOMETHING],
                                 help_text="Why you reject it (required).")


class ApprovalEditSerializer(serializers.Serializer):
    proposal_hash = serializers.CharField(required=False, allow_blank=True, default="",
                                          max_length=64, help_text="The hash you reviewed.")
    params = serializers.DictField(help_text="The parameters to change: name -> new value. Only "
                                   "the gate's `editable` parameters may change.")
    note = serializers.CharField(required=False, allow_blank=True, default="", max_length=10000)


class ApprovalRevokeSerializer(serializers.Serializer):
    note = serializers.CharField(max_length=10000, validators=[_SAYS_SOMETHING],
                                 help_text="Why the approval is withdrawn (required).")


# --- workflows ---------------------------------------------------------------------------


def _username(help_text: str) -> serializers.SlugRelatedField:
    """A user by username; null where no person did it (the engine, or a deleted user)."""
    return serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True,
                                        help_text=help_text)


class WorkflowVersionSummarySerializer(serializers.ModelSerializer):
    url = serializers.SerializerMethodField()
    created_by = _username("Who saved it; null if the engine did or the user was deleted.")

    class Meta:
        model = WorkflowVersion
        fields = ["number", "url", "digest", "created_at", "created_by"]

    def get_url(self, version: WorkflowVersion) -> str:
        return _absolute(self, workflow_path(version.workflow, "workflow-version",
                                             number=version.number))


class WorkflowVersionSerializer(WorkflowVersionSummarySerializer):
    """One immutable version; `created` says whether this request made it."""

    workflow = serializers.CharField(source="workflow.name", read_only=True)
    team = serializers.CharField(source="workflow.team.slug", read_only=True)
    workflow_url = serializers.SerializerMethodField()
    created = serializers.SerializerMethodField()

    class Meta(WorkflowVersionSummarySerializer.Meta):
        fields = ["workflow", "team", "number", "created", "url", "workflow_url", "digest",
                  "created_at", "created_by", "definition", "normalized"]

    def get_workflow_url(self, version: WorkflowVersion) -> str:
        return _absolute(self, workflow_path(version.workflow))

    def get_created(self, version: WorkflowVersion) -> bool | None:
        return self.context.get("created")


class WorkflowListSerializer(serializers.ModelSerializer):
    """A list row; the view annotates `latest_number` and `updated_at`."""

    team = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    url = serializers.SerializerMethodField()
    latest_version = serializers.IntegerField(source="latest_number", read_only=True)
    active_version = serializers.IntegerField(
        source="active_version.number", read_only=True, allow_null=True, default=None,
        help_text="The published version: what runs and triggers start (null: none yet).")
    updated_at = serializers.DateTimeField(read_only=True)

    class Meta:
        model = Workflow
        fields = ["name", "team", "url", "latest_version", "active_version", "archived_at",
                  "created_at", "updated_at"]

    def get_url(self, workflow: Workflow) -> str:
        return _absolute(self, workflow_path(workflow))


class StrictBooleanField(serializers.BooleanField):
    """A JSON `true` or `false` and nothing else: DRF's BooleanField also takes 0, 1, "yes" and
    "off", which the published schema (`type: boolean`) does not allow."""

    def to_internal_value(self, data):
        if isinstance(data, bool):
            return data
        self.fail("invalid", input=data)


class WorkflowPolicySerializer(serializers.Serializer):
    publish_on_save = StrictBooleanField(
        help_text="On: a saved version is published at once (when the saver may publish); off: "
        "saved versions are drafts until someone publishes one.")


class WorkflowDetailSerializer(serializers.ModelSerializer):
    """A workflow with its latest version's definition; the view sets `latest` and `all_versions`."""

    team = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    url = serializers.SerializerMethodField()
    version = serializers.IntegerField(source="latest.number", read_only=True)
    version_created_at = serializers.DateTimeField(source="latest.created_at", read_only=True)
    digest = serializers.CharField(source="latest.digest", read_only=True)
    definition = serializers.JSONField(source="latest.definition", read_only=True)
    versions_url = serializers.SerializerMethodField()
    runs_url = serializers.SerializerMethodField()
    versions = WorkflowVersionSummarySerializer(source="all_versions", many=True, read_only=True)
    active_version = serializers.IntegerField(
        source="active_version.number", read_only=True, allow_null=True, default=None,
        help_text="The published version: what runs and triggers start (null: none yet).")

    class Meta:
        model = Workflow
        fields = ["name", "team", "url", "created_at", "version", "version_created_at", "digest",
                  "definition", "active_version", "publish_on_save", "archived_at",
                  "versions_url", "runs_url", "versions"]
        read_only_fields = ["publish_on_save", "archived_at"]

    def get_url(self, workflow: Workflow) -> str:
        return _absolute(self, workflow_path(workflow))

    def get_versions_url(self, workflow: Workflow) -> str:
        return _absolute(self, workflow_path(workflow, "workflow-versions"))

    def get_runs_url(self, workflow: Workflow) -> str:
        """POST here to start a run."""
        return _absolute(self, workflow_path(workflow, "workflow-runs"))


# --- runs --------------------------------------------------------------------------------


class StepAttemptSerializer(serializers.ModelSerializer):
    class Meta:
        model = StepAttempt
        fields = ["number", "worker", "started_at", "finished_at", "outcome", "error_class",
                  "error_message", "tokens_in", "tokens_out", "cost_usd", "model", "provider",
                  "idempotency_key", *ATTEMPT_META_FIELDS]


class StepApprovalSerializer(serializers.ModelSerializer):
    url = serializers.HyperlinkedIdentityField(view_name="api:approval-detail")

    class Meta:
        model = ApprovalRequest
        fields = ["id", "url", "state"]


class SignalSendSerializer(serializers.Serializer):
    payload = serializers.DictField(help_text="The signal's payload: a JSON object, checked "
                                    "against the waiting step's schema; the step's output.")


class SignalSerializer(serializers.ModelSerializer):
    """A signal as sent: consumed by a wait step (`step`), or buffered until one waits."""

    step = serializers.SlugRelatedField(slug_field="name", read_only=True, allow_null=True)
    run = serializers.UUIDField(source="run_id", read_only=True)
    duplicate = serializers.SerializerMethodField()

    class Meta:
        model = Signal
        fields = ["id", "run", "name", "key", "state", "step", "payload", "sent_by", "created_at",
                  "consumed_at", "duplicate"]

    def get_duplicate(self, signal: Signal) -> bool:
        """True when the key had been sent already: this is the first send's result."""
        return bool(self.context.get("duplicate"))


class ReusedFromSerializer(serializers.Serializer):
    """The earlier step whose output a step copied (docs/definitions.md#cache)."""

    run = serializers.UUIDField()
    step = serializers.CharField()
    url = serializers.CharField(help_text="The source run in the API.")


class StepRunSerializer(serializers.ModelSerializer):
    attempt_records = StepAttemptSerializer(many=True, read_only=True)
    approval = serializers.SerializerMethodField()
    reused_from = serializers.SerializerMethodField()

    class Meta:
        model = StepRun
        fields = ["name", "kind", "position", "state", "queue", "attempts", "input", "output",
                  "error", "skip_reason", "tokens_in", "tokens_out", "cost_usd", "ready_at",
                  "queued_at", "started_at", "finished_at", "deadline_at", "next_attempt_at",
                  "wake_at", "correlation_key", "approval", "reused_from", "attempt_records",
                  "waiting_for", "concurrency_key"]

    @extend_schema_field(ReusedFromSerializer(allow_null=True))
    def get_reused_from(self, step: StepRun) -> dict | None:
        """Where the step's output was copied from when it reused an earlier run's result: no
        model or tool was called and nothing was spent. Null when the step computed it. Read
        from its attempts, prefetched by the view (`with_steps`): no query."""
        attempts = list(step.attempt_records.all())
        source = max(attempts, key=lambda a: a.number).reused_from if attempts else None
        if not source:
            return None
        return {**source, "url": _absolute(self, reverse("api:run-detail", args=[source["run"]]))}

    @extend_schema_field(StepApprovalSerializer(allow_null=True))
    def get_approval(self, step: StepRun) -> dict | None:
        """The gate's latest approval request (a redriven gate asks again): annotated on the
        step by the view (`with_steps`), so no query."""
        approval_id = getattr(step, "approval_id", None)
        if approval_id is None:
            return None
        return {"id": approval_id, "state": step.approval_state,
                "url": _absolute(self, reverse("api:approval-detail", args=[approval_id]))}


class ProvenancePersonSerializer(serializers.Serializer):
    user = serializers.IntegerField()
    username = serializers.CharField()
    # "as" is a Python keyword: declared under another name, renamed in the schema.
    as_ = serializers.CharField(help_text='"started it", "fired the trigger", "created the '
                                          'trigger", "last changed the trigger"')

    def get_fields(self):
        fields = super().get_fields()
        fields["as"] = fields.pop("as_")
        return fields


class ProvenanceTriggerSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    name = serializers.CharField()
    kind = serializers.CharField()
    revision = serializers.IntegerField(help_text="The trigger's revision when it fired.")


class ProvenanceSerializer(serializers.Serializer):
    """Who set a run in motion: every person separation of duties refuses as its approver."""

    path = serializers.CharField(help_text="api, builder, api_trigger, schedule, webhook, queue, "
                                           "sub_workflow, fork")
    people = ProvenancePersonSerializer(many=True)
    trigger = ProvenanceTriggerSerializer(required=False)
    parent_run = serializers.UUIDField(required=False)
    forked_from = serializers.UUIDField(required=False, help_text="A fork's source run.")
    fork_step = serializers.CharField(required=False, help_text="The step a fork runs again from.")
    summary = serializers.CharField(help_text="The same, in words.")


class RunSerializer(serializers.ModelSerializer):
    """A run in a list, or as the answer to start/cancel."""

    url = serializers.HyperlinkedIdentityField(view_name="api:run-detail")
    workflow = serializers.CharField(source="version.workflow.name", read_only=True)
    version = serializers.IntegerField(source="version.number", read_only=True)
    team = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    created_by = _username("Who started it; null if the engine did or the user was deleted.")
    provenance = serializers.SerializerMethodField()
    duration_s = serializers.SerializerMethodField()
    forked_from = serializers.UUIDField(source="forked_from_id", read_only=True, allow_null=True,
                                        help_text="The run this one was forked from, or null.")
    fork_step = serializers.CharField(read_only=True, help_text=(
        "The step a fork runs again from (empty for a run that is not a fork)."))

    class Meta:
        model = Run
        fields = ["id", "url", "workflow", "version", "team", "state", "trigger", "created_by",
                  "provenance", "created_at", "started_at", "finished_at", "duration_s",
                  "cost_usd", "tokens_in", "tokens_out", "forked_from", "fork_step", "capacity"]

    @extend_schema_field(ProvenanceSerializer)
    def get_provenance(self, run: Run) -> dict:
        """Who set the run in motion, on which path (docs/permissions.md#provenance)."""
        return {"path": "", "people": [], **(run.provenance or {}),
                "summary": describe(run.provenance)}

    def get_duration_s(self, run: Run) -> float | None:
        """Seconds from start to finish; null until the run has finished."""
        if run.started_at and run.finished_at:
            return round((run.finished_at - run.started_at).total_seconds(), 3)
        return None


class StartedBySerializer(serializers.Serializer):
    trigger = serializers.UUIDField()
    name = serializers.CharField()
    kind = serializers.CharField()
    key = serializers.CharField(help_text='The slot, delivery or message: "slot:<time>", '
                                          '"delivery:<id>", "message:<id>", "request:<key>".')
    url = serializers.CharField()


class MapProgressSerializer(serializers.Serializer):
    step = serializers.CharField()
    done = serializers.IntegerField()
    total = serializers.IntegerField()


class ProgressSerializer(serializers.Serializer):
    """How far the run has got, counted, never estimated (docs/live.md)."""

    steps_total = serializers.IntegerField()
    steps_done = serializers.IntegerField(help_text="Steps that have ended (completed, skipped, "
                                          "failed, timed out or cancelled).")
    steps_failed = serializers.IntegerField()
    by_state = serializers.DictField(child=serializers.IntegerField(), help_text="Steps per state.")
    map_items = MapProgressSerializer(many=True, help_text="Each map step's items done of its items.")


class AwaitedSignalSerializer(serializers.Serializer):
    step = serializers.CharField(help_text="The wait step.")
    signal = serializers.CharField(help_text="The signal it waits for.")
    until = serializers.DateTimeField(help_text="When it times out.")


class HeldSerializer(serializers.Serializer):
    concurrency_key = serializers.CharField()
    place = serializers.IntegerField(help_text="1: the next of its key to start.")


class RunDetailSerializer(RunSerializer):
    steps = StepRunSerializer(many=True, read_only=True)
    waiting_for_signals = serializers.SerializerMethodField()
    parent_run = serializers.SerializerMethodField()
    forks_url = serializers.SerializerMethodField()
    started_by = serializers.SerializerMethodField()
    progress = serializers.SerializerMethodField()
    last_event = serializers.SerializerMethodField()
    budget = serializers.SerializerMethodField()
    held = serializers.SerializerMethodField()

    class Meta(RunSerializer.Meta):
        fields = [*RunSerializer.Meta.fields, "input", "output", "error", "idempotency_key",
                  "parent_run", "forks_url", "started_by", "progress", "last_event", "budget",
                  "concurrency_key", "held", "waiting_for_signals", "steps"]

    @extend_schema_field(HeldSerializer(allow_null=True))
    def get_held(self, run: Run) -> dict | None:
        """A run held behind others of its concurrency key: its place in line (1: next)."""
        place = place_in_line(run)
        return None if place is None else {"concurrency_key": run.concurrency_key, "place": place}

    @extend_schema_field(AwaitedSignalSerializer(many=True))
    def get_waiting_for_signals(self, run: Run) -> list[dict]:
        """Each wait step still waiting: the signal it waits for, and until when."""
        waiting = [s for s in run.steps.all()
                   if s.kind == StepKind.WAIT and s.state == StepState.WAITING]
        if not waiting:
            return []
        graph = definition_of(run)[1]
        return [{"step": s.name, "signal": graph.steps[s.name]["signal"], "until": s.deadline_at}
                for s in waiting]

    @extend_schema_field(ProgressSerializer)
    def get_progress(self, run: Run) -> dict:
        return run_progress(run, list(run.steps.all()))

    def get_last_event(self, run: Run) -> int:
        """The id of the run's newest event: pass it as `wait_for_change` to long-poll."""
        newest = getattr(run, "newest_event", None)  # annotated by the view: no query
        return newest if newest is not None else latest_event_of(run)

    @extend_schema_field(RunBudgetSerializer)
    def get_budget(self, run: Run) -> dict:
        """What the run has spent, holds reserved and has left under its cost limit."""
        return run_budget(run).as_dict()

    @extend_schema_field(StartedBySerializer(allow_null=True))
    def get_started_by(self, run: Run) -> dict | None:
        """The trigger whose firing started this run (triggers app), or null."""
        try:
            firing = run.trigger_firing  # select_related by the view: no query
        except ObjectDoesNotExist:
            return None
        trigger = firing.trigger
        return {"trigger": str(trigger.id), "name": trigger.name, "kind": trigger.kind,
                "key": firing.key,
                "url": _absolute(self, reverse("api:trigger-detail", args=[trigger.id]))}

    def get_forks_url(self, run: Run) -> str:
        """The runs forked from this one: the run list filtered by `forked_from`."""
        return _absolute(self, f"{reverse('api:run-list')}?forked_from={run.id}")

    def get_parent_run(self, run: Run) -> str | None:
        """The run whose sub_workflow step started this one."""
        return str(run.parent_step.run_id) if run.parent_step_id else None


# --- approvals ---------------------------------------------------------------------------


class ApprovalDecisionRecordSerializer(serializers.ModelSerializer):
    user = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = ApprovalDecision
        fields = ["user", "verdict", "note", "proposal_hash", "escalation_level", "changes",
                  "created_at"]


class ApprovalSerializer(serializers.ModelSerializer):
    url = serializers.HyperlinkedIdentityField(view_name="api:approval-detail")
    run_url = serializers.HyperlinkedRelatedField(
        source="run", view_name="api:run-detail", read_only=True
    )
    workflow = serializers.CharField(source="run.version.workflow.name", read_only=True)
    step = serializers.CharField(source="step.name", read_only=True)
    decided_by = _username("Who approved or rejected it; null while pending, and when it "
                           "expired or was cancelled.")

    decisions = ApprovalDecisionRecordSerializer(many=True, read_only=True)
    approvals_given = serializers.SerializerMethodField()

    class Meta:
        model = ApprovalRequest
        fields = ["id", "url", "state", "run", "run_url", "workflow", "step", "approvers",
                  "escalation_level", "instructions", "action_kind", "action", "action_source",
                  "proposal_hash", "guarded_steps", "editable", "edits", "explanation",
                  "risk_tier", "risk_reasons", "amount", "approvals_required", "approvals_given",
                  "context", "requested_at", "deadline_at", "decided_at", "decided_by", "note",
                  "decisions"]

    def get_approvals_given(self, approval: ApprovalRequest) -> int:
        """Distinct people who approved the current hash."""
        return len({d.user_id for d in approval.decisions.all()
                    if d.verdict == "approve" and d.proposal_hash == approval.proposal_hash})


# --- input tasks (human_input steps) -------------------------------------------------------


class InputTaskSerializer(serializers.ModelSerializer):
    url = serializers.HyperlinkedIdentityField(view_name="api:inputtask-detail")
    run_url = serializers.HyperlinkedRelatedField(
        source="run", view_name="api:run-detail", read_only=True
    )
    workflow = serializers.CharField(source="run.version.workflow.name", read_only=True)
    step = serializers.CharField(source="step.name", read_only=True)
    answered_by = _username("Who answered or abstained; null while open, and when it expired "
                            "or was cancelled.")

    class Meta:
        model = InputTask
        fields = ["id", "url", "state", "run", "run_url", "workflow", "step", "version", "group",
                  "assignee", "escalation_level", "escalate_at", "instructions", "evidence",
                  "form", "allow_abstain", "separation_of_duties", "requested_at", "deadline_at",
                  "answer", "note", "answered_by", "answered_at"]


class InputAnswerSerializer(serializers.Serializer):
    answer = serializers.JSONField(
        required=False, default=None, allow_null=True,
        help_text="The form's fields: an object the task's `form` (a JSON Schema) accepts. "
        "Each problem is a 400 naming its field (`answer.<field>`).")
    abstain = serializers.BooleanField(
        required=False, default=False,
        help_text="Answer 'can't decide' instead (only where the task's `allow_abstain`).")
    note = serializers.CharField(required=False, allow_blank=True, default="", max_length=10000,
                                 help_text="A note recorded with your answer (optional).")


# --- dead letters --------------------------------------------------------------------------


class DeadLetterSerializer(serializers.ModelSerializer):
    url = serializers.HyperlinkedIdentityField(view_name="api:deadletter-detail")
    run_url = serializers.HyperlinkedRelatedField(source="run", view_name="api:run-detail",
                                                  read_only=True)
    step = serializers.CharField(source="step.name", read_only=True)
    redriven_by = _username("Who redrove it; null while open.")

    class Meta:
        model = DeadLetter
        fields = ["id", "url", "run", "run_url", "step", "error_class", "error_message",
                  "attempts", "payload_ref", "trace_id", "status", "created_at", "redriven_at",
                  "redriven_by"]
