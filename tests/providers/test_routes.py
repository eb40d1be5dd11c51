"""A logical model's ordered routes, one call at a time: the next route answers when one fails
transiently, never when the reply is merely invalid, within the step's deadline; a team's
egress policy skips a route it forbids. Two real local servers: an OpenAI-compatible one and an
Anthropic-compatible one (tests/support/fake_llm.py)."""
from decimal import Decimal

import pytest

from audit.services import external_call_authorize
from budgets.services import cost_of
from orchestrator.engine.executors import ExecContext, SpentStepError, execute
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.integrations.providers import PROVIDERS, routes_for
from orchestrator.integrations.providers.routes import route_name
from tests.factories import SETUP
from tests.support.fake_llm import (
    MODEL_VERSION,
    TOKENS_IN,
    TOKENS_OUT,
    FakeLLM,
    reply,
    slow,
    status,
    text,
)

pytestmark = pytest.mark.django_db
VALID = {"category": "billing"}
SCHEMA = {"type": "object", "required": ["category"], "additionalProperties": False,
          "properties": {"category": {"enum": ["billing", "technical"]}}}
PRIMARY_PRICES = {"input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0}
SECONDARY_PRICES = {"input_usd_per_mtok": 0.5, "output_usd_per_mtok": 1.0}


@pytest.fixture(autouse=True)
def closed_breakers():
    """Each test's routes start with their shared breakers closed (same names, same cache)."""
    from django.core.cache import cache

    cache.clear()


@pytest.fixture
def primary():
    with FakeLLM() as server:
        yield server


@pytest.fixture
def secondary():
    with FakeLLM() as server:
        yield server


def routes(primary: FakeLLM, secondary: FakeLLM, *, primary_timeout_s: float = 5,
           secondary_host: str = "127.0.0.1") -> dict:
    secondary_url = secondary.url.replace("127.0.0.1", secondary_host)
    return {"routes": [
        {"provider": "openai", "base_url": primary.openai_base_url, "model_id": "gpt-primary",
         "timeout_s": primary_timeout_s, **PRIMARY_PRICES},
        {"provider": "anthropic", "base_url": secondary_url, "model_id": "claude-secondary",
         "api_key_env": "FAKE_ANTHROPIC_KEY", "timeout_s": 5, **SECONDARY_PRICES},
    ]}


@pytest.fixture
def chain(settings, monkeypatch, primary, secondary) -> dict:
    monkeypatch.setenv("FAKE_ANTHROPIC_KEY", "sk-ant-test")
    entry = routes(primary, secondary)
    settings.STEPWISE_MODELS = {**settings.STEPWISE_MODELS, "chain": entry}
    return entry


def classify(**fields) -> dict:
    return {"name": "classify", "type": "agent", "model": "chain", "timeout_s": 30,
            "prompt": "Classify: {{ input.body }}", "output_schema": SCHEMA,
            "repair_attempts": 1, **fields}


def run_classify(team, spec: dict):
    """Execute the step the way a worker's executor does, for a real run of its workflow."""
    definition = {"name": "t-routes", "input_schema": {"type": "object"}, "steps": [spec]}
    version, _ = workflow_save(team=team, definition=definition, actor=SETUP)
    started = run_start(version=version, input={"body": "my invoice is wrong"}, actor=SETUP)
    step = started.steps.get(name=spec["name"])
    ctx = ExecContext(str(started.id), version.workflow.name, spec["name"], 1,
                      f"{started.id}:{spec['name']}:default", step_id=step.id, team=team.slug,
                      authorize=external_call_authorize, price=cost_of)
    normalized = next(s for s in version.normalized["steps"] if s["name"] == spec["name"])
    return execute(normalized, {"input": {"body": "my invoice is wrong"}, "steps": {}}, ctx)


def cost(prices: dict) -> Decimal:
    return (Decimal(str(prices["input_usd_per_mtok"])) * TOKENS_IN
            + Decimal(str(prices["output_usd_per_mtok"])) * TOKENS_OUT) / 1_000_000


@pytest.mark.parametrize(("failure", "error_class"), [
    (status(503), "transient"),
    (status(429, {"retry-after": "0"}), "rate_limit"),
    (status(529), "transient"),
])
def test_a_transient_failure_of_the_first_route_is_answered_by_the_second(
        team, chain, primary, secondary, failure, error_class):
    primary.then(failure)
    secondary.then(reply(VALID))

    result = run_classify(team, classify())

    assert result.output == VALID
    assert (result.model, result.provider) == ("chain", "anthropic")
    assert result.cost_usd == cost(SECONDARY_PRICES)
    assert (result.tokens_in, result.tokens_out) == (TOKENS_IN, TOKENS_OUT)
    assert result.meta["model_id"] == MODEL_VERSION
    failed, answered = result.meta["routes"]
    assert failed == {**failed, "outcome": "failed", "error_class": error_class, "index": 0,
                      "provider": "openai", "model_id": "gpt-primary", "cost_usd": "0"}
    assert answered == {**answered, "outcome": "answered", "index": 1, "provider": "anthropic",
                        "tokens_in": TOKENS_IN, "tokens_out": TOKENS_OUT,
                        "cost_usd": str(cost(SECONDARY_PRICES))}
    assert [len(primary.requests), len(secondary.requests)] == [1, 1]
    assert secondary.requests[0]["body"]["model"] == "claude-secondary"


def test_a_route_that_hangs_past_its_timeout_is_answered_by_the_next(
        settings, team, primary, secondary, monkeypatch):
    monkeypatch.setenv("FAKE_ANTHROPIC_KEY", "sk-ant-test")
    settings.STEPWISE_MODELS = {**settings.STEPWISE_MODELS,
                                "chain": routes(primary, secondary, primary_timeout_s=1)}
    primary.then(slow(4, reply(VALID)))
    secondary.then(reply(VALID))

    result = run_classify(team, classify(timeout_s=20))

    assert result.output == VALID and result.provider == "anthropic"
    assert [r["outcome"] for r in result.meta["routes"]] == ["failed", "answered"]
    assert result.meta["routes"][0]["error_class"] == "timeout"
    assert result.cost_usd == cost(SECONDARY_PRICES)


def test_the_next_route_gets_only_what_is_left_of_the_step_deadline(
        settings, team, primary, secondary, monkeypatch):
    monkeypatch.setenv("FAKE_ANTHROPIC_KEY", "sk-ant-test")
    # The first route may take 2s of the step's 3; the second's own 5s would let it answer
    # after 2s, but only about 1s of the step is left for it.
    settings.STEPWISE_MODELS = {**settings.STEPWISE_MODELS,
                                "chain": routes(primary, secondary, primary_timeout_s=2)}
    primary.then(slow(4, reply(VALID)))
    secondary.then(slow(2, reply(VALID)))

    with pytest.raises(SpentStepError) as failed:
        run_classify(team, classify(timeout_s=3))

    assert failed.value.error_class == "timeout"
    assert len(secondary.requests) == 1
    assert [r["error_class"] for r in failed.value.spent.meta["routes"]] == ["timeout", "timeout"]


def test_with_every_route_down_the_call_fails_transient_with_each_route_recorded(
        team, chain, primary, secondary):
    primary.default = status(503)
    secondary.default = status(500)

    with pytest.raises(SpentStepError) as failed:
        run_classify(team, classify())

    assert failed.value.error_class == "transient"
    assert [(r["index"], r["outcome"], r["error_class"]) for r in failed.value.spent.meta["routes"]] == [
        (0, "failed", "transient"), (1, "failed", "transient")]
    assert failed.value.spent.cost_usd == 0


@pytest.mark.parametrize(("failure", "error_class"), [(status(401), "auth"), (status(400), "invalid_request")])
def test_a_failure_that_is_not_transient_does_not_move_to_the_next_route(
        team, chain, primary, secondary, failure, error_class):
    primary.then(failure)

    with pytest.raises(SpentStepError) as failed:
        run_classify(team, classify())

    assert failed.value.error_class == error_class
    assert secondary.requests == []


def test_an_invalid_reply_is_repaired_on_the_route_that_gave_it_not_passed_to_the_next(
        team, chain, primary, secondary):
    primary.then(text("billing, I think"), reply(VALID))

    result = run_classify(team, classify())

    assert result.output == VALID and result.provider == "openai"
    assert len(primary.requests) == 2 and secondary.requests == []
    assert [(r["turn"], r["index"], r["outcome"]) for r in result.meta["routes"]] == [
        (0, 0, "answered"), (1, 0, "answered")]
    assert result.cost_usd == 2 * cost(PRIMARY_PRICES)


def test_a_route_the_teams_egress_policy_forbids_is_skipped_with_the_reason(
        settings, team, primary, secondary, monkeypatch):
    monkeypatch.setenv("FAKE_ANTHROPIC_KEY", "sk-ant-test")
    settings.STEPWISE_MODELS = {**settings.STEPWISE_MODELS,
                                "chain": routes(primary, secondary, secondary_host="localhost")}
    settings.STEPWISE_EGRESS = {"teams": {team.slug: {"deny_hosts": ["127.0.0.1"]}}}
    secondary.then(reply(VALID))

    result = run_classify(team, classify())

    assert result.output == VALID and result.provider == "anthropic"
    skipped, answered = result.meta["routes"]
    assert skipped["outcome"] == "skipped" and "egress policy refuses the host '127.0.0.1'" in skipped["error"]
    assert answered["outcome"] == "answered"
    assert primary.requests == []


def test_a_team_whose_policy_forbids_every_route_gets_a_policy_failure_and_no_call(
        settings, team, chain, primary, secondary):
    settings.STEPWISE_EGRESS = {"teams": {team.slug: {"tools": {"model": {"hosts": ["api.example.com"]}}}}}

    with pytest.raises(SpentStepError) as failed:
        run_classify(team, classify())

    assert failed.value.error_class == "policy"
    assert primary.requests == [] and secondary.requests == []


def test_a_plain_entry_is_one_route_and_named_routes_keep_their_names(settings, chain):
    settings.STEPWISE_MODELS = {**settings.STEPWISE_MODELS,
                                "plain": {"provider": "scripted"},
                                "named": {"routes": [{"provider": "scripted", "name": "offline"}]}}

    [plain] = routes_for("plain", PROVIDERS)
    assert (plain.routed, plain.price_model, plain.dependency) == (
        False, "plain", f"route:plain:{route_name({'provider': 'scripted'})}")
    [named] = routes_for("named", PROVIDERS)
    assert (named.routed, named.name, named.price_model) == (True, "offline", "")


def test_a_registry_entry_that_cannot_serve_a_call_stops_the_system_check(settings):
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    settings.STEPWISE_MODELS = {
        "fast": {"routes": [{"provider": "openai", "model_id": "a"}, {"provider": "nope"},
                            {"provider": "openai", "model_id": "a"}]},
        "deep": {"routes": []},
        "ok": {"routes": [{"provider": "scripted"}]},
    }

    with pytest.raises(SystemCheckError) as stopped:
        call_command("check")

    message = str(stopped.value)
    assert "STEPWISE_MODELS.deep.routes: must be a non-empty list of routes" in message
    assert "STEPWISE_MODELS.fast.routes[1].provider: 'nope' is not one of" in message
    assert "STEPWISE_MODELS.fast.routes[2]: a second route named 'openai:a@default'" in message
    assert "STEPWISE_MODELS.ok" not in message
