"""Workflows, runs, steps and their state machines: the persisted truth of Stepwise.

Models hold data, invariants and declared transitions. A transition body touches only its own
row; the services in `orchestrator.engine.services` wrap transition + save + event in one
transaction. Nothing here makes a network call, dispatches a task or writes another row.
"""
import uuid
from datetime import timedelta
from decimal import Decimal
from functools import cache

from django.conf import settings
from django.db import models
from django_fsm import ConcurrentTransitionMixin, FSMField, FSMFieldMixin, transition

from .engine.artifacts import ArtifactJSONField
from .engine.clock import now
from .engine.states import (
    RUN_LIVE,
    RUN_TERMINAL,
    STEP_OPEN,
    STEP_RECOVERABLE,
    STEP_TERMINAL,
    RunCapacity,
    RunState,
    StepKind,
    StepState,
    in_order,
)


class Team(models.Model):
    """Workflows and runs belong to a team; a person sees and acts on its objects only through
    a membership, whose role says what they may do (`orchestrator.engine.authz`)."""

    slug = models.SlugField(unique=True)
    name = models.CharField(max_length=200)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, related_name="teams", blank=True,
                                     through="TeamMembership")

    def __str__(self) -> str:
        return self.slug


class Role(models.TextChoices):
    """What a member may do in a team; docs/permissions.md has the whole matrix."""

    MEMBER = "member", "member: sees the team's workflows and runs, starts runs"
    EDITOR = "editor", "editor: member, and saves new versions of workflows"
    OPERATOR = "operator", "operator: member, and cancels, resumes, retries, skips and redrives"
    OWNER = "owner", "owner: every action in the team"


class TeamMembership(models.Model):
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="team_memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "user"], name="one_membership_per_team")]
        ordering = ["team", "user"]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} ({self.role})"


class Workflow(models.Model):
    """A named workflow of a team: its versions, which one runs, and whether it is archived.

    Runs and triggers start `active_version` (published by `services.workflows`); a saved
    version is a draft until published unless `publish_on_save` says saving publishes it.
    """

    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="workflows")
    name = models.CharField(max_length=100)
    created_at = models.DateTimeField(default=now)
    active_version = models.ForeignKey(
        "WorkflowVersion", null=True, blank=True, on_delete=models.PROTECT, related_name="+",
        help_text="The version runs and triggers start (none: nothing published yet).")
    publish_on_save = models.BooleanField(
        default=True, help_text="Saving a version publishes it when the saver may publish; "
        "off: saved versions are drafts until someone publishes one.")
    archived_at = models.DateTimeField(null=True, blank=True,
                                       help_text="Archived: no new runs start.")
    gates_unguarded = models.JSONField(
        default=list, blank=True, help_text="What gate policies set since the published version "
        "was published find unguarded in it ([{path, message}]): its runs are refused until an "
        "owner publishes it again (waiving) or a fixed version.")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="workflow_name_per_team")]
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.team}/{self.name}"


class WorkflowVersion(models.Model):
    """An immutable definition. Saving a changed definition creates the next version."""

    workflow = models.ForeignKey(Workflow, on_delete=models.PROTECT, related_name="versions")
    number = models.PositiveIntegerField()
    definition = models.JSONField(help_text="The definition as submitted.")
    normalized = models.JSONField(help_text="The definition with every default filled in.")
    digest = models.CharField(max_length=64, help_text="SHA-256 of the canonical definition.")
    created_at = models.DateTimeField(default=now)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    gates_waived = models.JSONField(
        default=list, blank=True, help_text="The gate problems an owner waived when publishing "
        "this version ([{path, message}]): runs of it may start in spite of exactly these.")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["workflow", "number"], name="version_number_unique"),
        ]
        ordering = ["workflow", "-number"]

    def __str__(self) -> str:
        return f"{self.workflow.name} v{self.number}"


class GatePolicy(models.Model):
    """A mandatory gate policy: calls of a tool (a name or glob, optionally on a target) that
    every version of the team's workflows (or of one workflow) must put behind a satisfying
    human gate. Set by owners (`services.gate_policies`); checked by
    `definitions.mandatory_gates.unguarded_actions` on publish and at every start."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="gate_policies")
    workflow = models.ForeignKey(
        Workflow, null=True, blank=True, on_delete=models.CASCADE, related_name="gate_policies",
        help_text="Only this workflow (none: every workflow of the team).")
    tool = models.CharField(max_length=100, help_text="A tool name or glob: email.send, payments.*")
    target = models.CharField(
        max_length=200, blank=True, help_text="Only calls going there (a glob over the named "
        "connection, the recipients' domains, the URL's host); empty: every call.")
    approvers = models.CharField(max_length=150, blank=True,
                                 help_text="The group a satisfying gate names; empty: any group.")
    required_approvals = models.PositiveSmallIntegerField(
        default=1, help_text="A satisfying gate requires at least this many for every risk tier.")
    self_approval_up_to = models.CharField(
        max_length=10, blank=True, choices=[(t, t) for t in ("low", "medium", "high", "critical")],
        help_text="The most self-approval a satisfying gate may allow; empty: none.")
    created_at = models.DateTimeField(default=now)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")

    class Meta:
        ordering = ["team", "workflow", "tool", "id"]
        verbose_name_plural = "gate policies"

    def __str__(self) -> str:
        where = self.workflow.name if self.workflow_id else f"team {self.team}"
        return f"{self.tool}{' on ' + self.target if self.target else ''} ({where})"


class WorkflowVersionLayout(models.Model):
    """Where the visual builder drew each step of a version (docs/builder.md).

    Kept beside the definition, never in it: positions change no meaning, so they change no
    digest and make no new version. `positions` maps a step's name (a loop's body steps too) to
    `{"x", "y"}`; a step missing here is placed by the auto-layout.
    """

    version = models.OneToOneField(WorkflowVersion, on_delete=models.CASCADE, primary_key=True,
                                   related_name="layout")
    positions = models.JSONField(default=dict)
    updated_at = models.DateTimeField(default=now)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    def __str__(self) -> str:
        return f"layout of {self.version}"


class CachedStateFieldsMixin(ConcurrentTransitionMixin):
    """django-fsm's optimistic lock (each save of a transition is an UPDATE ... WHERE state =
    the state it was read in), with the model's state fields found once per class: the mixin
    looks for them among all the fields at every instantiation and every save."""

    @property
    def state_fields(self) -> tuple[FSMFieldMixin, ...]:
        return _state_fields(type(self))


@cache
def _state_fields(model: type[models.Model]) -> tuple[FSMFieldMixin, ...]:
    return tuple(f for f in model._meta.fields if isinstance(f, FSMFieldMixin))


class Run(CachedStateFieldsMixin, models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # Each indexed by an index of Meta.indexes whose first column it is (`run_team_created_id`,
    # `run_version_created`): an index of its own would be one more write per run for nothing.
    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="runs", db_index=False)
    version = models.ForeignKey(WorkflowVersion, on_delete=models.PROTECT, related_name="runs",
                                db_index=False)
    state = FSMField(default=RunState.PENDING, choices=RunState.choices, protected=True)
    input = ArtifactJSONField(default=dict)
    output = ArtifactJSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    trigger = models.CharField(max_length=32, default="api")
    parent_step = models.OneToOneField(
        "StepRun", null=True, blank=True, on_delete=models.PROTECT, related_name="child_run"
    )
    # NULL, not "", when absent: the unique constraint must ignore runs without a key.
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    request_digest = models.CharField(max_length=64, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    # Who set the run in motion, on whatever path (orchestrator/engine/provenance.py): written once
    # by run_start; separation of duties refuses every person it names as an approver.
    provenance = models.JSONField(default=dict, blank=True)
    # Where the run's work is sent, whose share of each provider quota it draws on and whether
    # it counts toward the team's admission caps (engine/capacity.py: the built-in classes and
    # those a deployment adds); a child run has its parent's.
    capacity = models.CharField(max_length=16, default=RunCapacity.INTERACTIVE)
    # Null: a live run. Else what answers in place of the world (orchestrator/engine/sandbox.py):
    # {"purpose", "responses", "decisions"}; no side-effecting call, person or callback is reached.
    sandbox = ArtifactJSONField(null=True, blank=True)
    # Its workflow's `concurrency.key` rendered over its input (services/concurrency.py); a
    # run held behind others of the key waits `pending` until one of them ends.
    concurrency_key = models.CharField(max_length=200, blank=True, default="")
    # A fork (services/forks.py): the run it was forked from, and the step it runs again from;
    # the steps before that were carried over from the source, completed.
    forked_from = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT,
                                    related_name="forks")
    fork_step = models.CharField(max_length=64, blank=True)
    # What the fork changed: {"step_input": {upstream step: output} the fork step reads in place
    # of theirs, "repeat_effects": [steps whose effects are performed again, not reused]}.
    fork_edits = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=now)  # indexed by run_created_id
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    deadline_at = models.DateTimeField(null=True, blank=True,
                                       help_text="budget.max_duration_s after the start.")
    # Bumped by every change the scheduler makes; the reaper flags runs that stop moving.
    progressed_at = models.DateTimeField(default=now)
    # Held (and renewed by a heartbeat) by the one worker compensating the run, so a duplicate
    # compensate_run message never runs the same compensation beside it.
    compensation_lease_until = models.DateTimeField(null=True, blank=True)
    cost_usd = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal("0"))
    tokens_in = models.PositiveBigIntegerField(default=0)
    tokens_out = models.PositiveBigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["team", "idempotency_key"],
                condition=models.Q(idempotency_key__isnull=False),
                name="run_idempotency_key_per_team",
            )
        ]
        indexes = [
            models.Index(fields=["state", "progressed_at"], name="run_state_progress"),
            models.Index(fields=["version", "created_at"], name="run_version_created"),
            models.Index(fields=["state", "deadline_at"], name="run_state_deadline"),
            models.Index(fields=["concurrency_key", "created_at"], name="run_concurrency_key",
                         condition=~models.Q(concurrency_key="")),
            # The API's and the admin's run lists: a keyset page, newest first, by state or team.
            models.Index(fields=["created_at", "id"], name="run_created_id"),
            models.Index(fields=["state", "created_at", "id"], name="run_state_created_id"),
            models.Index(fields=["team", "created_at", "id"], name="run_team_created_id"),
        ]
        ordering = ["-created_at"]

    # Not a column: whether the run has a callback (notifications.RunCallback), set by
    # run_start on the instance it creates, so its events need no read to find out; None
    # (a run read from the database): unknown.
    has_callback: bool | None = None

    def __str__(self) -> str:
        return f"run {self.id} ({self.state})"

    @property
    def workflow_name(self) -> str:
        return self.version.workflow.name

    @property
    def is_terminal(self) -> bool:
        return self.state in RUN_TERMINAL

    @transition(field=state, source=RunState.PENDING, target=RunState.RUNNING)
    def start(self) -> None:
        self.started_at = self.progressed_at = now()

    @transition(field=state, source=RunState.RUNNING, target=RunState.WAITING)
    def wait(self) -> None:
        self.progressed_at = now()

    @transition(field=state, source=[RunState.WAITING, RunState.PAUSED], target=RunState.RUNNING)
    def resume(self) -> None:
        self.progressed_at = now()

    @transition(field=state, source=[RunState.RUNNING, RunState.WAITING], target=RunState.PAUSED)
    def pause(self, *, reason: dict) -> None:
        self.error = reason
        self.progressed_at = now()

    @transition(field=state, source=in_order(RUN_LIVE), target=RunState.CANCELLING)
    def request_cancel(self) -> None:
        self.progressed_at = now()

    @transition(field=state, source=[RunState.PENDING, RunState.CANCELLING], target=RunState.CANCELLED)
    def cancel(self) -> None:
        self.finished_at = self.progressed_at = now()

    @transition(field=state, source=[RunState.RUNNING, RunState.WAITING], target=RunState.COMPLETED)
    def complete(self, *, output: dict) -> None:
        self.output = output
        self.finished_at = self.progressed_at = now()

    @transition(field=state, source=[*in_order(RUN_LIVE), RunState.PENDING], target=RunState.FAILED)
    def fail(self, *, error: dict) -> None:
        self.error = error
        self.finished_at = self.progressed_at = now()

    @transition(field=state, source=in_order(RUN_LIVE), target=RunState.TIMED_OUT)
    def time_out(self, *, error: dict) -> None:
        self.error = error
        self.finished_at = self.progressed_at = now()

    @transition(field=state, source=[*in_order(RUN_LIVE), RunState.CANCELLING], target=RunState.COMPENSATING)
    def compensate(self, *, error: dict) -> None:
        """The run failed after effects happened: undo them, newest first, before ending."""
        self.error = error
        self.progressed_at = now()

    @transition(field=state, source=RunState.COMPENSATING, target=RunState.FAILED)
    def compensated(self) -> None:
        self.finished_at = self.progressed_at = now()

    @transition(field=state, source=RunState.COMPENSATING, target=RunState.COMPENSATION_FAILED)
    def compensation_fail(self, *, error: dict) -> None:
        self.error = {**(self.error or {}), "compensation": error}
        self.finished_at = self.progressed_at = now()

    @transition(field=state, source=[RunState.FAILED, RunState.TIMED_OUT], target=RunState.RUNNING)
    def reopen(self) -> None:
        """An operator redrives a dead-lettered step of this run."""
        self.error = None
        self.finished_at = None
        self.progressed_at = now()

class RunSecret(models.Model):
    """The secret values of a run's input, sealed (`orchestrator.engine.sealing.RUN_SECRETS`); the
    run's `input` holds a `{"secret": "<path>"}` marker where each was
    (`orchestrator.engine.secret_inputs`)."""

    run = models.OneToOneField(Run, on_delete=models.CASCADE, primary_key=True,
                               related_name="sealed_secrets")
    sealed = models.TextField(help_text="Ciphertext of {path: value}; the key is not in the database.")

    def __str__(self) -> str:
        return f"secrets of run {self.run_id}"


class StepRun(CachedStateFieldsMixin, models.Model):
    """One step of one run. Its row is the only owner of the step's state."""

    # Indexed by `step_name_per_run`, whose first column it is.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="steps", db_index=False)
    name = models.CharField(max_length=64)
    kind = models.CharField(max_length=16, choices=StepKind.choices)
    position = models.PositiveIntegerField(help_text="Index in the definition's step list.")
    state = FSMField(default=StepState.BLOCKED, choices=StepState.choices, protected=True)
    queue = models.CharField(max_length=100, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    input = ArtifactJSONField(null=True, blank=True)
    output = ArtifactJSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    skip_reason = models.CharField(max_length=200, blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    lease_owner = models.CharField(max_length=200, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    deadline_at = models.DateTimeField(null=True, blank=True, help_text="When the reaper times it out.")
    wake_at = models.DateTimeField(null=True, blank=True,
                                   help_text="When a sleep step wakes (the reaper wakes it).")
    correlation_key = models.CharField(
        max_length=200, blank=True,
        help_text="A wait step's correlation key, rendered when it starts: a trigger's "
                  "correlated event finds the step by it.")
    ready_at = models.DateTimeField(null=True, blank=True)
    queued_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    cost_usd = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal("0"))
    tokens_in = models.PositiveBigIntegerField(default=0)
    tokens_out = models.PositiveBigIntegerField(default=0)
    # The signed record of who produced `output` and from what (engine/attestation.py): written
    # with the output; the scheduler reads no output whose record does not verify.
    attestation = models.JSONField(null=True, blank=True)
    # Why a queued step is not running yet (a provider quota it waits for, its place behind a
    # concurrency key); blank once it is claimed. Shown on the run page and in the API.
    waiting_for = models.CharField(max_length=300, blank=True, default="")
    # The step's rendered `concurrency.key` (blank: it has none): at most `limit` steps of one
    # key of its workflow run at once (engine/services/step_concurrency.py).
    concurrency_key = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "name"], name="step_name_per_run")]
        # What the reaper, the metrics and the operations page look for, and only those rows: a
        # step that has ended (most of them) or not started has no entry in any of these, so its
        # writes keep none up.
        indexes = [
            models.Index(fields=["lease_expires_at"], name="step_running_lease",
                         condition=models.Q(state=StepState.RUNNING)),
            models.Index(fields=["next_attempt_at"], name="step_retrying_next_attempt",
                         condition=models.Q(state=StepState.RETRYING)),
            models.Index(fields=["deadline_at"], name="step_live_deadline",
                         condition=models.Q(state__in=[StepState.RUNNING, StepState.WAITING])),
            models.Index(fields=["queue", "queued_at"], name="step_queued",
                         condition=models.Q(state=StepState.QUEUED)),
            models.Index(fields=["wake_at"], name="step_sleeping_wake",
                         condition=models.Q(state=StepState.WAITING, wake_at__isnull=False)),
            # A correlated event looks up the wait step that waits with its key.
            models.Index(fields=["correlation_key"], name="step_waiting_correlation",
                         condition=models.Q(state=StepState.WAITING, correlation_key__gt="")),
            # The operations page's count of waiting steps by kind, with the oldest wait of each.
            models.Index(fields=["kind", "started_at"], name="step_waiting_kind",
                         condition=models.Q(state=StepState.WAITING)),
        ]
        ordering = ["run", "position", "id"]  # a loop's iterations share its position

    def __str__(self) -> str:
        return f"{self.name} ({self.state})"

    @property
    def is_terminal(self) -> bool:
        return self.state in STEP_TERMINAL

    @transition(field=state, source=StepState.BLOCKED, target=StepState.READY)
    def make_ready(self, *, step_input: dict) -> None:
        self.input = step_input
        self.ready_at = now()

    @transition(field=state, source=StepState.BLOCKED, target=StepState.COMPLETED)
    def carry(self, *, step_input, output) -> None:
        """A fork's step before its fork point: completed with the source run's input and output,
        nothing run (services/forks.py)."""
        self.input = step_input
        self.output = output
        self.ready_at = self.started_at = self.finished_at = now()

    @transition(field=state, source=[StepState.BLOCKED, StepState.READY], target=StepState.SKIPPED)
    def skip(self, *, reason: str) -> None:
        self.skip_reason = reason[:200]
        self.finished_at = now()

    @transition(field=state, source=[StepState.READY, StepState.RETRYING], target=StepState.QUEUED)
    def enqueue(self, *, queue: str) -> None:
        self.queue = queue
        self.queued_at = now()
        self.next_attempt_at = None

    @transition(field=state, source=StepState.QUEUED, target=StepState.RUNNING)
    def claim(self, *, worker: str, timeout_s: int, lease_s: int) -> None:
        self.attempts += 1
        self.lease_owner = worker
        self.started_at = now()
        self.deadline_at = self.started_at + timedelta(seconds=timeout_s)
        self.lease_expires_at = self.started_at + timedelta(seconds=lease_s)

    @transition(field=state, source=[StepState.READY, StepState.RUNNING], target=StepState.WAITING)
    def await_event(self, *, timeout_s: int) -> None:
        self.started_at = now()
        self.deadline_at = self.started_at + timedelta(seconds=timeout_s)

    @transition(field=state, source=StepState.READY, target=StepState.WAITING)
    def await_time(self, *, wake_at) -> None:
        """A sleep step: waits for `wake_at`, which the reaper watches; it has no deadline of
        its own (the run's duration budget still applies)."""
        self.started_at = now()
        self.wake_at = wake_at
        self.deadline_at = None

    @transition(field=state, source=StepState.READY, target=StepState.WAITING)
    def await_signal(self, *, timeout_s: int, correlation_key: str) -> None:
        """A wait step: waits for its signal until `deadline_at`, found by a correlated event
        through `correlation_key` ("" without one)."""
        self.started_at = now()
        self.deadline_at = self.started_at + timedelta(seconds=timeout_s)
        self.correlation_key = correlation_key

    @transition(field=state, source=[StepState.RUNNING, StepState.WAITING], target=StepState.COMPLETED)
    def complete(self, *, output) -> None:
        self.output = output
        self.error = None
        self.finished_at = now()
        self.lease_owner, self.lease_expires_at = "", None

    @transition(field=state, source=[StepState.RUNNING, StepState.WAITING], target=StepState.RETRYING)
    def schedule_retry(self, *, error: dict, at) -> None:
        self.error = error
        self.next_attempt_at = at
        self.lease_owner, self.lease_expires_at = "", None

    @transition(
        field=state,
        source=[StepState.READY, StepState.QUEUED, StepState.RUNNING, StepState.WAITING,
                StepState.RETRYING],
        target=StepState.FAILED,
    )
    def fail(self, *, error: dict) -> None:
        self.error = error
        self.finished_at = now()
        self.lease_owner, self.lease_expires_at = "", None

    @transition(
        field=state,
        source=[StepState.QUEUED, StepState.RUNNING, StepState.WAITING, StepState.RETRYING],
        target=StepState.TIMED_OUT,
    )
    def time_out(self, *, error: dict) -> None:
        self.error = error
        self.finished_at = now()
        self.lease_owner, self.lease_expires_at = "", None

    @transition(field=state, source=in_order(STEP_OPEN), target=StepState.CANCELLED)
    def cancel(self, *, reason: str) -> None:
        self.skip_reason = reason[:200]
        self.finished_at = now()
        self.lease_owner, self.lease_expires_at = "", None

    @transition(field=state, source=in_order(STEP_RECOVERABLE), target=StepState.QUEUED)
    def redrive(self, *, queue: str) -> None:
        """Run a dead-lettered step again (an explicit, audited operator action)."""
        self.queue = queue
        self.queued_at = now()
        self.error = None
        self.finished_at = None

    @transition(field=state, source=in_order(STEP_RECOVERABLE), target=StepState.SKIPPED)
    def skip_failed(self, *, reason: str) -> None:
        """An operator decides a paused run goes on without this step."""
        self.skip_reason = reason[:200]

    @transition(field=state, source=StepState.CANCELLED, target=StepState.BLOCKED)
    def reopen(self) -> None:
        """Undo a cancellation caused by the run failing, when the run is redriven."""
        self.skip_reason = ""
        self.finished_at = None

class StepAttempt(models.Model):
    """One execution of a step by a worker: who, when, what it cost and how it ended."""

    # Indexed by `attempt_number_unique`, whose first column it is.
    step = models.ForeignKey(StepRun, on_delete=models.CASCADE, related_name="attempt_records",
                             db_index=False)
    number = models.PositiveIntegerField()
    worker = models.CharField(max_length=200)
    started_at = models.DateTimeField(default=now)
    finished_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=16, blank=True, help_text="succeeded, failed or lost")
    error_class = models.CharField(max_length=32, blank=True)
    error_message = models.TextField(blank=True)
    tokens_in = models.PositiveBigIntegerField(default=0)
    tokens_out = models.PositiveBigIntegerField(default=0)
    cost_usd = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal("0"))
    idempotency_key = models.CharField(max_length=255)
    model = models.CharField(max_length=100, blank=True)
    provider = models.CharField(max_length=50, blank=True)
    # What produced the output, so any output can be traced to it (executors' Result.meta).
    model_id = models.CharField(max_length=200, blank=True,
                                help_text="The model version the provider said answered.")
    prompt_hash = models.CharField(max_length=64, blank=True,
                                   help_text="SHA-256 of the prompt templates and our framing.")
    schema_hash = models.CharField(max_length=64, blank=True,
                                   help_text="SHA-256 of the schema the reply had to satisfy.")
    model_params = models.JSONField(default=dict, blank=True,
                                    help_text="temperature, max_tokens, repair bound, output mode.")
    repair_count = models.PositiveSmallIntegerField(
        default=0, help_text="Replies sent back to the model with their validation problems.")
    proposal_hash = models.CharField(max_length=64, blank=True,
                                     help_text="SHA-256 of the canonical proposed action.")
    risk_tier = models.CharField(max_length=16, blank=True)
    decision = models.JSONField(null=True, blank=True, help_text="A router's choice and why.")
    reused_from = models.JSONField(
        null=True, blank=True,
        help_text="The attempt copied an earlier run's output instead of calling anything: "
                  "{run, step} it came from (services/results_cache.py).")
    routes = models.JSONField(
        default=list, blank=True,
        help_text="Each model route the attempt's calls tried or skipped, in order: route, "
                  "provider, model_id, outcome, error class, tokens, cost, duration.")
    attestation = models.JSONField(
        null=True, blank=True,
        help_text="The record the worker signed as the attempt succeeded (engine/attestation.py).")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["step", "number"], name="attempt_number_unique")]
        # The costs report reads the calls of a range of days through it (budgets/selectors.py).
        indexes = [models.Index(fields=["finished_at"], name="attempt_finished")]
        ordering = ["step", "number"]

    def __str__(self) -> str:
        return f"attempt {self.number} of step {self.step_id} ({self.outcome or 'running'})"


class MapItem(models.Model):
    """One item of a map step's fan-out; its result is persisted before the chord joins.

    An item has the life of a small step: claimed under a lease its worker's heartbeat renews
    (the run's max_parallel caps the leases held at once), retried under the item's `retry`
    policy, and recovered by the reaper when its worker dies, it overruns its timeout_s, or its
    message is lost.
    """

    # Indexed by `map_item_unique`, whose first column it is.
    step = models.ForeignKey(StepRun, on_delete=models.CASCADE, related_name="map_items",
                             db_index=False)
    index = models.PositiveIntegerField()
    item = ArtifactJSONField(null=True)
    attempts = models.PositiveIntegerField(default=0)
    claimed_at = models.DateTimeField(null=True, blank=True)  # when the current attempt began
    lease_expires_at = models.DateTimeField(null=True, blank=True)  # set while an attempt runs
    deadline_at = models.DateTimeField(null=True, blank=True)  # the running attempt's timeout
    due_at = models.DateTimeField(default=now)  # when the next attempt may start
    sent_at = models.DateTimeField(default=now)  # when the last message sent for it was to arrive
    done = models.BooleanField(default=False)
    output = ArtifactJSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    tokens_in = models.PositiveBigIntegerField(default=0)
    tokens_out = models.PositiveBigIntegerField(default=0)
    cost_usd = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal("0"))
    finished_at = models.DateTimeField(null=True, blank=True)
    attestation = models.JSONField(
        null=True, blank=True,
        help_text="The record the worker signed as the item's attempt succeeded "
                  "(engine/attestation.py); the join reads no output without one that holds.")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["step", "index"], name="map_item_unique")]
        # The costs report's read of a range of days' model calls (budgets/selectors.py).
        indexes = [models.Index(fields=["finished_at"], name="map_item_finished",
                                condition=models.Q(attempts__gt=0))]
        ordering = ["step", "index"]

    def __str__(self) -> str:
        return f"item {self.index} of step {self.step_id}"


class Event(models.Model):
    """The transactional outbox: one row per transition, written in the same transaction.

    The audit ledger, the live dashboard and notifications read from here.
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events")
    step = models.ForeignKey(StepRun, null=True, blank=True, on_delete=models.CASCADE)
    kind = models.CharField(max_length=64)
    actor = models.CharField(max_length=200, default="service:stepwise")
    payload = ArtifactJSONField(default=dict)
    created_at = models.DateTimeField(default=now, db_index=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.kind} @ {self.created_at:%H:%M:%S.%f}"


class Signal(models.Model):
    """A named signal sent to a run (by the API, the Python client or a correlated trigger
    event), kept once per (run, name, key): a send repeated with its key finds this row and
    changes nothing. `consumed` by the wait step it completed, or `buffered` until a wait step
    for its name starts (services/signals.py)."""

    class State(models.TextChoices):
        BUFFERED = "buffered", "buffered: no step waited for it yet"
        CONSUMED = "consumed", "consumed: a wait step completed with it"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="signals")
    name = models.CharField(max_length=64)
    key = models.CharField(max_length=200, help_text="The sender's idempotency key.")
    payload = ArtifactJSONField(default=dict)
    state = models.CharField(max_length=16, choices=State.choices)
    step = models.ForeignKey(StepRun, null=True, blank=True, on_delete=models.CASCADE,
                             related_name="signals", help_text="The wait step it completed.")
    sent_by = models.CharField(max_length=200, help_text='"user:<name>", or the trigger\'s actor.')
    origin = models.JSONField(default=dict, blank=True,
                              help_text="Where it came from: the API, or a trigger's event.")
    created_at = models.DateTimeField(default=now)
    consumed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "name", "key"],
                                               name="one_signal_per_key")]
        indexes = [models.Index(fields=["run", "name", "id"], name="signal_buffered",
                                condition=models.Q(state="buffered"))]
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.name} {self.key} ({self.state})"


class Effect(models.Model):
    """The idempotency ledger for side effects: one row per logical action, ever.

    The key is stable — (run, step, logical action), never random, never per attempt — and
    unique, so a replay finds the stored result instead of acting again. A row left `started`
    means the outcome is uncertain (the worker died during the call): it is reconciled, never
    blindly repeated.
    """

    class Status(models.TextChoices):
        STARTED = "started"
        SUCCEEDED = "succeeded"
        FAILED = "failed"

    key = models.CharField(max_length=255, unique=True)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="effects")
    step = models.ForeignKey(StepRun, on_delete=models.CASCADE, related_name="effects")
    action = models.CharField(max_length=32, default="default", help_text="default or compensate")
    tool = models.CharField(max_length=100)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.STARTED)
    attempts = models.PositiveIntegerField(default=1)
    # The fencing token of the attempt that last started the effect (0: unfenced): an older
    # attempt may neither restart it nor record its outcome (services/effects.py).
    fence = models.PositiveIntegerField(default=0)
    result = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    started_at = models.DateTimeField(default=now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["started_at"]

    def __str__(self) -> str:
        return f"{self.key} ({self.status})"


class DeadLetter(models.Model):
    """Work that exhausted its retries, or a message that could not be processed.

    Browsable in admin and the API; `dead_letter_redrive` is the only way back, explicit and
    audited.
    """

    class Status(models.TextChoices):
        OPEN = "open"
        REDRIVEN = "redriven"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="dead_letters")
    step = models.ForeignKey(StepRun, on_delete=models.CASCADE, related_name="dead_letters")
    error_class = models.CharField(max_length=32)
    error_message = models.TextField(blank=True)
    attempts = models.PositiveIntegerField(default=0)
    payload_ref = models.CharField(max_length=200, help_text="Where the step input lives.")
    trace_id = models.CharField(max_length=100, help_text="Correlates logs, events and audit.")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.OPEN)
    created_at = models.DateTimeField(default=now)  # indexed by dead_letter_created_id
    redriven_at = models.DateTimeField(null=True, blank=True)
    redriven_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                    on_delete=models.SET_NULL)

    class Meta:
        # The dead-letter list: a keyset page, newest first, by status or not.
        indexes = [
            models.Index(fields=["created_at", "id"], name="dead_letter_created_id"),
            models.Index(fields=["status", "created_at", "id"], name="dead_letter_status_created"),
        ]
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"dead letter {self.id}: {self.step} {self.error_class}"


class WorkerHeartbeat(models.Model):
    """Workers say they are alive here, whatever the broker (health's "workers seen")."""

    hostname = models.CharField(max_length=200, unique=True)
    queues = models.JSONField(default=list)
    pid = models.PositiveIntegerField(default=0)
    last_seen = models.DateTimeField(default=now)

    def __str__(self) -> str:
        return f"{self.hostname} ({self.last_seen:%H:%M:%S})"


class Leadership(models.Model):
    """A leader lease: who may do work that must not run twice at once (services/leadership.py)."""

    name = models.CharField(max_length=64, unique=True)
    holder = models.CharField(max_length=200)
    expires_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.name}: {self.holder} until {self.expires_at:%H:%M:%S}"


class StepResult(models.Model):
    """A step's output kept for reuse (services/results_cache.py, docs/definitions.md#cache).

    Found by its team and the fingerprint of everything that decided it (the rendered key, the
    prompt, model and provider, output schema, tool and version, the step's definition), until
    it expires; one team never reads another's. It says which run and step produced it.
    """

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="step_results")
    fingerprint = models.CharField(max_length=64, help_text="SHA-256 of what decided the output.")
    key = models.CharField(max_length=200, blank=True,
                           help_text="The rendered cache key (its start), for people.")
    output = ArtifactJSONField(null=True, blank=True)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+",
                            help_text="The run whose step produced the output.")
    step = models.ForeignKey(StepRun, on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField(default=now)
    expires_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "fingerprint"],
                                               name="step_result_per_fingerprint")]
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.fingerprint[:12]} of {self.team} (until {self.expires_at:%Y-%m-%d %H:%M})"


class Rerun(CachedStateFieldsMixin, models.Model):
    """A bulk re-run: chosen runs of one workflow started again with their own input on a chosen
    version (`services.reruns`), one `RerunItem` per source run.

    `key` (the person's Idempotency-Key, or the admin form's) is unique per team: asking again
    with it returns this batch and starts nothing twice. The counts are kept from the items as
    a worker starts them, in chunks, so a page can show the progress.
    """

    class State(models.TextChoices):
        RUNNING = "running", "running: its runs are being started"
        DONE = "done", "done: every source run was started again or refused"

    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="reruns")
    version = models.ForeignKey(WorkflowVersion, on_delete=models.PROTECT, related_name="reruns",
                                help_text="The version every new run is pinned to.")
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                     on_delete=models.SET_NULL, related_name="+")
    actor = models.CharField(max_length=200, help_text='Who asked: "user:<name>" or the engine.')
    key = models.CharField(max_length=255, help_text="The batch's idempotency key.")
    request_digest = models.CharField(max_length=64, help_text="Proves a repeat is the same request.")
    selection = models.JSONField(default=dict, help_text='What was asked: {"runs": [...]} or {"filter": {...}}.')
    state = FSMField(default=State.RUNNING, choices=State.choices, protected=True)
    total = models.PositiveIntegerField(default=0)
    started = models.PositiveIntegerField(default=0)
    refused = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(default=now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "key"], name="rerun_key_per_team")]
        indexes = [models.Index(fields=["state"], name="rerun_state",
                                condition=models.Q(state="running"))]
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"re-run {self.id} of {self.total} run(s) on {self.version} ({self.state})"

    @transition(field=state, source=State.RUNNING, target=State.DONE)
    def finish(self) -> None:
        self.finished_at = now()


class RerunItem(models.Model):
    """One source run of a re-run: pending, then started again (`new_run`) or refused (`reason`)."""

    class Outcome(models.TextChoices):
        PENDING = "pending", "pending: not started yet"
        STARTED = "started", "started: its new run was created"
        REFUSED = "refused", "refused: not started, for the reason given"

    rerun = models.ForeignKey(Rerun, on_delete=models.CASCADE, related_name="items")
    position = models.PositiveIntegerField()
    source_run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="rerun_items")
    outcome = models.CharField(max_length=16, choices=Outcome.choices, default=Outcome.PENDING)
    new_run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.SET_NULL,
                                related_name="rerun_of")
    reason = models.TextField(blank=True, help_text="Why it was refused, in one line.")
    problems = models.JSONField(default=list, blank=True,
                                help_text="The refusal's problems, each {path, message}.")
    retry_after_s = models.PositiveIntegerField(null=True, blank=True,
                                                help_text="When a budget's refusal may pass.")
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["rerun", "source_run"], name="rerun_source_once"),
            models.UniqueConstraint(fields=["rerun", "position"], name="rerun_position_unique"),
        ]
        ordering = ["rerun", "position"]

    def __str__(self) -> str:
        return f"source run {self.source_run_id} of re-run {self.rerun_id} ({self.outcome})"


class WorkerKey(models.Model):
    """A process's attestation key (engine/attestation.py): the public half of the Ed25519 key a
    worker or web process signs its steps' outputs with. Registered by the process as it starts
    (or provisioned by an operator first); a revoked key's records no longer let a run advance."""

    key_id = models.CharField(max_length=40, primary_key=True)
    public_key = models.CharField(max_length=64, help_text="Base64 of the raw 32-byte public key.")
    process = models.CharField(max_length=200, blank=True,
                               help_text="The worker or process that registered it.")
    provisioned = models.BooleanField(default=False,
                                      help_text="Added by an operator before any process used it.")
    registered_at = models.DateTimeField(default=now)
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["-registered_at"]

    def __str__(self) -> str:
        return f"{self.key_id} ({self.process or 'provisioned'})"


class SsoGrant(models.Model):
    """A team membership, a Django group or the staff flag that single sign-on gave a person.

    Each sign-in changes only what is recorded here (orchestrator/web/sso/), so a membership,
    a group or the staff flag granted locally stays whatever the identity provider says.
    """

    class Kind(models.TextChoices):
        TEAM = "team"
        GROUP = "group"
        STAFF = "staff"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="sso_grants")
    kind = models.CharField(max_length=8, choices=Kind.choices)
    #: The team's slug or the group's name; empty for the staff flag.
    name = models.CharField(max_length=150, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "kind", "name"],
                                               name="one_sso_grant_per_target")]

    def __str__(self) -> str:
        return f"{self.kind} {self.name} of {self.user} (single sign-on)"
