"""Reads of budgets: what a run has spent, holds and has left, and where the money went.

`run_budget` is the one place a page or an answer gets a run's spent / reserved / remaining
(the API's run detail, the admin, the live run page). `cost_report` sums what attempts and map
items cost per day, workflow, model, team or run, over the teams a person may see
(`authz.visible`). Reads, except that a report writes the daily totals (CostDay) of the days it
covers that ended, the first time one does.
"""
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from decimal import Decimal

from django.db import transaction
from django.db.models import Count, OuterRef, QuerySet, Subquery, Sum
from django.db.models.functions import TruncDate
from django.utils import timezone

from orchestrator.engine.authz import Actor, visible, visible_listed
from orchestrator.engine.clock import now
from orchestrator.engine.selectors import definition_of, runs_with_version
from orchestrator.models import MapItem, Run, StepAttempt

from .models import BudgetOverride, CostDay, CostDayDone, Reservation

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
    `team`, that team only; with `workflow`, the workflows of that name only). A call counts on
    the day it finished. Largest cost first; by day, in date order.

    The days of the range that are over are read from their CostDay rows, written by the first
    report that covers each (`_roll_up`); the rest, and every day when grouping by run, from
    the calls themselves, through their `finished_at` index. Either way the cost is the range's,
    not the history's."""
    totals: dict[str, list] = {}
    live_since = since
    closed = _last_closed_day()
    if group_by != "run" and closed >= since:
        last = min(closed, until)
        _roll_up(since, last)
        _sum_days(user, group_by, since, last, team, workflow, totals)
        live_since = last + timedelta(days=1)
    if live_since <= until:
        _sum_calls(user, group_by, live_since, until, team, workflow, totals)
    result = [CostRow(key, cost, tin, tout, calls) for key, (cost, tin, tout, calls) in totals.items()]
    if group_by == "day":
        return sorted(result, key=lambda r: r.group)
    return sorted(result, key=lambda r: (-r.cost_usd, r.group))


def _calls(since: date, until: date) -> tuple[QuerySet, QuerySet]:
    """The attempts and map items that called a model and finished in the range."""
    start, end = _bounds(since, until)
    attempts = StepAttempt.objects.filter(finished_at__gte=start, finished_at__lt=end).exclude(
        cost_usd=0, tokens_in=0, tokens_out=0)
    items = MapItem.objects.filter(finished_at__gte=start, finished_at__lt=end, attempts__gt=0).exclude(
        cost_usd=0, tokens_in=0, tokens_out=0)
    return attempts, items


def _sum_calls(user: Actor, group_by: str, since: date, until: date, team: str | None,
               workflow: str | None, totals: dict[str, list]) -> None:
    attempts, items = _calls(since, until)
    # The person's teams read first: joined from the memberships, the planner would read every
    # call of those teams rather than the range's through the `finished_at` index.
    attempts = visible_listed(attempts, user, team_field="step__run__team")
    items = visible_listed(items, user, team_field="step__run__team")
    if team:
        attempts = attempts.filter(step__run__team__slug=team)
        items = items.filter(step__run__team__slug=team)
    if workflow:
        attempts = attempts.filter(step__run__version__workflow__name=workflow)
        items = items.filter(step__run__version__workflow__name=workflow)
    if group_by == "day":
        attempts, items = attempts.annotate(day=TruncDate("finished_at")), items.annotate(day=TruncDate("finished_at"))
    if group_by == "model":
        _sum(attempts.values("model").annotate(**_SUMS).order_by(), lambda r: r["model"] or "-", totals)
        rows = list(items.values("step_id").annotate(**_SUMS).order_by())
        models = _item_models({r["step_id"] for r in rows})
        _sum(rows, lambda r: models.get(r["step_id"]) or "-", totals)
    else:
        field = _ATTEMPT_KEYS[group_by]
        for calls in (attempts, items):  # both reach the run through their step
            _sum(calls.values(field).annotate(**_SUMS).order_by(), lambda r: str(r[field]), totals)


_SUMS = {"cost": Sum("cost_usd"), "tin": Sum("tokens_in"), "tout": Sum("tokens_out"), "calls": Count("id")}
_DAY_KEYS = {"day": "day", "workflow": "workflow", "model": "model", "team": "team__slug"}
# How long after a day ends its calls are rolled up: a call counts on the day it finished, and
# one that finished just before midnight may be committed a little after it.
ROLL_UP_AFTER = timedelta(hours=1)


def _last_closed_day() -> date:
    """The last day (in the site's time zone) whose calls are all written."""
    return timezone.localtime(now() - ROLL_UP_AFTER).date() - timedelta(days=1)


def _roll_up(since: date, until: date) -> None:
    """Write the CostDay rows of every day of the range (all over) not written yet: one read of
    those days' calls through their index, once for each day."""
    zone = timezone.get_current_timezone_name()
    days = {since + timedelta(days=k) for k in range((until - since).days + 1)}
    days -= set(CostDayDone.objects.filter(zone=zone, day__gte=since, day__lte=until)
                .values_list("day", flat=True))
    if not days:
        return
    attempts, items = _calls(min(days), max(days))
    keys = ("day", "step__run__team_id", "step__run__version__workflow__name")
    rows: dict[tuple, list] = {}

    def add(row: dict, model: str) -> None:
        if row["day"] in days:
            key = (row["day"], row["step__run__team_id"], row["step__run__version__workflow__name"], model)
            total = rows.setdefault(key, [ZERO, 0, 0, 0])
            for k, column in enumerate(("cost", "tin", "tout", "calls")):
                total[k] += row[column] or 0

    for row in attempts.annotate(day=TruncDate("finished_at")).values(*keys, "model").annotate(**_SUMS).order_by():
        add(row, row["model"])
    found = list(items.annotate(day=TruncDate("finished_at")).values(*keys, "step_id").annotate(**_SUMS).order_by())
    models = _item_models({r["step_id"] for r in found})
    for row in found:
        add(row, models.get(row["step_id"]) or "")
    with transaction.atomic():  # a report covering the same days meanwhile writes the same rows
        CostDay.objects.bulk_create(
            [CostDay(zone=zone, day=day, team_id=team_id, workflow=name, model=model, cost_usd=cost,
                     tokens_in=tin, tokens_out=tout, calls=calls)
             for (day, team_id, name, model), (cost, tin, tout, calls) in rows.items()],
            ignore_conflicts=True)
        CostDayDone.objects.bulk_create([CostDayDone(zone=zone, day=day) for day in days],
                                        ignore_conflicts=True)


def _sum_days(user: Actor, group_by: str, since: date, until: date, team: str | None,
              workflow: str | None, totals: dict[str, list]) -> None:
    rows = visible(CostDay.objects.filter(zone=timezone.get_current_timezone_name(),
                                          day__gte=since, day__lte=until), user)
    if team:
        rows = rows.filter(team__slug=team)
    if workflow:
        rows = rows.filter(workflow=workflow)
    field = _DAY_KEYS[group_by]
    sums = {"cost": Sum("cost_usd"), "tin": Sum("tokens_in"), "tout": Sum("tokens_out"), "calls": Sum("calls")}
    key_of = (lambda r: r["model"] or "-") if group_by == "model" else (lambda r: str(r[field]))
    _sum(rows.values(field).annotate(**sums).order_by(), key_of, totals)


def call_reservation(*, step_id: int, attempt: int, turn: int) -> Decimal | None:
    """What is reserved for one model call of an attempt (`turn`: 0 the first, n its n-th
    repair), or None when nothing is held for it."""
    return (Reservation.objects.filter(step_id=step_id, attempt=attempt, turn=turn, item=-1,
                                       state=Reservation.State.RESERVED)
            .values_list("amount", flat=True).first())
