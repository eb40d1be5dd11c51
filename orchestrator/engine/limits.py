"""Backpressure on dependencies, shared by every worker: rate limits and circuit breakers.

State lives in Django's cache — Redis in production (atomic INCR), a file cache in the
embedded default — so that a failing model provider or API stops being called by all workers
at once instead of being hammered by every retry.

- `rate_limit_wait(dep)`: seconds to wait before calling `dep` under its calls/second limit
  (0 = go). The worker does not claim a step it cannot call yet; it re-sends its message.
- `breaker_read(dep)`: before a call, how many seconds the breaker stays open (0 = closed).
  After STEPWISE_BREAKER_FAILURES consecutive transient failures the breaker opens for the
  cool-down; then one call may probe, and its outcome closes or re-opens it. `breaker_record`
  counts the call's outcome; a success resets only what the reading saw counted, so the
  common case — a closed breaker and a success — costs one read of the cache per call. A
  worker carrying a run's next steps (`worker.Carry`) reads it once per message: after a
  clean reading and a success, the steps it carries within the message's time (STEPWISE_CARRY_S) call
  that dependency without reading it again, so a breaker another worker opens meanwhile
  stops them at their next message.
"""
import math
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings
from django.core.cache import cache

from .clock import now as clock_now
from .definitions import calls_model

TRANSIENT = frozenset({"transient", "timeout", "rate_limit"})


def dependency_of(spec: dict) -> str:
    """The shared resource a step calls: its model or its tool."""
    if calls_model(spec):
        return f"model:{spec['model']}"
    if spec["type"] == "tool":
        url = str((spec.get("params") or {}).get("url", ""))
        host = urlsplit(url).netloc if spec["tool"] == "http.request" and "{" not in url else ""
        # One HTTP tool serves many remotes: a failing one must not stop calls to the others.
        return f"tool:{spec['tool']}" + (f":{host}" if host else "")
    return ""


def rate_limit_wait(dep: str) -> float:
    """Take a slot in this second's window for `dep`, or say how long to wait for the next."""
    limit = settings.STEPWISE_RATE_LIMITS.get(dep)
    if not dep or not limit:
        return 0.0
    now = _seconds()
    used = _count(f"rl:{dep}:{int(now)}", timeout=5)
    if used <= limit:
        return 0.0
    return max(math.ceil(now) - now, 0.01)


@dataclass(frozen=True)
class BreakerReading:
    """The breaker of a dependency as a caller found it, before its call."""
    open_for: float = 0.0  # seconds it stays open (0: the call may go ahead)
    # Nothing counted: no failure, not open, no probe taken. A success then has nothing to
    # reset (a failure another worker counts during the call is reset by the next reading's
    # success: "consecutive" across workers is as of each call's start).
    clean: bool = True


def breaker_read(dep: str) -> BreakerReading:
    if not dep:
        return BreakerReading()
    found = cache.get_many([f"cb:{dep}:until", f"cb:{dep}:failures"])
    opened_until = found.get(f"cb:{dep}:until")
    if not opened_until:
        return BreakerReading(clean=not found)
    remaining = opened_until - _seconds()
    if remaining > 0:
        return BreakerReading(remaining, clean=False)
    # Half-open: let exactly one caller probe; the others keep waiting a little.
    probe = cache.add(f"cb:{dep}:probe", 1, timeout=int(settings.STEPWISE_BREAKER_COOLDOWN_S) or 1)
    return BreakerReading(0.0 if probe else 1.0, clean=False)


def breaker_record(dep: str, *, error_class: str | None,
                   reading: BreakerReading | None = None) -> None:
    """Count a call's outcome: transient failures open the breaker, a success closes it.
    `reading`: what `breaker_read` found before the call (None: reset whatever is counted)."""
    if not dep:
        return
    if error_class is None:
        if reading is None or not reading.clean:
            cache.delete_many([f"cb:{dep}:failures", f"cb:{dep}:until", f"cb:{dep}:probe"])
        return
    if error_class not in TRANSIENT:
        return
    failures = _count(f"cb:{dep}:failures", timeout=3600)
    if failures >= settings.STEPWISE_BREAKER_FAILURES:
        cooldown = settings.STEPWISE_BREAKER_COOLDOWN_S
        cache.set(f"cb:{dep}:until", _seconds() + cooldown, timeout=int(cooldown * 4) + 1)
        cache.delete(f"cb:{dep}:probe")


@dataclass(frozen=True)
class Saturation:
    """How hard a dependency is pressed now, read without taking anything (for autoscalers
    and the operations page): calls started this second against its rate limit, and how long
    its breaker stays open."""
    dependency: str
    calls_this_second: int
    rate_limit: int | None  # calls a second (STEPWISE_RATE_LIMITS); None: unlimited
    breaker_open_s: float
    failures: int  # consecutive transient failures counted toward opening the breaker


def saturation_of(dependencies: list[str]) -> list[Saturation]:
    at = _seconds()
    keys = [key for dep in dependencies
            for key in (f"rl:{dep}:{int(at)}", f"cb:{dep}:until", f"cb:{dep}:failures")]
    found = cache.get_many(keys)
    return [Saturation(dep, int(found.get(f"rl:{dep}:{int(at)}") or 0),
                       settings.STEPWISE_RATE_LIMITS.get(dep),
                       max((found.get(f"cb:{dep}:until") or 0) - at, 0.0),
                       int(found.get(f"cb:{dep}:failures") or 0))
            for dep in dependencies]


@dataclass(frozen=True)
class BreakerState:
    """A dependency's breaker as the operations page shows it (read without taking a probe)."""
    dependency: str
    state: str  # closed | open | half-open (cooled down: the next call probes)
    open_for_s: float
    failures: int  # consecutive transient failures counted toward opening it


def breaker_states(dependencies: list[str]) -> list[BreakerState]:
    at = _seconds()
    found = cache.get_many([key for dep in dependencies
                            for key in (f"cb:{dep}:until", f"cb:{dep}:failures")])
    states = []
    for dep in dependencies:
        until = found.get(f"cb:{dep}:until")
        state = "closed" if not until else "open" if until > at else "half-open"
        states.append(BreakerState(dep, state, max((until or 0) - at, 0.0),
                                   int(found.get(f"cb:{dep}:failures") or 0)))
    return states


def known_dependencies() -> list[str]:
    """The dependencies worth watching: every configured model, and every one given a rate limit."""
    models = {f"model:{name}" for name in getattr(settings, "STEPWISE_MODELS", {})}
    return sorted(models | set(settings.STEPWISE_RATE_LIMITS))


def _seconds() -> float:
    """The time as a Unix timestamp, from the one clock (tests pin it inside a second)."""
    return clock_now().timestamp()


def _count(key: str, *, timeout: int) -> int:
    """Add one to a shared counter (atomic INCR on Redis) and return its new value."""
    cache.add(key, 0, timeout=timeout)
    try:
        return cache.incr(key)
    except ValueError:  # expired between add and incr
        cache.add(key, 1, timeout=timeout)
        return 1
