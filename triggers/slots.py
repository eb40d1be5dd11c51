"""A schedule's slots: which times a cron expression or an interval names, and which to run.

Pure: no database, no clock (the caller passes `now`). A slot is the instant a schedule names
(10:00 for "0 10 * * *"); the run for it carries the slot in its idempotency key, so however
often beat's tick for it is delivered, one run exists per slot.

Cron expressions have five fields (minute hour day-of-month month day-of-week), read in the
schedule's IANA time zone, with croniter — daylight-saving gaps and repeats included. Interval
slots are the anchor plus whole multiples of the interval.

`plan_slots` decides what a tick does: the newest slot not yet handled runs (late, if beat was
down); older unhandled slots were *missed* while beat was not running, and the schedule's
policy says whether they are skipped or caught up (the newest `catch_up_max` of them).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from celery.schedules import crontab
from croniter import CroniterBadDateError, croniter

MAX_CATCH_UP = 100
# Counting missed slots stops here ("at least 10,000 slots were missed").
MAX_COUNTED = 10_000
MIN_INTERVAL_S = 1


@dataclass(frozen=True)
class Schedule:
    cron: str = ""
    timezone: str = "UTC"
    interval_s: int | None = None
    anchor: datetime | None = None  # interval slots are anchor + k * interval_s, k >= 1


@dataclass
class SlotPlan:
    """What one tick does: run `fire` (oldest first); `skipped` missed slots are not run."""

    fire: list[datetime] = field(default_factory=list)
    skipped: int = 0
    skipped_first: datetime | None = None
    skipped_last: datetime | None = None

    @property
    def newest(self) -> datetime | None:
        return self.fire[-1] if self.fire else None


def cron_fields(expression: str) -> list[str]:
    return expression.split()


def schedule_problems(schedule: Schedule) -> list[dict]:
    """Every problem with a schedule, as [{"path", "message"}]."""
    problems = []
    has_cron, has_interval = bool(schedule.cron.strip()), schedule.interval_s is not None
    if has_cron == has_interval:
        problems.append({"path": "cron", "message": "a schedule needs either a cron expression "
                                                    "or interval_s, not both and not neither"})
    if has_cron:
        fields = cron_fields(schedule.cron)
        if len(fields) != 5:
            problems.append({"path": "cron", "message": "a cron expression has five fields "
                             "(minute hour day-of-month month day-of-week), not "
                             f"{len(fields)}"})
        elif not croniter.is_valid(schedule.cron):
            problems.append({"path": "cron", "message": f"'{schedule.cron}' is not a valid cron "
                                                        "expression"})
        else:
            try:  # beat reads the same fields: both must understand them
                crontab(*fields)
            except (ValueError, TypeError) as error:
                problems.append({"path": "cron", "message": f"Celery beat cannot read "
                                                            f"'{schedule.cron}': {error}"})
            try:  # a valid expression may still name no day that exists (31 February)
                croniter(schedule.cron, datetime(2000, 1, 1, tzinfo=UTC)).get_next(datetime)
            except CroniterBadDateError:
                problems.append({"path": "cron", "message": f"'{schedule.cron}' names no "
                                                            "date that exists"})
    if has_interval and schedule.interval_s < MIN_INTERVAL_S:
        problems.append({"path": "interval_s", "message": f"must be at least {MIN_INTERVAL_S} s"})
    try:
        zone_of(schedule.timezone)
    except ValueError as error:
        problems.append({"path": "timezone", "message": str(error)})
    return problems


def zone_of(name: str) -> ZoneInfo:
    """The IANA time zone `name`. Raises ValueError for an unknown one."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"'{name}' is not an IANA time zone (e.g. Europe/Paris, UTC)") from None


def _cron_after(schedule: Schedule, moment: datetime) -> datetime:
    """The first slot strictly after `moment`, in UTC."""
    local = moment.astimezone(zone_of(schedule.timezone))
    return croniter(schedule.cron, local).get_next(datetime).astimezone(UTC)


def _cron_newest(schedule: Schedule, until: datetime, after: datetime, count: int) -> list[datetime]:
    """Up to `count` slots in (after, until], newest first."""
    zone = zone_of(schedule.timezone)
    # croniter's get_prev from `until` skips a slot exactly at `until`: start a second later.
    iterator = croniter(schedule.cron, (until + timedelta(seconds=1)).astimezone(zone))
    found = []
    while len(found) < count:
        slot = iterator.get_prev(datetime).astimezone(UTC)
        if slot <= after:
            break
        if slot <= until:
            found.append(slot)
    return found


def slots_newest(schedule: Schedule, *, until: datetime, after: datetime, count: int) -> list[datetime]:
    """Up to `count` slots in (after, until], newest first."""
    if schedule.interval_s:
        anchor, step = schedule.anchor or after, timedelta(seconds=schedule.interval_s)
        newest_k = int((until - anchor) / step)
        found = []
        k = newest_k
        while k >= 1 and len(found) < count:
            slot = anchor + k * step
            if slot <= after:
                break
            found.append(slot)
            k -= 1
        return found
    return _cron_newest(schedule, until, after, count)


def _count_between(schedule: Schedule, after: datetime, before: datetime) -> tuple[int, datetime | None]:
    """(number of slots in (after, before), the first of them), counting at most MAX_COUNTED."""
    if schedule.interval_s:
        anchor, step = schedule.anchor or after, timedelta(seconds=schedule.interval_s)
        first_k = max(int((after - anchor) / step) + 1, 1)
        while anchor + first_k * step <= after:
            first_k += 1
        first = anchor + first_k * step
        if first >= before:
            return 0, None
        last_k = int((before - anchor) / step)
        if anchor + last_k * step >= before:
            last_k -= 1
        return min(last_k - first_k + 1, MAX_COUNTED), first
    first = _cron_after(schedule, after)
    if first >= before:
        return 0, None
    count, slot = 1, first
    while count < MAX_COUNTED:
        slot = _cron_after(schedule, slot)
        if slot >= before:
            break
        count += 1
    return count, first


def plan_slots(schedule: Schedule, *, last: datetime | None, now: datetime, missed: str,
               catch_up_max: int) -> SlotPlan:
    """The slots one tick at `now` runs, given the newest slot already handled (`last`).

    Slots are considered after `last`, or after the schedule's anchor when none was handled.
    The newest slot at or before `now` always runs; with `missed="catch_up"` so do the newest
    `catch_up_max` (at most MAX_CATCH_UP) slots before it that were not handled; every other
    unhandled slot is counted as skipped.
    """
    after = last or schedule.anchor
    if after is None:
        raise ValueError("a schedule needs an anchor or a last slot")
    keep = 1 + (min(catch_up_max, MAX_CATCH_UP) if missed == "catch_up" else 0)
    newest = slots_newest(schedule, until=now, after=after, count=keep)
    plan = SlotPlan(fire=sorted(newest))
    if not newest:
        return plan
    skipped, first = _count_between(schedule, after, plan.fire[0])
    if skipped:
        plan.skipped, plan.skipped_first = skipped, first
        previous = slots_newest(schedule, until=plan.fire[0] - timedelta(microseconds=1),
                                after=after, count=1)
        plan.skipped_last = previous[0] if previous else first
    return plan


def slots_after(schedule: Schedule, *, after: datetime, count: int) -> list[datetime]:
    """The next `count` slots strictly after `after`, oldest first (in UTC)."""
    if schedule.interval_s:
        anchor, step = schedule.anchor or after, timedelta(seconds=schedule.interval_s)
        k = max(int((after - anchor) / step), 0) + 1
        while anchor + k * step <= after:
            k += 1
        return [anchor + (k + i) * step for i in range(count)]
    found, slot = [], after
    for _ in range(count):
        slot = _cron_after(schedule, slot)
        found.append(slot)
    return found


def slot_label(slot: datetime, timezone: str) -> str:
    """The slot as a person reads it, in the schedule's zone: "Mon 7 Dec 09:00 CET"."""
    local = slot.astimezone(zone_of(timezone))
    return f"{local:%a} {local.day} {local:%b %H:%M} {local.tzname()}"


def slot_text(slot: datetime, timezone: str) -> str:
    """The slot as ISO 8601 in the schedule's time zone (what templates read as `slot`)."""
    return slot.astimezone(zone_of(timezone)).isoformat()
