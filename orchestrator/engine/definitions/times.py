"""Points in time a definition names: a sleep step's `until` and its `timezone`.

Owns how a text (a literal, or what a template rendered) becomes an aware datetime, so the save
check of a literal `until` and the sleep step's start read it the same way. Pure: no clock, no
database; it must not decide when anything wakes (`orchestrator.engine.timers` does).
"""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

DEFAULT_TIMEZONE = "UTC"
MAX_TIME_CHARS = 64  # an ISO 8601 time is far shorter; a longer text is not one


class TimeInvalid(ValueError):
    """A text that does not name a point in time, or a time zone that does not exist."""


def zone(name: str) -> ZoneInfo:
    """The IANA time zone `name` (e.g. "Europe/Paris", "UTC"). Raises TimeInvalid."""
    if not isinstance(name, str) or not name or len(name) > MAX_TIME_CHARS:
        raise TimeInvalid(f"{name!r} is not a time zone name")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise TimeInvalid(
            f"unknown time zone {name!r} (an IANA name such as 'Europe/Paris' or 'UTC')"
        ) from None


def parse_time(text: object, timezone: str = DEFAULT_TIMEZONE) -> datetime:
    """The aware datetime an ISO 8601 text names ("2026-12-24T18:00:00", "2026-12-24",
    "2026-12-24T18:00:00+01:00", "...Z"). A time without an offset is read in `timezone`; one
    with an offset keeps it. Raises TimeInvalid."""
    tz = zone(timezone)
    if not isinstance(text, str):
        raise TimeInvalid(f"{text!r} is not a time: expected an ISO 8601 text")
    stripped = text.strip()
    shown = stripped if len(stripped) <= MAX_TIME_CHARS else stripped[:MAX_TIME_CHARS] + "…"
    not_a_time = TimeInvalid(f"{shown!r} is not a time: expected ISO 8601, e.g. "
                             "'2026-12-24T18:00:00' or '2026-12-24T18:00:00+01:00'")
    if not stripped or len(stripped) > MAX_TIME_CHARS:
        raise not_a_time
    try:
        parsed = datetime.fromisoformat(stripped)
    except ValueError:
        raise not_a_time from None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=tz)
