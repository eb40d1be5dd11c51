"""Cost and latency budgets: prices, estimates, and the reservation every model call makes
before it is dispatched.

- `cost_of` prices a call's tokens at the time it ran (a `ModelPrice` row in force then, else
  the model registry in settings), so a new price never rewrites a past cost.
- `call_estimate` is what one more call of a step is expected to cost: what is left under the
  step's own `max_cost_usd`, else the average of the step's recent attempts with that model,
  else of the model's, else `STEPWISE_DEFAULT_STEP_COST_USD` (the design's $0.10).
- `budget_reserve` holds the estimate against every level that applies — the step, the run,
  the workflow's and the team's day and month — in the caller's transaction, with the run row
  and the limit rows locked (`select_for_update`; SQLite's IMMEDIATE transactions serialize
  writers), so two dispatches racing for the last of a budget cannot both pass. It returns a
  `Denial` naming the level and the figures, and writes nothing, when a limit would be crossed.
- `budget_settle` records what a call cost; `budget_release` frees what never ran.
- `budget_admit` refuses a new run past a team's or workflow's concurrent-run cap (the one
  cap on a team's unfinished runs, on every start path) or spent period (`BudgetExceeded`); `budget_limit_create` records a limit and `model_price_create` a
  model's price, each audited.

Runs of the evaluation capacity (`RunCapacity`) are held to their own budget (the step's and
the run's levels) and their evaluation's, never to a team's or workflow's: they are not admitted
against its caps, not counted among its unfinished runs, and their calls neither count toward
its day and month nor are checked against them.

Callers (the engine's services) pause the run and alert on a denial; nothing here changes a
run, dispatches or sends anything.
"""
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Case, DecimalField, F, Q, QuerySet, Sum, Value, When
from django.db.models.functions import Coalesce

from audit.services import audit_record
from orchestrator.engine.authz import Action, Actor, label, person, require
from orchestrator.engine.clock import now
from orchestrator.engine.definitions import ExpressionError, calls_model, evaluate_expression
from orchestrator.engine.errors import BudgetExceeded, Forbidden
from orchestrator.engine.states import RUN_TERMINAL, RunCapacity
from orchestrator.models import Run, StepAttempt, StepRun, Team, Workflow
from orchestrator.store import Read

from .models import BudgetLimit, BudgetOverride, ModelPrice, Reservation

MTOK = Decimal(1_000_000)
CENT = Decimal("0.01")
ZERO = Decimal(0)
# How many of a step's latest attempts its estimate averages.
RECENT_ATTEMPTS = 20


# --- prices -------------------------------------------------------------------------------


def price_of(model: str, model_config: dict, *, at: datetime | None = None) -> tuple[Decimal, Decimal]:
    """(input, output) USD per million tokens of `model` at `at` (now): the `ModelPrice` in
    force then, else the registry's prices in `model_config` (a missing price is 0)."""
    if model:
        row = (ModelPrice.objects.filter(model=model, effective_from__lte=at or now())
               .order_by("-effective_from").values_list("input_usd_per_mtok", "output_usd_per_mtok").first())
        if row:
            return row
    return (Decimal(str(model_config.get("input_usd_per_mtok", 0))),
            Decimal(str(model_config.get("output_usd_per_mtok", 0))))


def cost_of(model_config: dict, tokens_in: int, tokens_out: int, *, model: str = "",
            at: datetime | None = None) -> Decimal:
    """USD for a call of `model` made at `at` (now) (see `price_of`)."""
    price_in, price_out = price_of(model, model_config, at=at)
    return (price_in * tokens_in + price_out * tokens_out) / MTOK


def usd(value: Decimal) -> str:
    """A figure as the API and the ledger show it: six decimals, like the cost columns."""
    return str(Decimal(value).quantize(Decimal("0.000001")))


# --- estimates ----------------------------------------------------------------------------


def _model_of(spec: dict) -> str:
    return spec.get("model") or ""


def _average(attempts: QuerySet) -> Decimal | None:
    recent = list(attempts.order_by("-id").values_list("cost_usd", flat=True)[:RECENT_ATTEMPTS])
    return sum(recent, ZERO) / len(recent) if recent else None


def history_estimate(spec: dict, *, workflow_id: int | None = None, step_name: str = "") -> Decimal:
    """One call of `spec` (an agent, an llm router, a map's item body): the average of the
    recent succeeded attempts of the same step and model, else of the model, else the default.
    0 for a spec that calls no model."""
    if not calls_model(spec):
        return ZERO
    model = _model_of(spec)
    succeeded = StepAttempt.objects.filter(model=model, outcome="succeeded")
    if workflow_id and step_name:
        average = _average(succeeded.filter(step__name=step_name, step__run__version__workflow_id=workflow_id))
        if average is not None:
            return average
    average = _average(succeeded)
    return average if average is not None else Decimal(settings.STEPWISE_DEFAULT_STEP_COST_USD)


def projected_cost(spec: dict) -> Decimal:
    """What one more attempt of `spec` (a step, or a map of it) is expected to cost."""
    return history_estimate(spec["item"] if spec["type"] == "map" else spec)


def model_calls(spec: dict) -> dict | None:
    """The spec whose calls are reserved for a step (the step, or a map's item), or None when
    the step calls no model (tools, gates, sub-workflows: nothing to reserve)."""
    body = spec.get("item") if spec["type"] == "map" else spec
    return body if body and calls_model(body) else None


@dataclass(frozen=True)
class StepEstimate:
    step: str
    calls: int
    cost_usd: Decimal
    duration_s: float | None


@dataclass(frozen=True)
class RunEstimate:
    cost_usd: Decimal
    duration_s: float
    limit_usd: Decimal | None
    steps: list[StepEstimate]

    @property
    def within_budget(self) -> bool:
        return self.limit_usd is None or self.cost_usd <= self.limit_usd


def _calls_of(spec: dict, run_input: dict) -> int:
    """How many model calls one attempt of `spec` makes: a map's items when its list can be
    told from the run input alone, else one."""
    if model_calls(spec) is None:
        return 0
    if spec["type"] != "map":
        return 1
    try:
        items = evaluate_expression(spec["over"], {"input": run_input, "steps": {}})
    except ExpressionError:
        return 1  # it reads an upstream step's output: one item is the floor
    return len(items) if isinstance(items, list) else 1


def _average_duration(workflow_id: int, step_name: str) -> float | None:
    recent = list(StepRun.objects.filter(
        run__version__workflow_id=workflow_id, name=step_name, state="completed",
        started_at__isnull=False, finished_at__isnull=False,
    ).order_by("-id").values_list("started_at", "finished_at")[:RECENT_ATTEMPTS])
    if not recent:
        return None
    return sum((end - begin).total_seconds() for begin, end in recent) / len(recent)


def run_estimate(*, version, run_input: dict) -> RunEstimate:
    """What a run of `version` with `run_input` is projected to cost and take, from the same
    estimates the reservations use (one attempt of every model step; a map per item) and the
    average durations of the workflow's past steps along its longest chain. Starts nothing."""
    definition = version.normalized
    workflow_id = version.workflow_id
    steps: list[StepEstimate] = []
    for spec in definition["steps"]:
        calls = _calls_of(spec, run_input)
        cap = spec.get("max_cost_usd")
        if not calls:
            each = ZERO
        elif cap is not None and spec["type"] != "map":
            each = Decimal(str(cap))
        else:
            each = history_estimate(model_calls(spec), workflow_id=workflow_id, step_name=spec["name"])
        steps.append(StepEstimate(spec["name"], calls, each * calls,
                                  _average_duration(workflow_id, spec["name"])))
    by_name = {s.step: s for s in steps}
    after = {spec["name"]: spec.get("after") or [] for spec in definition["steps"]}
    finish: dict[str, float] = {}

    def finish_of(name: str) -> float:  # the DAG is acyclic: validated when it was saved
        if name not in finish:
            finish[name] = max((finish_of(d) for d in after[name]), default=0.0) + (by_name[name].duration_s or 0.0)
        return finish[name]

    duration = max((finish_of(name) for name in after), default=0.0)
    limit = (definition.get("budget") or {}).get("max_cost_usd")
    return RunEstimate(sum((s.cost_usd for s in steps), ZERO), round(duration, 3),
                       None if limit is None else Decimal(str(limit)), steps)


# --- levels -------------------------------------------------------------------------------


def committed_sum(reservations: QuerySet) -> Decimal:
    """What `reservations` hold: the amount of an open one, the actual cost of a settled one."""
    return reservations.aggregate(total=Coalesce(Sum(Case(
        When(state=Reservation.State.RESERVED, then=F("amount")),
        When(state=Reservation.State.SETTLED, then=F("actual")),
        default=Value(ZERO), output_field=DecimalField(max_digits=14, decimal_places=6))),
        Value(ZERO), output_field=DecimalField(max_digits=14, decimal_places=6)))["total"]


def run_committed(run: Run) -> tuple[Decimal, Decimal]:
    """(spent, reserved) of a run. Spent is what its attempts, items and child runs cost."""
    ledger = Reservation.objects.filter(run=run)
    reserved = committed_sum(ledger.filter(state=Reservation.State.RESERVED))
    settled = committed_sum(ledger.filter(state=Reservation.State.SETTLED))
    # A map's items are charged to the run when it joins, a child run's cost when it ends:
    # whichever is further along counts.
    return max(settled, run.cost_usd), reserved


def run_limit(run: Run, definition: dict) -> Decimal | None:
    """The run's cost limit: the latest operator override of it, else its definition's."""
    override = (BudgetOverride.objects.filter(run=run, max_cost_usd__isnull=False)
                .order_by("-created_at", "-id").values_list("max_cost_usd", flat=True).first())
    if override is not None:
        return override
    value = (definition.get("budget") or {}).get("max_cost_usd")
    return None if value is None else Decimal(str(value))


def run_duration_limit(run: Run, definition: dict) -> int | None:
    """The run's wall-clock limit in seconds from its start: the latest operator override of
    it, else its definition's `budget.max_duration_s`."""
    if run.deadline_at is None:
        # Both set it (run_start, run_budget_raise): a run without one has no limit, and the
        # step path skips the override lookup (tests/perf/test_query_count.py).
        return None
    override = (BudgetOverride.objects.filter(run=run, max_duration_s__isnull=False)
                .order_by("-created_at", "-id").values_list("max_duration_s", flat=True).first())
    if override is not None:
        return override
    return (definition.get("budget") or {}).get("max_duration_s")


def duration_policy(definition: dict) -> str:
    """What a run past its duration limit becomes: `pause` (the default) or `fail`."""
    return (definition.get("budget") or {}).get("on_duration") or "pause"


def limits_in_force(*, team_id: int, workflow_id: int | None, at: datetime | None = None,
                    lock: bool = False) -> list[BudgetLimit]:
    """The team's limit and the workflow's limit in force at `at`; locked for the rest of the
    transaction with `lock` (always in id order, so two lockers never deadlock)."""
    at = at or now()
    newest: dict[int | None, BudgetLimit] = {}
    when = BudgetLimit._meta.get_field("effective_from").get_db_prep_value(at, connection)
    for row in _CANDIDATE_LIMITS.rows(workflow_id, when, team_id, when):
        newest.setdefault(row.workflow_id, row)
    if not newest:
        return []  # the common case, no limit set: one statement
    ids = sorted(r.id for r in newest.values())
    chosen = BudgetLimit.objects.filter(id__in=ids).order_by("id")
    if lock:
        chosen = chosen.select_for_update()
    return list(chosen)


# Read at every run's start (`budget_admit`) and every dispatch: compiled once per connection
# (`orchestrator.store.Read`), whose values go in the order of the filters, as written here.
_CANDIDATE_LIMITS = Read(
    lambda workflow_id, at, team_id, at_again: BudgetLimit.objects
    .filter(Q(workflow_id=None) | Q(workflow_id=workflow_id)).filter(effective_from__lte=at)
    .filter(team_id=team_id).filter(Q(effective_to=None) | Q(effective_to__gt=at_again))
    .order_by("-effective_from", "-id").only("id", "workflow_id", "effective_from"),
    0, datetime(2000, 1, 1, tzinfo=UTC), 0, datetime(2000, 1, 1, tzinfo=UTC))


def period_start(period: str, at: datetime) -> datetime:
    start = at.replace(hour=0, minute=0, second=0, microsecond=0)
    return start.replace(day=1) if period == "month" else start


def _scope_reservations(limit: BudgetLimit) -> QuerySet:
    """What counts toward `limit`'s periods: its scope's calls, but an evaluation run's."""
    calls = Reservation.objects.exclude(run__capacity=RunCapacity.EVALUATION)
    if limit.workflow_id:
        return calls.filter(workflow_id=limit.workflow_id)
    return calls.filter(team_id=limit.team_id)


@dataclass(frozen=True)
class Level:
    """One limit a reservation is checked against, and what is committed under it."""

    name: str  # step, run, workflow.day, workflow.month, team.day, team.month
    limit: Decimal
    committed: Decimal
    warn_at: Decimal
    key: str  # what an alert about it is sent once for

    def crossed_by(self, amount: Decimal) -> bool:
        return self.committed + amount > self.limit

    def warned_by(self, amount: Decimal) -> bool:
        return self.limit > 0 and self.committed + amount >= self.limit * self.warn_at


@dataclass(frozen=True)
class Denial:
    """A dispatch that would cross `level`: what it would have added to what is committed."""

    level: str
    limit: Decimal
    committed: Decimal
    projected: Decimal
    step: str
    key: str

    @property
    def message(self) -> str:
        return (f"{self.level} budget: ${self.committed:.4f} committed + ${self.projected:.4f} "
                f"projected for step '{self.step}' would exceed the limit of ${self.limit:.2f}")

    def as_error(self) -> dict:
        """The run's `error` while it is paused for this (class `budget`)."""
        return {"class": "budget", "level": self.level, "step": self.step,
                "limit_usd": usd(self.limit), "committed_usd": usd(self.committed),
                "projected_usd": usd(self.projected), "message": self.message}


@dataclass
class Reserved:
    """What `budget_reserve` did: a denial (nothing reserved), or the levels now past their
    warning fraction."""

    denial: Denial | None = None
    warnings: list[Level] = field(default_factory=list)


def _run_warn_at() -> Decimal:
    return Decimal(str(settings.STEPWISE_BUDGET_WARN_AT))


def _levels(run: Run, step: StepRun, spec: dict, definition: dict, *, at: datetime) -> list[Level]:
    levels = []
    cap = spec.get("max_cost_usd")
    if cap is not None:
        levels.append(Level("step", Decimal(str(cap)), committed_sum(Reservation.objects.filter(step=step)),
                            _run_warn_at(), f"run:{run.id}:step:{step.name}"))
    limit = run_limit(run, definition)
    if limit is not None:
        spent, reserved = run_committed(run)
        levels.append(Level("run", limit, spent + reserved, _run_warn_at(), f"run:{run.id}:run:{limit}"))
    if run.capacity == RunCapacity.EVALUATION:
        return levels
    workflow_id = run.version.workflow_id
    for row in limits_in_force(team_id=run.team_id, workflow_id=workflow_id, at=at, lock=True):
        for period, cap in (("day", row.daily_usd), ("month", row.monthly_usd)):
            if cap is None:
                continue
            since = period_start(period, at)
            spent = committed_sum(_scope_reservations(row).filter(created_at__gte=since))
            levels.append(Level(f"{row.scope}.{period}", cap, spent, row.warn_at,
                                f"limit:{row.id}:{period}:{since:%Y-%m-%d}"))
    return levels


def budget_reserve(*, run: Run, step: StepRun, spec: dict, definition: dict,
                   attempt: int, items: list[int] | None = None, turn: int = 0) -> Reserved:
    """Reserve the calls of one dispatch of `step` (its `attempt`; with `items`, one call per
    map item; with `turn`, the attempt's n-th repair turn), against every level, in the
    caller's transaction with the run row locked.

    Calls already reserved (a replayed dispatch) are not reserved twice. Returns a Denial and
    reserves nothing when any level would be crossed (exactly reaching a limit is allowed).
    """
    body = model_calls(spec)
    if body is None:
        return Reserved()
    indexes = items if items is not None else [-1]
    held = set(Reservation.objects.filter(step=step, attempt=attempt, item__in=indexes, turn=turn)
               .values_list("item", flat=True))
    indexes = [i for i in indexes if i not in held]
    if not indexes:
        return Reserved()
    at = now()
    levels = _levels(run, step, spec, definition, at=at)
    workflow_id = run.version.workflow_id
    cap = spec.get("max_cost_usd")
    if cap is not None and spec["type"] != "map":
        # A step's own cap is its estimate: what it may still spend.
        each = max(Decimal(str(cap)) - levels[0].committed, ZERO)
        if each <= 0:
            return Reserved(Denial("step", levels[0].limit, levels[0].committed, ZERO, step.name,
                                   levels[0].key))
    else:
        each = history_estimate(body, workflow_id=workflow_id, step_name=step.name)
    total = each * len(indexes)
    for level in levels:
        if level.crossed_by(total):
            return Reserved(Denial(level.name, level.limit, level.committed, total, step.name, level.key))
    names = [level.name for level in levels]
    Reservation.objects.bulk_create(
        Reservation(run=run, step=step, team_id=run.team_id, workflow_id=workflow_id, attempt=attempt,
                    item=i, turn=turn, model=_model_of(body), levels=names, amount=each,
                    created_at=at)
        for i in indexes)
    return Reserved(warnings=[level for level in levels if level.warned_by(total)])


def budget_settle(*, step_id: int, attempt: int, actual: Decimal, item: int = -1,
                  turn: int | None = None) -> None:
    """Record what a reserved call cost (a replay changes nothing).

    With `turn`, `actual` is what that one call of the attempt cost. Without, it is what the
    whole attempt cost: its calls still open take what its settled turns do not account for
    (the last open one; an earlier open one, whose call never returned, nothing)."""
    calls = Reservation.objects.filter(step_id=step_id, attempt=attempt, item=item)
    if turn is not None:
        calls.filter(turn=turn, state=Reservation.State.RESERVED).update(
            state=Reservation.State.SETTLED, actual=actual, settled_at=now())
        return
    open_ = list(calls.filter(state=Reservation.State.RESERVED).order_by("turn").values_list("id", flat=True))
    if not open_:
        return
    settled = committed_sum(calls.filter(state=Reservation.State.SETTLED))
    at = now()
    Reservation.objects.filter(id__in=open_[:-1]).update(
        state=Reservation.State.SETTLED, actual=ZERO, settled_at=at)
    Reservation.objects.filter(id=open_[-1]).update(
        state=Reservation.State.SETTLED, actual=max(Decimal(actual) - settled, ZERO), settled_at=at)


def budget_release(*, step_id: int, attempt: int | None = None) -> int:
    """Free what `step` (or one attempt of it) still holds: the calls never ran or are lost."""
    open_ = Reservation.objects.filter(step_id=step_id, state=Reservation.State.RESERVED)
    if attempt is not None:
        open_ = open_.filter(attempt=attempt)
    return open_.update(state=Reservation.State.RELEASED, actual=ZERO, settled_at=now())


def elapsed_denial(*, run: Run, definition: dict, step: str = "") -> dict | None:
    """Why the run may not dispatch `step` (any step, for "") now because of its wall-clock
    budget (an operator's raise, else the definition's), or None."""
    return _past(run, run_duration_limit(run, definition), step)


def _past(run, max_duration: int | None, step: str) -> dict | None:
    if max_duration is None or run.started_at is None:
        return None
    elapsed = (now() - run.started_at).total_seconds()
    if elapsed <= max_duration:
        return None
    return {"class": "budget", "level": "run.duration", "step": step,
            "limit_s": max_duration, "elapsed_s": round(elapsed),
            "message": f"elapsed {elapsed:.0f}s exceeds the budget of {max_duration}s"}


def budget_denial(*, run, definition: dict, spec: dict) -> dict | None:
    """A read-only check of one step against the run's definition budget (no reservation):
    kept for callers that only ask. The engine reserves with `budget_reserve`."""
    max_cost = (definition.get("budget") or {}).get("max_cost_usd")
    if max_cost is not None:
        projected = run.cost_usd + projected_cost(spec)
        if projected > Decimal(str(max_cost)):
            return {"class": "budget", "step": spec["name"],
                    "message": f"projected cost ${projected:.4f} exceeds the budget ${Decimal(str(max_cost)):.2f}"}
    denial = _past(run, (definition.get("budget") or {}).get("max_duration_s"), spec["name"])
    if denial:
        return {"class": "budget", "step": spec["name"], "message": denial["message"]}
    return None


# --- team caps on new runs ----------------------------------------------------------------


def budget_admit(*, team: Team, workflow: Workflow, lock: bool = True) -> None:
    """May a new run of `workflow` start? The one admission of every start path (the API,
    the builder, every trigger kind; a child run is part of its parent's and is not admitted
    again). In the transaction that creates it; with `lock` the limit rows stay locked until
    it commits, so two starts cannot both take the last slot.

    The team's cap on unfinished runs is its limit's `max_concurrent_runs`, else
    STEPWISE_TEAM_MAX_LIVE_RUNS (0: none); a workflow's limit may cap it lower. Only runs
    started by a path count (not child runs).

    Raises BudgetExceeded for a concurrent-run cap reached or a day's or month's limit spent.
    Evaluation runs neither pass here (`run_start`) nor count.
    """
    at = now()
    team_capped = False
    for row in limits_in_force(team_id=team.id, workflow_id=workflow.id, at=at, lock=lock):
        scope = f"workflow '{workflow.name}'" if row.workflow_id else f"team '{team.slug}'"
        if row.max_concurrent_runs is not None:
            team_capped = team_capped or not row.workflow_id
            _refuse_past_cap(team, row.workflow_id, row.max_concurrent_runs, scope, row.scope)
        for period, cap in (("day", row.daily_usd), ("month", row.monthly_usd)):
            if cap is None:
                continue
            spent = committed_sum(_scope_reservations(row).filter(created_at__gte=period_start(period, at)))
            if spent >= cap:
                raise BudgetExceeded(
                    f"{scope} has committed ${spent:.2f} this {period}; its limit is ${cap:.2f}",
                    detail={"level": f"{row.scope}.{period}", "limit_usd": usd(cap),
                            "committed_usd": usd(spent)}, retry_after_s=3600)
    default_cap = settings.STEPWISE_TEAM_MAX_LIVE_RUNS
    if not team_capped and default_cap:
        _refuse_past_cap(team, None, default_cap, f"team '{team.slug}'", "team")


def admission_refusal(*, team: Team, workflow: Workflow) -> BudgetExceeded | None:
    """What `budget_admit` would refuse now, read without locking, or None: how a trigger
    decides to hold a firing instead of starting it (run_start still admits it for real)."""
    try:
        budget_admit(team=team, workflow=workflow, lock=False)
    except BudgetExceeded as refused:
        return refused
    return None


def _refuse_past_cap(team: Team, workflow_id: int | None, cap: int, scope: str, level: str) -> None:
    runs = (Run.objects.filter(team_id=team.id, parent_step__isnull=True)
            .exclude(state__in=RUN_TERMINAL).exclude(capacity=RunCapacity.EVALUATION))
    if workflow_id:
        runs = runs.filter(version__workflow_id=workflow_id)
    live = runs.count()
    if live >= cap:
        raise BudgetExceeded(
            f"{scope} has {live} unfinished runs; its limit is {cap}",
            detail={"level": f"{level}.concurrent_runs", "limit": cap, "current": live},
            retry_after_s=30)


# --- limits, recorded ---------------------------------------------------------------------

LIMIT_FIELDS = ("daily_usd", "monthly_usd", "max_concurrent_runs", "warn_at", "effective_from",
                "effective_to")


def budget_limit_create(*, team: Team, actor: Actor, workflow: Workflow | None = None,
                        **values) -> BudgetLimit:
    """Record a team's (or a workflow's) limits from `effective_from` (now); the limit in
    force before ends where this one starts. Audited. Raises Forbidden without budget.manage
    in the team, ValueError for a workflow of another team or an unknown field."""
    require(actor, Action.BUDGET_MANAGE, team=team)
    unknown = set(values) - set(LIMIT_FIELDS)
    if unknown:
        raise ValueError(f"unknown fields: {sorted(unknown)}")
    if workflow is not None and workflow.team_id != team.id:
        raise ValueError("the workflow belongs to another team")
    row = BudgetLimit(team=team, workflow=workflow, created_by=person(actor), **values)
    row.full_clean()
    with transaction.atomic():
        row.save()
        audit_record(action="budget.limit_created", actor=label(actor), subject_type="budget_limit",
                     subject_id=row.id, outcome="created", team=team.slug,
                     workflow=workflow.name if workflow else "",
                     payload={"scope": row.scope, **{k: _plain(getattr(row, k)) for k in LIMIT_FIELDS}})
    return row


def model_price_create(*, model: str, input_usd_per_mtok: Decimal, output_usd_per_mtok: Decimal,
                       actor: Actor, effective_from: datetime | None = None) -> ModelPrice:
    """Record a model's price from `effective_from` (now) on: calls made from then on are
    priced at it; calls made before keep the cost they were charged (it is stored on them).
    Audited. Only a superuser (or the engine) sets prices: they apply to every team.

    Raises Forbidden for anyone else, ValueError for a model the registry
    (`STEPWISE_MODELS`) does not name, ValidationError for a negative price or a second price
    of the model from the same moment."""
    if person(actor) is not None and not person(actor).is_superuser:
        raise Forbidden("only a superuser sets model prices")
    if model not in settings.STEPWISE_MODELS:
        raise ValueError(f"no model '{model}' is registered (STEPWISE_MODELS)")
    row = ModelPrice(model=model, input_usd_per_mtok=input_usd_per_mtok,
                     output_usd_per_mtok=output_usd_per_mtok, effective_from=effective_from or now())
    row.full_clean()
    with transaction.atomic():
        row.save()
        audit_record(action="budget.price_created", actor=label(actor), subject_type="model_price",
                     subject_id=row.id, outcome="created", model=model,
                     payload={"model": model, "input_usd_per_mtok": str(row.input_usd_per_mtok),
                              "output_usd_per_mtok": str(row.output_usd_per_mtok),
                              "effective_from": row.effective_from.isoformat()})
    return row


def override_record(*, run: Run, reason: str, actor: Actor, max_cost_usd: Decimal | None = None,
                    max_duration_s: int | None = None) -> BudgetOverride:
    """Store an operator's raised limit(s) on the run (the caller checks the permission, audits
    through its event, and holds the run's lock). Raises ValidationError for a negative or
    missing figure."""
    override = BudgetOverride(run=run, max_cost_usd=max_cost_usd, max_duration_s=max_duration_s,
                              reason=reason, created_by=person(actor), actor=label(actor))
    override.full_clean(exclude=["run"])
    override.save()
    return override


def _plain(value):
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    return value
