"""Shared rate limits and circuit breakers (the cache is what all workers share)."""
import pytest

from orchestrator.engine import limits

LOCMEM = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}


@pytest.fixture(autouse=True)
def shared(settings):
    settings.CACHES = LOCMEM
    settings.STEPWISE_BREAKER_FAILURES = 3
    settings.STEPWISE_BREAKER_COOLDOWN_S = 60
    from django.core.cache import cache

    cache.clear()


@pytest.mark.parametrize("spec, dependency", [
    ({"type": "agent", "model": "fast"}, "model:fast"),
    ({"type": "router", "strategy": "llm", "model": "fast"}, "model:fast"),
    ({"type": "tool", "tool": "http.request"}, "tool:http.request"),
    ({"type": "tool", "tool": "http.request", "params": {"url": "http://api.example.com:81/x"}},
     "tool:http.request:api.example.com:81"),
    ({"type": "tool", "tool": "email.send"}, "tool:email.send"),
    ({"type": "router", "strategy": "rules"}, ""),
])
def test_dependency_of_a_step(spec, dependency):
    assert limits.dependency_of(spec) == dependency


@pytest.fixture
def at(monkeypatch):
    """Pin the engine's clock at `seconds` past a whole second (no wall-clock second to fit in)."""
    from datetime import UTC, datetime, timedelta

    from orchestrator.engine import clock

    start = datetime(2026, 1, 1, tzinfo=UTC)

    def move(seconds: float) -> None:
        monkeypatch.setattr(clock, "_source", lambda: start + timedelta(seconds=seconds))

    return move


def test_rate_limit_admits_up_to_the_limit_per_second_then_asks_to_wait(settings, at):
    settings.STEPWISE_RATE_LIMITS = {"tool:x": 3}
    at(10.25)
    waits = [limits.rate_limit_wait("tool:x") for _ in range(5)]
    assert waits == [0, 0, 0, 0.75, 0.75]  # until the next second's window
    at(10.99)
    assert limits.rate_limit_wait("tool:x") == pytest.approx(0.01)
    at(11.5)  # a new second: a new window
    assert [limits.rate_limit_wait("tool:x") for _ in range(4)] == [0, 0, 0, 0.5]
    assert limits.rate_limit_wait("tool:unlimited") == 0


def test_breaker_opens_after_consecutive_transient_failures(at):
    at(0)
    for _ in range(2):
        limits.breaker_record("model:fast", error_class="transient")
    assert limits.breaker_read("model:fast").open_for == 0
    limits.breaker_record("model:fast", error_class="timeout")
    assert limits.breaker_read("model:fast").open_for == 60
    at(59.5)
    assert limits.breaker_read("model:fast").open_for == 0.5


def test_permanent_failures_do_not_open_the_breaker_and_a_success_resets_it():
    for _ in range(5):
        limits.breaker_record("tool:y", error_class="permanent")
    assert limits.breaker_read("tool:y").open_for == 0
    limits.breaker_record("tool:y", error_class="transient")
    limits.breaker_record("tool:y", error_class="transient")
    limits.breaker_record("tool:y", error_class=None)
    limits.breaker_record("tool:y", error_class="transient")
    assert limits.breaker_read("tool:y").open_for == 0


def test_after_the_cooldown_exactly_one_call_probes(settings, at):
    settings.STEPWISE_BREAKER_COOLDOWN_S = 10
    at(0)
    for _ in range(3):
        limits.breaker_record("tool:z", error_class="transient")
    at(10.01)
    assert limits.breaker_read("tool:z").open_for == 0  # the probe
    assert limits.breaker_read("tool:z").open_for > 0  # everyone else waits


def test_a_success_after_a_closed_reading_writes_nothing_and_one_after_failures_resets_them(
        monkeypatch):
    """The common call (closed breaker, success) costs the cache one read and no write; a
    success whose reading saw failures counted resets them."""
    from django.core.cache import caches

    cache = caches["default"]  # the object itself: the proxy would be patched past the test
    writes = []
    for name in ("delete", "delete_many", "set", "add", "incr"):
        real = getattr(cache, name)
        monkeypatch.setattr(cache, name, lambda *a, _real=real, _name=name, **k: (
            writes.append(_name), _real(*a, **k))[1])

    reading = limits.breaker_read("tool:w")
    assert reading == limits.BreakerReading(0.0, clean=True)
    limits.breaker_record("tool:w", error_class=None, reading=reading)
    assert writes == []

    limits.breaker_record("tool:w", error_class="transient")
    limits.breaker_record("tool:w", error_class="transient")
    reading = limits.breaker_read("tool:w")
    assert not reading.clean and reading.open_for == 0
    limits.breaker_record("tool:w", error_class=None, reading=reading)
    limits.breaker_record("tool:w", error_class="transient")
    limits.breaker_record("tool:w", error_class="transient")
    assert limits.breaker_read("tool:w").open_for == 0  # two failures since the reset, not four
