"""Evaluation datasets: named sets of cases per workflow, kept as immutable versions.

A `Dataset` belongs to one workflow (and so to its team). Its cases are never edited in place:
every change writes a new `DatasetVersion` holding the whole set of cases as it is after the
change (`evaluation.services`), so whatever later pins a version reads the same cases for ever.
A `Case` is an input for the workflow, the outcome expected of the run and of its steps
(`evaluation.expected` documents and checks the shape), a risk tier and tags. Large inputs and
expectations are stored as artifacts, like a step's output.

Plain models: they hold data and refuse being changed once written; they import no service.
"""
from decimal import Decimal

from django.conf import settings
from django.db import models
from django_fsm import ConcurrentTransitionMixin, FSMField, transition

from orchestrator.engine.artifacts import ArtifactJSONField
from orchestrator.engine.clock import now
from orchestrator.models import Run, Team, Workflow


class RiskTier(models.TextChoices):
    """How much a wrong outcome of a case costs: results are read per tier, never averaged."""

    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"


class Immutable(models.Model):
    """A row written once: saving it again raises, so no code path rewrites history."""

    class Meta:
        abstract = True

    def save(self, *args, **kwargs):
        if not self._state.adding:
            raise ValueError(f"a {type(self).__name__} is immutable once written; write a new version")
        super().save(*args, **kwargs)


class Dataset(models.Model):
    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="datasets")
    workflow = models.ForeignKey(Workflow, on_delete=models.PROTECT, related_name="datasets")
    name = models.SlugField(max_length=100, help_text="Unique among the workflow's datasets.")
    description = models.TextField(blank=True, max_length=2000)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=now)

    class Meta:
        ordering = ["workflow_id", "name"]
        constraints = [models.UniqueConstraint(fields=["workflow", "name"], name="dataset_name_per_workflow")]

    def __str__(self) -> str:
        return f"{self.workflow.name}/{self.name}"

    @property
    def latest_version(self) -> "DatasetVersion | None":
        return self.versions.order_by("-number").first()


class DatasetVersion(Immutable):
    """The dataset's cases after one change. Version 1 is the empty set the dataset starts with."""

    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=now)
    note = models.CharField(max_length=500, blank=True, help_text="What changed, in words.")
    change = models.CharField(max_length=16, help_text="created, added, replaced, removed or from_run")
    workflow_version = models.ForeignKey(
        "orchestrator.WorkflowVersion", null=True, blank=True, on_delete=models.PROTECT, related_name="+",
        help_text="The workflow version whose input schema and steps the new cases were checked against.")
    case_count = models.PositiveIntegerField(default=0)
    tier_counts = models.JSONField(default=dict, help_text='{"low": n, "medium": n, "high": n}')
    digest = models.CharField(max_length=64, help_text="SHA-256 over the cases' keys and digests, by key.")

    class Meta:
        ordering = ["dataset_id", "-number"]
        constraints = [models.UniqueConstraint(fields=["dataset", "number"], name="dataset_version_number")]

    def __str__(self) -> str:
        return f"{self.dataset} v{self.number}"


class Case(Immutable):
    version = models.ForeignKey(DatasetVersion, on_delete=models.CASCADE, related_name="cases")
    key = models.CharField(max_length=200, help_text="Names the case across versions.")
    input = ArtifactJSONField(help_text="The run input.")
    expected = ArtifactJSONField(help_text="The expected outcome (docs/evaluation.md).")
    risk_tier = models.CharField(max_length=8, choices=RiskTier.choices)
    tags = models.JSONField(default=list, blank=True)
    responses = ArtifactJSONField(default=dict, blank=True, help_text=(
        "What a side-effecting step answers in an evaluation (its output), by step name: the "
        "step itself never runs there."))
    source_run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
                                   help_text="The finished run the case was made from, if any.")
    digest = models.CharField(max_length=64, help_text="SHA-256 of key, input, expected, tier and tags.")

    class Meta:
        ordering = ["version_id", "key"]
        constraints = [models.UniqueConstraint(fields=["version", "key"], name="case_key_per_version")]

    def __str__(self) -> str:
        return self.key


# --- evaluations: a workflow version run over a dataset version, sandboxed, and scored --------


class EvaluationState(models.TextChoices):
    RUNNING = "running"
    COMPLETED = "completed"  # every case ran and was scored
    STOPPED = "stopped"  # its budget ran out: the cases not yet run are left unscored
    CANCELLED = "cancelled"


class Purpose(models.TextChoices):
    EVALUATION = "evaluation", "over a dataset"
    SHADOW = "shadow", "beside live runs"


class Evaluation(ConcurrentTransitionMixin, models.Model):
    """One version of a workflow run over one version of a dataset (or, in shadow, over a sample
    of the live runs of the published version), each case a sandboxed run on the evaluation
    capacity class (`evaluation.evaluations`). `summary` is written once it ends: every metric
    per risk tier and overall (`evaluation.scoring.summarize`)."""

    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="evaluations")
    workflow = models.ForeignKey(Workflow, on_delete=models.PROTECT, related_name="evaluations")
    version = models.ForeignKey("orchestrator.WorkflowVersion", on_delete=models.PROTECT, related_name="evaluations")
    purpose = models.CharField(max_length=10, choices=Purpose.choices, default=Purpose.EVALUATION)
    dataset_version = models.ForeignKey(DatasetVersion, null=True, blank=True, on_delete=models.PROTECT,
                                        related_name="evaluations", help_text="Its cases (not in shadow).")
    # Shadow only: the live runs of `baseline` that ended after the start, `sample_percent` of
    # them chosen by their id, at most `max_cases`; `examined_until` is how far they were read.
    baseline = models.ForeignKey("orchestrator.WorkflowVersion", null=True, blank=True, on_delete=models.PROTECT,
                                 related_name="+", help_text="The published version a shadow compares with.")
    sample_percent = models.PositiveSmallIntegerField(null=True, blank=True)
    max_cases = models.PositiveIntegerField(null=True, blank=True)
    examined_until = models.DateTimeField(null=True, blank=True)
    state = FSMField(default=EvaluationState.RUNNING, choices=EvaluationState.choices, protected=True)
    budget_usd = models.DecimalField(max_digits=12, decimal_places=6,
                                     help_text="No case starts once the runs have cost this much.")
    cost_usd = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal("0"))
    concurrency = models.PositiveIntegerField(help_text="At most this many of its runs at a time.")
    sandbox_connections = models.JSONField(default=dict, blank=True, help_text=(
        "Named connections whose side-effecting calls go, in its runs, to the sandbox connection "
        "named beside each (an operator's test account), instead of being answered."))
    note = models.CharField(max_length=500, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=now, db_index=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    stop_reason = models.CharField(max_length=500, blank=True)
    summary = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["version", "dataset_version", "state"], name="evaluation_of_version")]

    def __str__(self) -> str:
        return f"evaluation {self.pk} of {self.workflow.name} v{self.version.number}"

    @property
    def is_finished(self) -> bool:
        return self.state != EvaluationState.RUNNING

    @transition(field=state, source=EvaluationState.RUNNING, target=EvaluationState.COMPLETED)
    def complete(self, *, summary: dict) -> None:
        self.summary, self.finished_at = summary, now()

    @transition(field=state, source=EvaluationState.RUNNING, target=EvaluationState.STOPPED)
    def stop(self, *, reason: str, summary: dict) -> None:
        self.stop_reason, self.summary, self.finished_at = reason, summary, now()

    @transition(field=state, source=EvaluationState.RUNNING, target=EvaluationState.CANCELLED)
    def cancel(self, *, reason: str, summary: dict) -> None:
        self.stop_reason, self.summary, self.finished_at = reason, summary, now()


class CaseRunState(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    SCORED = "scored"
    NOT_RUN = "not_run"  # the evaluation stopped or was cancelled before it started


class EvaluationCase(models.Model):
    """One case of an evaluation: its run, what the run did (`outcome`, `selectors.outcome_of_run`)
    and its scores against the case's expected outcome."""

    evaluation = models.ForeignKey(Evaluation, on_delete=models.CASCADE, related_name="cases")
    case = models.ForeignKey(Case, null=True, blank=True, on_delete=models.PROTECT, related_name="+",
                             help_text="The dataset's case (none in shadow).")
    live_run = models.OneToOneField(Run, null=True, blank=True, on_delete=models.SET_NULL, related_name="shadowed_by",
                                    help_text="In shadow: the live run whose input this case ran again.")
    expected = models.JSONField(null=True, blank=True,
                                help_text="In shadow: what the live run did, as the expected outcome.")
    key = models.CharField(max_length=200)
    risk_tier = models.CharField(max_length=8, choices=RiskTier.choices)
    state = models.CharField(max_length=8, choices=CaseRunState.choices, default=CaseRunState.PENDING)
    run = models.OneToOneField(Run, null=True, blank=True, on_delete=models.SET_NULL, related_name="evaluation_case")
    outcome = models.JSONField(null=True, blank=True)
    scores = models.JSONField(null=True, blank=True)
    passed = models.BooleanField(null=True)
    error = models.CharField(max_length=1000, blank=True, help_text="Why the case's run could not start.")
    grading_cost_usd = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal("0"),
                                           help_text="What grading its rubrics by a model cost.")

    class Meta:
        ordering = ["evaluation_id", "key"]
        constraints = [models.UniqueConstraint(fields=["evaluation", "key"], name="evaluation_case_key")]
        indexes = [models.Index(fields=["evaluation", "state"], name="evaluation_case_state")]

    def __str__(self) -> str:
        return self.key


class ReleasePolicy(models.Model):
    """What a version of the workflow must show on `dataset` before it is published
    (`evaluation.gate`): thresholds per risk tier (`evaluation.policy.POLICY_SCHEMA`)."""

    workflow = models.OneToOneField(Workflow, on_delete=models.CASCADE, related_name="release_policy")
    dataset = models.ForeignKey(Dataset, on_delete=models.PROTECT, related_name="+")
    thresholds = models.JSONField()
    updated_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    updated_at = models.DateTimeField(default=now)

    class Meta:
        verbose_name_plural = "release policies"

    def __str__(self) -> str:
        return f"release policy of {self.workflow.name}"
