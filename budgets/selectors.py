"""Reads of budgets: what a run has spent, holds and has left, and where the money went.

`run_budget` is the one place a page or an answer gets a run's spent / reserved / remaining
(the API's run detail, the admin, the live run page). `cost_report` sums what attempts and map
items cost per day, workflow, model, team or run, over the teams a person may see
(`authz.visible`). Reads only.
"""
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from decimal import Decimal

from django.db.models import Count, OuterRef, QuerySet, Subquery, Sum
from django.db.models.functions import TruncDate
from django.utils import timezone

from orchestrator.engine.authz import Actor, visible
from orchestrator.engine.selectors import definition_of, runs_with_version
from orchestrator.models import MapItem, Run, StepAttempt

from .models import BudgetOverride, Reservation

ZERO = Decimal(0)
GROUPS = ("day", "workflow", "model", "team", "run")


@dataclass(frozen=True)
class RunBudget:
    limit_usd: Decimal | None  # None: no cost limit
    spent_usd: Decimal
    reserved_usd: Decimal
    remaining_usd: Decimal | None
    overridden: bool

    def as_dict(self) -> dict:
        def money(value):
            return None if value is None else str(value.quantize(Decimal("0.000001")))

        return {"limit_usd": money(self.limit_usd), "spent_usd": money(self.spent_usd),
                "reserved_usd": money(self.reserved_usd), "remaining_usd": money(self.remaining_usd),
                "overridden": self.overridden}


def run_budget(run: Run) -> RunBudget:
    """What `run` has spent, holds reserved for calls in flight, and has left under its limit
    (the latest operator override, else its definition's budget.max_cost_usd)."""
    figures = Run.objects.filter(pk=run.pk).annotate(
        reserved=_ledger_sum(Reservation.State.RESERVED, "amount"),
        settled=_ledger_sum(Reservation.State.SETTLED, "actual"),
        override=Subquery(BudgetOverride.objects.filter(run=OuterRef("pk"), max_cost_usd__isnull=False)
                          .order_by("-created_at", "-id")
                          .values("max_cost_usd")[:1]),
    ).values("reserved", "settled", "override").get()  # one query, however far the run got
    reserved, override = figures["reserved"] or ZERO, figures["override"]
    spent = max(figures["settled"] or ZERO, run.cost_usd)
    if override is not None:
        limit = override
    else:
        value = (definition_of(run)[0].get("budget") or {}).get("max_cost_usd")
        limit = None if value is None else Decimal(str(value))
    remaining = None if limit is None else max(limit - spent - reserved, ZERO)
    return RunBudget(limit, spent, reserved, remaining, override is not None)


def _ledger_sum(state: str, column: str) -> Subquery:
    rows = Reservation.objects.filter(run=OuterRef("pk"), state=state).order_by()
    return Subquery(rows.values("run").annotate(total=Sum(column)).values("total")[:1])


# --- where the money went -------------------------------------------------------------------


@dataclass(frozen=True)
class CostRow:
    group: str
    cost_usd: Decimal
    tokens_in: int
    tokens_out: int
    calls: int


def _bounds(since: date, until: date) -> tuple[datetime, datetime]:
    zone = timezone.get_current_timezone()
    return (timezone.make_aware(datetime.combine(since, time.min), zone),
            timezone.make_aware(datetime.combine(until + timedelta(days=1), time.min), zone))


_ATTEMPT_KEYS = {"day": "day", "workflow": "step__run__version__workflow__name",
                 "model": "model", "team": "step__run__team__slug", "run": "step__run_id"}


def _sum(rows, key_of, into: dict[str, list]) -> None:
    for row in rows:
        key = key_of(row)
        total = into.setdefault(key, [ZERO, 0, 0, 0])
        total[0] += row["cost"] or ZERO
        total[1] += row["tin"] or 0
        total[2] += row["tout"] or 0
        total[3] += row["calls"]


def _item_models(step_ids: set[int]) -> dict[int, str]:
    """The model each map step's items call (from its run's pinned definition)."""
    models: dict[int, str] = {}
    runs = runs_with_version().filter(steps__id__in=step_ids).distinct()
    for run in runs:
        _, graph = definition_of(run)
        for step_id, name in run.steps.filter(id__in=step_ids).values_list("id", "name"):
            models[step_id] = (graph.steps[name].get("item") or {}).get("model") or ""
    return models


def cost_report(*, user: Actor, group_by: str, since: date, until: date,
                team: str | None = None, workflow: str | None = None) -> list[CostRow]:
    """What model calls cost between `since` and `until` (whole days, inclusive, in the site's
    time zone), grouped by `group_by` (one of GROUPS), over the teams `user` may see (and, with
    `team`, that team only; with `workflow`, the workflows of that name only). A call counts on the day it finished. Largest cost first; by day,
    in date order."""
    start, end = _bounds(since, until)
    attempts: QuerySet = visible(StepAttempt.objects.all(), user, team_field="step__run__team").filter(
        finished_at__gte=start, finished_at__lt=end)
    items: QuerySet = visible(MapItem.objects.all(), user, team_field="step__run__team").filter(
        finished_at__gte=start, finished_at__lt=end, attempts__gt=0)
    if team:
        attempts = attempts.filter(step__run__team__slug=team)
        items = items.filter(step__run__team__slug=team)
    if workflow:
        attempts = attempts.filter(step__run__version__workflow__name=workflow)
        items = items.filter(step__run__version__workflow__name=workflow)
    sums = {"cost": Sum("cost_usd"), "tin": Sum("tokens_in"), "tout": Sum("tokens_out"), "calls": Count("id")}
    totals: dict[str, list] = {}
    attempts = attempts.exclude(cost_usd=0, tokens_in=0, tokens_out=0)
    items = items.exclude(cost_usd=0, tokens_in=0, tokens_out=0)
    if group_by == "day":
        attempts, items = attempts.annotate(day=TruncDate("finished_at")), items.annotate(day=TruncDate("finished_at"))
    if group_by == "model":
        _sum(attempts.values("model").annotate(**sums).order_by(), lambda r: r["model"] or "-", totals)
        rows = list(items.values("step_id").annotate(**sums).order_by())
        models = _item_models({r["step_id"] for r in rows})
        _sum(rows, lambda r: models.get(r["step_id"]) or "-", totals)
    else:
        field = _ATTEMPT_KEYS[group_by]
        for calls in (attempts, items):  # both reach the run through their step
            _sum(calls.values(field).annotate(**sums).order_by(), lambda r: str(r[field]), totals)
    result = [CostRow(key, cost, tin, tout, calls) for key, (cost, tin, tout, calls) in totals.items()]
    if group_by == "day":
        return sorted(result, key=lambda r: r.group)
    return sorted(result, key=lambda r: (-r.cost_usd, r.group))
