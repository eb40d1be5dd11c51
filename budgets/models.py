"""Budgets' own rows: limits per team and workflow, model prices, the reservation ledger, and
the overrides and alerts of one run.

Spend itself is accumulated on runs, steps, attempts and map items (orchestrator.models); the
`Reservation` ledger is what every dispatch of a model call is checked and counted against
(`budgets.services`). Nothing here writes another row or makes a network call.
"""
from decimal import Decimal

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from orchestrator.engine.clock import now
from orchestrator.models import Run, StepRun, Team, Workflow

USD = {"max_digits": 12, "decimal_places": 6}


class BudgetLimit(models.Model):
    """A team's (or, with `workflow`, one workflow's) limits over a period of time.

    Effective-dated: the row in force at a moment is the one with the latest `effective_from`
    not after it, and whose `effective_to` (if any) is after it. A change is a new row, so what
    was in force when a run was refused stays readable.
    """

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="budget_limits")
    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, null=True, blank=True,
                                 related_name="budget_limits",
                                 help_text="Empty: the limit is the whole team's.")
    daily_usd = models.DecimalField(**USD, null=True, blank=True,
                                    validators=[MinValueValidator(Decimal(0))],
                                    help_text="Spend per UTC day (empty: no limit).")
    monthly_usd = models.DecimalField(**USD, null=True, blank=True,
                                      validators=[MinValueValidator(Decimal(0))],
                                      help_text="Spend per UTC calendar month (empty: no limit).")
    max_concurrent_runs = models.PositiveIntegerField(
        null=True, blank=True,
        help_text="Unfinished runs at once, on every start path (API, builder, triggers); child "
                  "runs do not count. Empty: a team's is STEPWISE_TEAM_MAX_LIVE_RUNS, a "
                  "workflow's none.")
    warn_at = models.DecimalField(max_digits=4, decimal_places=3, default=Decimal("0.8"),
                                  validators=[MinValueValidator(Decimal(0)), MaxValueValidator(Decimal(1))],
                                  help_text="Alert once when this fraction of a limit is committed.")
    effective_from = models.DateTimeField(default=now)
    effective_to = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=now)

    class Meta:
        ordering = ["team", "workflow", "-effective_from"]
        indexes = [models.Index(fields=["team", "workflow", "effective_from"], name="budget_limit_in_force")]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(effective_to__isnull=True) | models.Q(effective_to__gt=models.F("effective_from")),
                name="budget_limit_period_ordered"),
        ]

    def __str__(self) -> str:
        return f"{self.team} / {self.workflow.name}" if self.workflow_id else f"{self.team}"

    @property
    def scope(self) -> str:
        return "workflow" if self.workflow_id else "team"


class ModelPrice(models.Model):
    """What a model's tokens cost from `effective_from` on. An attempt is priced when it runs,
    so a new price never rewrites a past cost; without a row, the registry's price applies."""

    model = models.CharField(max_length=100, help_text="A name in STEPWISE_MODELS.")
    input_usd_per_mtok = models.DecimalField(**USD, validators=[MinValueValidator(Decimal(0))])
    output_usd_per_mtok = models.DecimalField(**USD, validators=[MinValueValidator(Decimal(0))])
    effective_from = models.DateTimeField(default=now)
    created_at = models.DateTimeField(default=now)

    class Meta:
        ordering = ["model", "-effective_from"]
        constraints = [models.UniqueConstraint(fields=["model", "effective_from"], name="one_price_per_moment")]

    def __str__(self) -> str:
        return f"{self.model} from {self.effective_from:%Y-%m-%d %H:%M}"


class Reservation(models.Model):
    """The projected cost of one model call held against every budget level before it is
    dispatched, then settled to what it cost (or released when it never ran)."""

    class State(models.TextChoices):
        RESERVED = "reserved"
        SETTLED = "settled"
        RELEASED = "released"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="reservations")
    step = models.ForeignKey(StepRun, on_delete=models.CASCADE, related_name="reservations")
    # Denormalized so a team's or a workflow's period is one indexed sum.
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="+")
    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="+")
    attempt = models.PositiveIntegerField()
    item = models.IntegerField(default=-1, help_text="The map item's index; -1 for the step itself.")
    turn = models.PositiveSmallIntegerField(
        default=0, help_text="The attempt's model call: 0 the first, n its n-th repair turn.")
    model = models.CharField(max_length=100, blank=True)
    levels = models.JSONField(default=list, help_text="The levels it was checked against.")
    amount = models.DecimalField(**USD, help_text="What was reserved.")
    actual = models.DecimalField(**USD, null=True, blank=True, help_text="What it cost, once settled.")
    state = models.CharField(max_length=16, choices=State.choices, default=State.RESERVED)
    created_at = models.DateTimeField(default=now, db_index=True)
    settled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [models.UniqueConstraint(fields=["step", "attempt", "item", "turn"],
                                               name="one_reservation_per_call")]
        indexes = [models.Index(fields=["team", "created_at"], name="reservation_team_period"),
                   models.Index(fields=["workflow", "created_at"], name="reservation_workflow_period"),
                   models.Index(fields=["run", "state"], name="reservation_run_state")]

    def __str__(self) -> str:
        turn = f" turn {self.turn}" if self.turn else ""
        return f"{self.step} #{self.attempt}{turn} {self.state} ${self.amount}"


class BudgetOverride(models.Model):
    """An operator raised one run's limit — its cost, its duration, or both (the definition
    stays as it was). The latest override that sets a limit is the one in force."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="budget_overrides")
    max_cost_usd = models.DecimalField(**USD, null=True, blank=True,
                                       validators=[MinValueValidator(Decimal(0))],
                                       help_text="The run's cost limit from now on (empty: unchanged).")
    max_duration_s = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)],
        help_text="Wall-clock seconds from the run's start (empty: unchanged).")
    reason = models.CharField(max_length=500)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    actor = models.CharField(max_length=200)
    created_at = models.DateTimeField(default=now)

    class Meta:
        ordering = ["run", "-created_at"]
        constraints = [models.CheckConstraint(
            condition=models.Q(max_cost_usd__isnull=False) | models.Q(max_duration_s__isnull=False),
            name="budget_override_raises_something")]

    def __str__(self) -> str:
        raised = [f"${self.max_cost_usd}" if self.max_cost_usd is not None else "",
                  f"{self.max_duration_s}s" if self.max_duration_s is not None else ""]
        return f"{self.run_id}: {' '.join(r for r in raised if r)}"


class BudgetAlert(models.Model):
    """That an alert of `kind` went out for a run and a level (or a team's period), so it
    goes out once — not once per denied dispatch."""

    kind = models.CharField(max_length=32, help_text="budget.warning or budget.denied")
    key = models.CharField(max_length=200, help_text="run:<id>:<level>, or team:<id>:<level>:<period>")
    created_at = models.DateTimeField(default=now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["kind", "key"], name="one_budget_alert")]

    def __str__(self) -> str:
        return f"{self.kind} {self.key}"


class CostDay(models.Model):
    """What one team's model calls of one workflow and model cost on one day that is over (in
    the site's time zone `zone`): the costs report reads these for the days it covers rather
    than every call (budgets/selectors.py). Written once per day, by the first report that
    covers the day after it ended, never by the engine."""

    zone = models.CharField(max_length=64)
    day = models.DateField()
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="+")
    workflow = models.CharField(max_length=200)
    model = models.CharField(max_length=100, blank=True)
    cost_usd = models.DecimalField(max_digits=16, decimal_places=6, default=Decimal("0"))
    tokens_in = models.PositiveBigIntegerField(default=0)
    tokens_out = models.PositiveBigIntegerField(default=0)
    calls = models.PositiveBigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["zone", "day", "team", "workflow", "model"],
                                               name="one_cost_day")]

    def __str__(self) -> str:
        return f"{self.day} {self.team_id} {self.workflow} {self.model}: {self.cost_usd}"


class CostDayDone(models.Model):
    """That the CostDay rows of `day` (in `zone`) are written: a day without calls has this
    and no CostDay."""

    zone = models.CharField(max_length=64)
    day = models.DateField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["zone", "day"], name="one_cost_day_done")]

    def __str__(self) -> str:
        return f"{self.zone} {self.day}"


class CostReport(Reservation):
    """The admin's cost page (no table of its own: a view over what calls cost)."""

    class Meta:
        proxy = True
        verbose_name = verbose_name_plural = "costs"
