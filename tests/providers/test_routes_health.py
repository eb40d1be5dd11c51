"""Route health on the operations page: each route of a routed model with its shared breaker,
closed, open or half-open, and the failures counted toward opening it. The breaker is opened by
real failed calls to a local server (tests/providers/test_routes.py)."""
from datetime import timedelta

import pytest
from django.urls import reverse

from orchestrator.engine import clock
from orchestrator.models import Role
from tests.factories import member
from tests.live.test_pages import signed_in
from tests.support.fake_llm import reply, status

from .test_routes import VALID, chain, classify, closed_breakers, primary, run_classify, secondary  # noqa: F401

pytestmark = pytest.mark.django_db


def health(client, user) -> dict:
    state = signed_in(client, user).get(reverse("admin:orchestrator_operations_state")).json()
    return state["routes"] and {(r["model"], r["provider"]): r for r in state["routes"] if r["model"] == "chain"}


def test_the_operations_page_shows_each_routes_breaker_closed_open_then_half_open(
        client, settings, team, chain, primary, secondary, monkeypatch):  # noqa: F811
    settings.STEPWISE_BREAKER_FAILURES = 2
    settings.STEPWISE_BREAKER_COOLDOWN_S = 60
    operator = member(team, "operator", role=Role.OPERATOR, staff=True)
    primary.default, secondary.default = status(503), reply(VALID)

    run_classify(team, classify())
    routes = health(client, operator)
    assert routes[("chain", "openai")] == {**routes[("chain", "openai")], "state": "closed", "failures": 1,
                                          "model_id": "gpt-primary"}
    assert routes[("chain", "anthropic")]["state"] == "closed"

    run_classify(team, classify())
    routes = health(client, operator)
    first = routes[("chain", "openai")]
    assert (first["state"], first["failures"]) == ("open", 2) and 0 < first["open_for_s"] <= 60
    assert (routes[("chain", "anthropic")]["state"], routes[("chain", "anthropic")]["failures"]) == ("closed", 0)

    later = clock.now() + timedelta(seconds=61)
    monkeypatch.setattr(clock, "_source", lambda: later)
    assert health(client, operator)[("chain", "openai")]["state"] == "half-open"


def test_route_health_is_shown_to_operators_only(client, team, chain):  # noqa: F811
    viewer = member(team, "viewer", role=Role.MEMBER, staff=True)
    state = signed_in(client, viewer).get(reverse("admin:orchestrator_operations_state")).json()
    assert state["routes"] is None
