"""The leader lease: one holder at a time, renewed by its holder, taken over once it expires."""
from datetime import timedelta

import pytest

from orchestrator.engine import clock
from orchestrator.engine.services.leadership import (
    leadership_hold,
    leadership_holder,
    leadership_release,
)
from orchestrator.models import Leadership

pytestmark = pytest.mark.django_db


@pytest.fixture
def at(monkeypatch):
    moment = {"now": clock.now()}
    monkeypatch.setattr(clock, "_source", lambda: moment["now"])

    def advance(seconds: float) -> None:
        moment["now"] += timedelta(seconds=seconds)
    return advance


def test_the_first_contender_leads_and_a_second_waits_while_the_lease_runs(at):
    assert leadership_hold(name="beat", holder="a", lease_s=10)
    assert not leadership_hold(name="beat", holder="b", lease_s=10)
    at(9)
    assert leadership_hold(name="beat", holder="a", lease_s=10)  # renewed
    at(9)
    assert not leadership_hold(name="beat", holder="b", lease_s=10)
    assert leadership_holder(name="beat") == "a"


def test_a_lease_not_renewed_is_taken_over_and_the_old_holder_cannot_renew_it(at):
    assert leadership_hold(name="beat", holder="a", lease_s=10)
    at(11)
    assert leadership_hold(name="beat", holder="b", lease_s=10)
    assert not leadership_hold(name="beat", holder="a", lease_s=10)  # resumed after a pause
    assert Leadership.objects.get(name="beat").holder == "b"


def test_a_released_lease_is_taken_at_once(at):
    assert leadership_hold(name="beat", holder="a", lease_s=10)
    assert leadership_release(name="beat", holder="a")
    at(0.001)
    assert leadership_hold(name="beat", holder="b", lease_s=10)
    assert not leadership_release(name="beat", holder="a")
