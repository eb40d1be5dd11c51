"""A provider outage changes nothing: real worker processes call a logical model whose first
route is a local OpenAI-compatible server and whose second is a local Anthropic-compatible one.

The worker group serving the routed models starts with the two servers' addresses in its
registry (workers read it when they start); every other queue is the session's `workers`.
Each test uses a model of its own, so one test's failures never open another's breakers.
"""
import json
import os
from decimal import Decimal

import pytest
from django.conf import settings

from audit.timeline import run_timeline
from orchestrator.engine.hashing import digest_of
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Event, StepAttempt
from tests.factories import SETUP
from tests.support.fake_llm import (
    MODEL_VERSION,
    TOKENS_IN,
    TOKENS_OUT,
    FakeLLM,
    reply,
    slow,
    status,
)

from .conftest import WorkerGroup, wait_for_run

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

VALID = {"category": "billing"}
SCHEMA = {"type": "object", "required": ["category"], "additionalProperties": False,
          "properties": {"category": {"enum": ["billing", "technical"]}}}
PRIMARY_PRICES = {"input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0}
# Above the first route's: a call to it must fit what is reserved for the call, which it does
# while the model has no history (the default estimate). A cheaper one never needs to.
SECONDARY_PRICES = {"input_usd_per_mtok": 3.0, "output_usd_per_mtok": 15.0}
CHEAPER_PRICES = {"input_usd_per_mtok": 1.0, "output_usd_per_mtok": 1.0}
MODELS = ("gw_503", "gw_429", "gw_hang", "gw_down", "gw_breaker", "gw_pricey")
# Consecutive failures that open a route's breaker on these workers.
BREAKER_FAILURES = 2


def registry(primary: FakeLLM, secondary: FakeLLM) -> dict:
    def chain(model: str, *, primary_timeout_s: float = 10, secondary_prices=SECONDARY_PRICES):
        return {"routes": [
            {"provider": "openai", "base_url": primary.openai_base_url, "model_id": f"gpt-{model}",
             "timeout_s": primary_timeout_s, **PRIMARY_PRICES},
            {"provider": "anthropic", "base_url": secondary.url, "model_id": f"claude-{model}",
             "api_key_env": "STEPWISE_TEST_LLM_KEY", "timeout_s": 10, **secondary_prices},
        ]}
    models = {model: chain(model) for model in MODELS}
    models["gw_hang"] = chain("gw_hang", primary_timeout_s=1)
    # Its runs build a history of cheap calls, which is then what a call reserves.
    models["gw_breaker"] = chain("gw_breaker", secondary_prices=CHEAPER_PRICES)
    # Priced far above the first route: a call's projection cannot fit a small reservation.
    models["gw_pricey"] = chain("gw_pricey", secondary_prices={"input_usd_per_mtok": 1000.0,
                                                               "output_usd_per_mtok": 1000.0})
    return models


@pytest.fixture(scope="module")
def route_workers(workers):
    with FakeLLM() as primary, FakeLLM() as secondary:
        models = registry(primary, secondary)
        env = {"STEPWISE_MODELS": json.dumps({**settings.STEPWISE_MODELS, **models}),
               "STEPWISE_TEST_LLM_KEY": "sk-test",
               "STEPWISE_BREAKER_FAILURES": str(BREAKER_FAILURES),
               "STEPWISE_BREAKER_COOLDOWN_S": "600"}
        group = WorkerGroup(f"itest-routes-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}",
                            queues=",".join(f"agent.{m}" for m in MODELS), env=env)
        from django.core.cache import cache

        cache.clear()  # breakers of an earlier session of these tests
        group.start()
        yield primary, secondary, models
        group.stop()


@pytest.fixture
def servers(route_workers, settings):
    primary, secondary, models = route_workers
    settings.STEPWISE_MODELS = {**settings.STEPWISE_MODELS, **models}  # for saving definitions
    for server in (primary, secondary):
        server.reset()
        server.default = reply(VALID)
    return primary, secondary


def start(team, model: str, **step_fields):
    step = {"name": "classify", "type": "agent", "model": model, "timeout_s": 30,
            "prompt": "Classify: {{ input.body }}", "output_schema": SCHEMA, **step_fields}
    definition = {"name": f"routes-{model.replace('_', '-')}", "input_schema": {"type": "object"},
                  "steps": [step]}
    version, _ = workflow_save(team=team, definition=definition, actor=SETUP)
    return run_start(version=version, input={"body": "my invoice is wrong"}, actor=SETUP)


def cost(prices: dict) -> Decimal:
    return (Decimal(str(prices["input_usd_per_mtok"])) * TOKENS_IN
            + Decimal(str(prices["output_usd_per_mtok"])) * TOKENS_OUT) / 1_000_000


def calls(server: FakeLLM, model: str) -> int:
    """Requests `server` received for `model`'s route (each route names its own model id)."""
    return sum(1 for r in server.requests if r["body"].get("model", "").endswith(model))


@pytest.mark.parametrize(("model", "failure", "error_class"), [
    ("gw_503", status(503), "transient"),
    ("gw_429", status(429, {"retry-after": "0"}), "rate_limit"),
    ("gw_hang", slow(5, reply(VALID)), "timeout"),
])
def test_the_second_route_answers_when_the_first_fails_and_the_cost_is_the_seconds(
        servers, team, model, failure, error_class):
    primary, secondary = servers
    primary.default = failure

    run = wait_for_run(start(team, model).id, states=("completed", "failed"))

    assert run.state == "completed", run.error
    attempt = StepAttempt.objects.get(step__run_id=run.id)
    assert attempt.outcome == "succeeded" and attempt.number == 1
    assert (attempt.provider, attempt.model) == ("anthropic", model)
    assert attempt.cost_usd == cost(SECONDARY_PRICES) == run.cost_usd
    assert [(r["provider"], r["outcome"], r["error_class"]) for r in attempt.routes] == [
        ("openai", "failed", error_class), ("anthropic", "answered", "")]
    assert attempt.routes[1]["cost_usd"] == str(cost(SECONDARY_PRICES))
    assert (calls(primary, model), calls(secondary, model)) == (1, 1)
    [event] = Event.objects.filter(run_id=run.id, kind="step.routes")
    assert event.payload["routes"] == attempt.routes
    # The attestation names the route that answered and, per route tried, the hashes of the
    # request it was sent and of what it answered.
    record = run.steps.get(name="classify").attestation["record"]
    assert record["route"] == attempt.routes[1]["route"]
    assert record["route_model"] == f"anthropic/{MODEL_VERSION}"
    [call] = record["calls"]
    assert [(r["route"], r["outcome"]) for r in call["routes"]] == [
        (attempt.routes[0]["route"], "failed"), (attempt.routes[1]["route"], "answered")]
    sent = {"provider": "anthropic", "model": f"claude-{model}", "system": "",
            "prompt": "Classify: my invoice is wrong", "messages": [], "output_schema": SCHEMA,
            "temperature": None, "max_tokens": None}
    assert call["routes"][1]["request"] == digest_of(sent)
    assert call["routes"][0]["request"] == digest_of({**sent, "provider": "openai",
                                                      "model": f"gpt-{model}"})
    answer = {"raw": json.dumps(VALID), "model_id": MODEL_VERSION, "tokens_in": TOKENS_IN,
              "tokens_out": TOKENS_OUT}
    assert call["routes"][1]["response"] == call["response"] == digest_of(answer)
    assert call["route"] == attempt.routes[1]["route"]
    assert len(call["routes"][0]["response"]) == 64 and call["routes"][0]["response"] != call["response"]
    # The audit timeline says which routes were tried and which answered.
    [said] = [line.text for line in run_timeline(run.id).lines if line.entry.action == "step.routes"]
    first, second = attempt.routes
    assert said == (
        f"Model routes tried in attempt 1: {first['route']} (openai gpt-{model}) failed "
        f"({error_class}: {first['error']}); {second['route']} (anthropic {MODEL_VERSION}) "
        f"answered ({TOKENS_IN}+{TOKENS_OUT} tokens, ${second['cost_usd']}).")


def test_with_both_routes_down_the_step_fails_transient_after_its_retries(servers, team):
    primary, secondary = servers
    primary.default, secondary.default = status(503), status(502)

    run = wait_for_run(start(team, "gw_down", retry={"max_attempts": 2, "base_s": 0.1, "jitter": False}).id,
                       states=("completed", "failed"))

    assert run.state == "failed"
    step = run.steps.get(name="classify")
    assert step.state == "failed" and step.error["class"] == "transient" and step.attempts == 2
    attempts = list(StepAttempt.objects.filter(step=step).order_by("number"))
    assert [a.outcome for a in attempts] == ["failed", "failed"]
    for attempt in attempts:
        assert [(r["provider"], r["outcome"]) for r in attempt.routes] == [
            ("openai", "failed"), ("anthropic", "failed")]
        assert attempt.cost_usd == 0
    assert (calls(primary, "gw_down"), calls(secondary, "gw_down")) == (2, 2)


def test_a_route_whose_breaker_is_open_is_skipped_without_a_call(servers, team):
    primary, secondary = servers
    primary.default = status(503)
    for _ in range(BREAKER_FAILURES):  # each run's call fails on the first route, then answers
        run = wait_for_run(start(team, "gw_breaker").id, states=("completed", "failed"))
        assert run.state == "completed", run.error
    assert calls(primary, "gw_breaker") == BREAKER_FAILURES

    run = wait_for_run(start(team, "gw_breaker").id, states=("completed", "failed"))

    assert run.state == "completed", run.error
    assert calls(primary, "gw_breaker") == BREAKER_FAILURES  # not called again
    assert calls(secondary, "gw_breaker") == BREAKER_FAILURES + 1
    attempt = StepAttempt.objects.get(step__run_id=run.id)
    skipped, answered = attempt.routes
    assert (skipped["outcome"], skipped["error_class"]) == ("skipped", "breaker_open")
    assert answered["outcome"] == "answered" and attempt.cost_usd == cost(CHEAPER_PRICES)


def test_a_costlier_route_that_would_not_fit_the_reservation_is_skipped_with_the_reason(servers, team):
    primary, secondary = servers
    primary.default = status(503)

    # The step's own cap is what each of its calls reserves: far below the second route's price.
    run = wait_for_run(start(team, "gw_pricey", max_cost_usd=0.01).id, states=("completed", "failed"))

    assert run.state == "failed"
    attempt = StepAttempt.objects.get(step__run_id=run.id)
    failed, skipped = attempt.routes
    assert (failed["outcome"], failed["error_class"]) == ("failed", "transient")
    assert skipped["outcome"] == "skipped" and "reserved" in skipped["error"]
    assert attempt.error_class == "transient"
    assert calls(secondary, "gw_pricey") == 0


def test_when_the_first_route_answers_the_attempt_records_it_and_no_routes_event(servers, team):
    primary, secondary = servers

    run = wait_for_run(start(team, "gw_503").id, states=("completed", "failed"))

    assert run.state == "completed", run.error
    attempt = StepAttempt.objects.get(step__run_id=run.id)
    assert (attempt.provider, attempt.cost_usd) == ("openai", cost(PRIMARY_PRICES))
    [answered] = attempt.routes
    assert (answered["index"], answered["outcome"], answered["model_id"]) == (0, "answered", MODEL_VERSION)
    assert not Event.objects.filter(run_id=run.id, kind="step.routes").exists()
    assert calls(secondary, "gw_503") == 0
