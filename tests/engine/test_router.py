"""Rule and score routers choose deterministically from the step input."""
import pytest

from orchestrator.engine.executors.router import choose

SCORE = {"strategy": "score", "score": "input.score", "default": {"name": "cold", "then": []},
         "routes": [{"name": "warm", "min": 0.5, "then": []},  # written low to high on purpose
                    {"name": "hot", "min": 0.8, "then": []}]}


@pytest.mark.parametrize("score, route", [(0.95, "hot"), (0.8, "hot"), (0.6, "warm"), (0.1, "cold")])
def test_score_router_takes_the_highest_threshold_reached_whatever_the_order(score, route):
    assert choose(SCORE, {"input": {"score": score}, "steps": {}}) == {"route": route, "score": score}


def test_rules_router_takes_the_first_route_that_holds_else_the_default():
    spec = {"strategy": "rules", "default": {"name": "other", "then": []}, "routes": [
        {"name": "a", "when": "input.x > 1", "then": []}, {"name": "b", "when": "input.x > 0", "then": []}]}
    assert choose(spec, {"input": {"x": 2}, "steps": {}}) == {"route": "a"}
    assert choose(spec, {"input": {"x": 1}, "steps": {}}) == {"route": "b"}
    assert choose(spec, {"input": {"x": 0}, "steps": {}}) == {"route": "other"}
