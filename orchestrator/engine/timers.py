"""Timers: when a sleep step wakes, decided from its spec and persisted state alone.

Part of the plan, like the scheduler: pure functions of their arguments. The time of the start
and of the sweep are passed in (it knows no clock), and it reads no database and sends nothing;
`services.kinds.sleep` applies what these decide.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from .definitions import TemplateError, TimeInvalid, parse_time, render_template
from .definitions.format import DEFAULT_SLEEP_TIMEZONE
from .definitions.limits import MAX_SLEEP_S
from .states import StepState


class SleepInvalid(ValueError):
    """A sleep step's `until` that does not make a time it may wait for: a permanent failure of
    the step (the same input renders the same text again)."""


def wake_time(spec: dict, step_input: dict, *, started_at: datetime) -> datetime:
    """When a sleep step that starts at `started_at` (aware) wakes: `for_s` seconds later, or
    its `until` rendered over the step's input and read in its `timezone`. A time in the past
    wakes at once.

    Raises SleepInvalid for an `until` that does not render, does not render to a time, or is
    more than MAX_SLEEP_S after the start.
    """
    if spec.get("for_s") is not None:
        return started_at + timedelta(seconds=spec["for_s"])
    try:
        text = render_template(spec["until"], step_input)
    except TemplateError as exc:
        raise SleepInvalid(f"until could not be rendered: {exc}") from None
    try:
        at = parse_time(text, spec.get("timezone", DEFAULT_SLEEP_TIMEZONE))
    except TimeInvalid as exc:
        raise SleepInvalid(f"until: {exc}") from None
    if at - started_at > timedelta(seconds=MAX_SLEEP_S):
        raise SleepInvalid(
            f"until rendered {at.isoformat()}, more than {MAX_SLEEP_S:,} s "
            f"({MAX_SLEEP_S // 86400} days) after the step started"
        )
    return at


def is_due(*, state: str, wake_at: datetime | None, at: datetime) -> bool:
    """Whether a step should be woken at `at`: it still sleeps, and its time has come."""
    return state == StepState.WAITING and wake_at is not None and wake_at <= at


def sleep_output(wake_at: datetime) -> dict:
    """A sleep step's output: the time it slept until, ISO 8601 in UTC."""
    return {"slept_until": wake_at.astimezone(UTC).isoformat()}
