"""When a sleep step wakes (`orchestrator.engine.timers`): a pure decision over its spec, its
input and the times passed in — `for_s` after the start, or `until` rendered and read in its
time zone; and whether a step is due at a sweep's time."""

from datetime import UTC, datetime, timedelta

import pytest

from orchestrator.engine.definitions.limits import MAX_SLEEP_S
from orchestrator.engine.timers import SleepInvalid, is_due, sleep_output, wake_time

START = datetime(2026, 3, 28, 23, 30, tzinfo=UTC)
INPUT = {
    "input": {"at": "2026-03-29T03:30:00", "zoned": "2026-03-29T03:30:00+05:00"},
    "steps": {"pick": {"state": "completed", "output": {"day": "2026-04-01"}}},
}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"for_s": 90}, START + timedelta(seconds=90)),
        ({"for_s": MAX_SLEEP_S}, START + timedelta(seconds=MAX_SLEEP_S)),
        # Without an offset, read in the step's zone: Paris moved to summer time (UTC+2) at 02:00.
        (
            {"until": "{{ input.at }}", "timezone": "Europe/Paris"},
            datetime(2026, 3, 29, 1, 30, tzinfo=UTC),
        ),
        ({"until": "{{ input.at }}", "timezone": "UTC"}, datetime(2026, 3, 29, 3, 30, tzinfo=UTC)),
        ({"until": "{{ input.at }}"}, datetime(2026, 3, 29, 3, 30, tzinfo=UTC)),  # UTC by default
        # An offset in the text wins over the zone.
        (
            {"until": "{{ input.zoned }}", "timezone": "Europe/Paris"},
            datetime(2026, 3, 28, 22, 30, tzinfo=UTC),
        ),
        (
            {"until": "{{ steps.pick.output.day }}", "timezone": "America/New_York"},
            datetime(2026, 4, 1, 4, 0, tzinfo=UTC),
        ),  # a date: its midnight, EDT
        ({"until": " 2026-03-29T00:00:00Z "}, datetime(2026, 3, 29, 0, 0, tzinfo=UTC)),
        (
            {"until": "2020-01-01T00:00:00Z"},
            datetime(2020, 1, 1, tzinfo=UTC),
        ),  # past: wakes at once
    ],
)
def test_the_wake_time_of_a_sleep(spec, expected):
    assert wake_time(spec, INPUT, started_at=START) == expected


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"until": "{{ input.missing.x }}"}, "until could not be rendered: "),
        (
            {"until": "{{ input.at }}x"},
            "until: '2026-03-29T03:30:00x' is not a time: expected ISO 8601",
        ),
        ({"until": "soon"}, "until: 'soon' is not a time"),
        ({"until": "{{ '' }}"}, "until: '' is not a time"),
        ({"until": "{{ '9' * 100 }}"}, "until: '" + "9" * 64 + "…' is not a time"),
        (
            {"until": "{{ input.at }}", "timezone": "Mars/Olympus"},
            "until: unknown time zone 'Mars/Olympus'",
        ),
        (
            {"until": "2026-06-27T00:00:01Z"},
            f"until rendered 2026-06-27T00:00:01+00:00, more than {MAX_SLEEP_S:,} s (90 days)",
        ),
    ],
)
def test_an_until_that_makes_no_time_to_wait_for_is_refused(spec, message):
    with pytest.raises(SleepInvalid) as refused:
        wake_time(spec, INPUT, started_at=START)
    assert str(refused.value).startswith(message), str(refused.value)


def test_an_until_exactly_the_longest_sleep_ahead_is_accepted():
    at = START + timedelta(seconds=MAX_SLEEP_S)
    assert wake_time({"until": at.isoformat()}, INPUT, started_at=START) == at


AT = datetime(2026, 1, 1, 12, tzinfo=UTC)


@pytest.mark.parametrize(
    ("state", "wake_at", "due"),
    [
        ("waiting", AT - timedelta(seconds=1), True),
        ("waiting", AT, True),
        ("waiting", AT + timedelta(microseconds=1), False),
        ("waiting", None, False),  # a step that waits for something else
        ("completed", AT - timedelta(seconds=1), False),  # woken already
        ("cancelled", AT - timedelta(seconds=1), False),
        ("ready", AT - timedelta(seconds=1), False),
    ],
)
def test_a_step_is_due_when_it_still_sleeps_and_its_time_has_come(state, wake_at, due):
    assert is_due(state=state, wake_at=wake_at, at=AT) is due


def test_the_output_names_the_wake_time_in_utc():
    paris = datetime.fromisoformat("2026-07-01T10:00:00+02:00")
    assert sleep_output(paris) == {"slept_until": "2026-07-01T08:00:00+00:00"}
