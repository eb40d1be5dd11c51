"""How a provider quota is divided between capacity classes (`quotas.decide`, a pure function of
the shared record): a class always gets its guaranteed share, borrows what idle classes leave,
never the unused guarantee of a class that asked lately, and never beyond the limit; a slot a
dead worker held expires; a new minute's tokens start at zero; a release settles the tokens
to what the call used. The last tests take reservations through the shared store itself."""
import uuid

import pytest

from orchestrator.engine.quotas import (
    Quota,
    Refusal,
    Reservation,
    decide,
    quota_release,
    quota_reserve,
    quota_usage,
)

SHARES = {"interactive": 0.6, "batch": 0.2, "evaluation": 0.2}
AT = 6_000_000.0  # the start of a minute


def holding(**calls_by_class) -> dict:
    """A record whose classes hold these many call slots (each until far ahead)."""
    calls = {f"{name}-{i}": [name, AT + 600] for name, n in calls_by_class.items() for i in range(n)}
    return {"calls": calls, "tokens": {}, "minute": int(AT // 60),
            "seen": {name: AT for name in calls_by_class}}


TEN_CALLS = Quota(concurrent=10)


def ask(state: dict, capacity: str, *, quota=TEN_CALLS, tokens=0, at=AT, idle_s=30):
    return decide(state, quota, SHARES, capacity=capacity, tokens=tokens, holder="new", at=at,
                  hold_s=60, idle_s=idle_s)


@pytest.mark.parametrize("state, capacity, granted", [
    (holding(), "evaluation", True),                        # nobody else: borrows freely
    (holding(evaluation=9), "evaluation", True),            # ... up to the limit
    (holding(evaluation=10), "evaluation", False),          # never beyond it
    (holding(interactive=0, evaluation=3), "evaluation", True),   # 6 kept for a class that asked
    (holding(interactive=0, evaluation=4), "evaluation", False),
    (holding(interactive=1, evaluation=2), "evaluation", True),   # 10 - 5 kept unused - 3 held
    (holding(interactive=1, evaluation=4), "evaluation", False),
    (holding(evaluation=10 - 1), "interactive", True),      # room left: anyone may take it
    (holding(interactive=6, evaluation=2), "interactive", True),  # borrows the idle batch share
    (holding(interactive=7, evaluation=2, batch=0), "interactive", False),  # batch asked lately
    (holding(interactive=5, evaluation=5), "interactive", False),  # full: waits for a slot
])
def test_a_class_gets_its_share_and_borrows_only_what_idle_classes_leave(state, capacity, granted):
    after, refused = ask(state, capacity)

    assert (refused is None) == granted
    assert ("new" in after["calls"]) == granted


def test_a_class_that_has_not_asked_for_a_while_lends_its_share():
    state = holding(evaluation=3)
    state["seen"]["interactive"] = AT - 31

    assert ask(state, "evaluation", idle_s=30)[1] is None


def test_a_slot_whose_holder_died_expires_with_its_lease():
    state = holding(evaluation=10)

    assert ask(state, "evaluation")[1] == ("concurrent", 0.2)
    assert ask(state, "evaluation", at=AT + 601)[1] is None


def test_tokens_of_a_minute_are_shared_the_same_way_and_a_new_minute_starts_at_zero():
    quota = Quota(tokens_per_minute=1000)
    state, refused = ask({}, "evaluation", quota=quota, tokens=400)
    assert refused is None
    state, refused = ask(state, "interactive", quota=quota, tokens=500)
    assert refused is None
    state, refused = ask(state, "evaluation", quota=quota, tokens=200, at=AT + 10)

    assert refused == ("tokens_per_minute", 50.0)  # until the minute ends
    assert ask(state, "evaluation", quota=quota, tokens=200, at=AT + 60)[1] is None


@pytest.fixture
def clock_still(monkeypatch):
    """Tokens count per calendar minute: with the engine's clock standing still, a minute that
    ends between a test's reservation and its readings does not zero what they read."""
    from django.utils import timezone

    from orchestrator.engine import clock

    still = timezone.now()
    monkeypatch.setattr(clock, "_source", lambda: still)


def test_a_reservation_is_taken_through_the_shared_store_and_settled_to_what_was_used(
        settings, clock_still):
    metered = f"model:metered-{uuid.uuid4().hex[:8]}"  # a record no earlier test wrote
    settings.STEPWISE_QUOTAS = {metered: {"concurrent": 1, "tokens_per_minute": 100}}

    first = quota_reserve(metered, "interactive", 40, hold_s=60)
    second = quota_reserve(metered, "interactive", 40, hold_s=60)
    assert isinstance(first, Reservation)
    assert isinstance(second, Refusal)
    assert second.reason == f"waiting for a call slot of {metered} (interactive quota)"
    held = {u.capacity: (u.calls, u.tokens) for u in quota_usage([metered])}
    quota_release(first, tokens_used=25)

    assert held["interactive"][0] == 1
    used = {u.capacity: (u.calls, u.tokens) for u in quota_usage([metered])}
    assert used["interactive"] == (0, held["interactive"][1] - 15)
    assert quota_reserve("model:none", "interactive", 40, hold_s=60) is None
    again = quota_reserve(metered, "interactive", 40, hold_s=60)
    assert isinstance(again, Reservation)
    quota_release(again, tokens_used=0)


@pytest.mark.django_db
def test_quota_in_use_is_exported_per_dependency_and_class_and_shown_to_operators(
        client, settings, operator, clock_still):
    from django.contrib.auth import get_user_model
    from django.urls import reverse
    from prometheus_client.parser import text_string_to_metric_families

    watched = f"model:watched-{uuid.uuid4().hex[:8]}"
    settings.STEPWISE_QUOTAS = {watched: {"concurrent": 5, "tokens_per_minute": 1000}}
    held = quota_reserve(watched, "evaluation", 120, hold_s=60)
    client.force_login(get_user_model().objects.create_superuser("root-quota", "q@example.com", "x"))

    text = client.get("/metrics").content.decode()
    seen = {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}
    client.force_login(operator)
    shown = client.get(reverse("admin:orchestrator_operations_state")).json()["quotas"]
    quota_release(held, tokens_used=100)

    evaluation = (("capacity", "evaluation"), ("dependency", watched))
    assert seen[("stepwise_quota_calls_in_flight", evaluation)] == 1
    assert seen[("stepwise_quota_tokens_this_minute", evaluation)] == 120
    assert seen[("stepwise_quota_calls_in_flight", (("capacity", "interactive"), ("dependency", watched)))] == 0
    assert seen[("stepwise_quota_concurrent_limit", (("dependency", watched),))] == 5
    assert seen[("stepwise_quota_tokens_per_minute_limit", (("dependency", watched),))] == 1000
    assert {(q["capacity"], q["calls"], q["tokens"], q["guaranteed_calls"]) for q in shown} == {
        ("interactive", 0, 0, 3.0), ("batch", 0, 0, 1.0), ("evaluation", 1, 120, 1.0)}
