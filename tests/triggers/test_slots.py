"""A schedule's slots (triggers/slots.py): which times a cron or an interval names, which run."""
from datetime import UTC, datetime, timedelta

import pytest

from triggers.slots import MAX_CATCH_UP, Schedule, plan_slots, schedule_problems, slot_text


def at(hour: int, minute: int = 0, second: int = 0, day: int = 1) -> datetime:
    return datetime(2026, 1, day, hour, minute, second, tzinfo=UTC)


HOURLY_PARIS = Schedule(cron="0 * * * *", timezone="Europe/Paris", anchor=at(0, 30))
EVERY_10_S = Schedule(interval_s=10, anchor=at(0))


@pytest.mark.parametrize("schedule, last, now, missed, catch_up, fire, skipped", [
    # beat on time: exactly the slot it ticks for
    (HOURLY_PARIS, None, at(1, 0, 2), "skip", 3, [at(1)], 0),
    (EVERY_10_S, None, at(0, 0, 10), "skip", 3, [at(0, 0, 10)], 0),
    # the same tick again (a duplicate delivery, a second beat): nothing new
    (HOURLY_PARIS, at(1), at(1, 0, 3), "skip", 3, [], 0),
    (EVERY_10_S, at(0, 0, 10), at(0, 0, 12), "catch_up", 3, [], 0),
    # beat was down for four slots: skip runs only the newest, late
    (HOURLY_PARIS, None, at(5, 10), "skip", 3, [at(5)], 4),
    # ... catch_up runs the newest catch_up_max missed slots too, and skips the rest
    (HOURLY_PARIS, None, at(5, 10), "catch_up", 3, [at(2), at(3), at(4), at(5)], 1),
    (HOURLY_PARIS, at(3), at(5, 10), "catch_up", 3, [at(4), at(5)], 0),
    (EVERY_10_S, None, at(0, 0, 35), "catch_up", 1, [at(0, 0, 20), at(0, 0, 30)], 1),
    # nothing due yet
    (EVERY_10_S, None, at(0, 0, 9), "skip", 3, [], 0),
])
def test_a_tick_runs_the_newest_slot_and_applies_the_missed_slot_policy(
        schedule, last, now, missed, catch_up, fire, skipped):
    plan = plan_slots(schedule, last=last, now=now, missed=missed, catch_up_max=catch_up)
    assert plan.fire == fire
    assert plan.skipped == skipped


def test_catching_up_is_bounded_however_long_beat_was_down():
    plan = plan_slots(EVERY_10_S, last=None, now=at(0, 0, 0, day=20), missed="catch_up",
                      catch_up_max=10_000)
    assert len(plan.fire) == MAX_CATCH_UP + 1
    assert plan.skipped == 10_000  # counted up to the cap, never enumerated further
    assert plan.skipped_first == at(0, 0, 10)


def test_cron_slots_are_read_in_the_schedule_time_zone_across_a_daylight_saving_change():
    # 02:30 in Paris every day; on 29 March 2026 the clocks jump from 02:00 to 03:00.
    schedule = Schedule(cron="30 2 * * *", timezone="Europe/Paris",
                        anchor=datetime(2026, 3, 27, tzinfo=UTC))
    plan = plan_slots(schedule, last=None, now=datetime(2026, 3, 31, tzinfo=UTC),
                      missed="catch_up", catch_up_max=10)
    assert [slot_text(s, "Europe/Paris") for s in plan.fire] == [
        "2026-03-27T02:30:00+01:00", "2026-03-28T02:30:00+01:00",
        "2026-03-29T03:00:00+02:00",  # the skipped local time runs once, at the jump
        "2026-03-30T02:30:00+02:00"]
    assert plan.fire[-1] - plan.fire[-2] == timedelta(hours=23, minutes=30)


@pytest.mark.parametrize("schedule, path, says", [
    (Schedule(), "cron", "either a cron expression or interval_s"),
    (Schedule(cron="0 * * * *", interval_s=5), "cron", "not both"),
    (Schedule(cron="* * *"), "cron", "five fields"),
    (Schedule(cron="0 0 0 * * *"), "cron", "five fields"),  # no seconds field
    (Schedule(cron="61 * * * *"), "cron", "not a valid cron expression"),
    (Schedule(cron="0 9 * * mon", timezone="Mars/Olympus"), "timezone", "not an IANA time zone"),
    (Schedule(interval_s=0), "interval_s", "at least 1"),
    (Schedule(cron="0 0 31 2 *"), "cron", "names no date that exists"),  # 31 February
])
def test_a_bad_schedule_is_refused_with_its_path(schedule, path, says):
    problems = schedule_problems(schedule)
    assert any(p["path"] == path and says in p["message"] for p in problems), problems


def test_a_good_schedule_has_no_problem():
    assert schedule_problems(Schedule(cron="*/15 9-17 * * mon-fri", timezone="America/New_York")) == []
    assert schedule_problems(Schedule(interval_s=30)) == []
