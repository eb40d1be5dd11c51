"""LLM-classified routing: the model picks among declared routes; anything else is the default."""
import pytest

from orchestrator.engine.executors import SpentStepError
from orchestrator.engine.executors.router import llm_decision, route_menu
from tests.support.fake_llm import MODEL_VERSION, TOKENS_IN, call, reply, status, text

pytestmark = pytest.mark.django_db


def triage(model: str = "gpt", **fields) -> dict:
    return {"name": "triage", "type": "router", "strategy": "llm", "model": model,
            "prompt": "Route this ticket: {{ input.body }}",
            "routes": [
                {"name": "billing", "description": "Invoices, refunds, charges.", "then": ["bill"]},
                {"name": "technical", "description": "Bugs and outages.", "then": ["fix"]},
            ],
            "default": {"name": "human", "description": "Anything else.", "then": ["ask"]},
            **fields}


def workflow(router: dict) -> dict:
    echo = {"type": "tool", "tool": "core.echo", "after": ["triage"]}
    return {"name": "triage", "input_schema": {"type": "object"},
            "steps": [router, {"name": "bill", **echo}, {"name": "fix", **echo}, {"name": "ask", **echo}]}


@pytest.fixture
def route(run_step):
    def run(router: dict | None = None):
        router = router or triage()
        body = {"body": "I was charged twice"}
        return run_step("triage", body, {"input": body, "steps": {}}, definition=workflow(router))
    return run


@pytest.mark.parametrize("model", ["gpt", "claude"])
def test_the_model_chooses_a_declared_route(fake_llm, route, model):
    fake_llm.then(reply({"route": "billing", "reason": "a double charge"}))

    result = route(triage(model))

    assert result.output == {"route": "billing", "chosen_by": "model"}
    assert result.tokens_in == TOKENS_IN and result.meta["model_id"] == MODEL_VERSION
    assert result.meta["decision"]["route"] == "billing"
    assert '"billing"' in result.meta["decision"]["answer"]
    assert len(result.meta["prompt_hash"]) == 64


def test_the_prompt_shows_the_route_descriptions_and_asks_for_a_name(fake_llm, route):
    fake_llm.then(reply({"route": "technical"}))

    route()

    body = fake_llm.requests[0]["body"]
    system = body["messages"][0]["content"]
    assert "- billing: Invoices, refunds, charges." in system
    assert "- human: Anything else." in system
    assert body["response_format"]["json_schema"]["schema"]["properties"]["route"]["enum"] == [
        "billing", "technical", "human"]
    assert body["messages"][1]["content"] == "Route this ticket: I was charged twice"


@pytest.mark.parametrize("answer", [
    reply({"route": "refunds"}),                            # not a declared route
    reply({"route": "Billing"}),                            # not exactly a declared name
    reply({"route": "billing", "skip": ["fix"]}),           # an extra field
    reply({"route": ["billing", "technical"]}),             # two routes
    reply("billing"),                                       # not an object
    text("billing, definitely"),                            # not JSON
    text(""),                                               # nothing
    call("steps.skip", {"step": "approve"}),                # a tool that was not offered
])
def test_an_unknown_or_malformed_answer_takes_the_default_route(fake_llm, route, models, answer):
    models["gpt"]["structured_output"] = "tools" if answer.kind == "call" else "json_schema"
    fake_llm.then(answer)

    result = route()

    assert result.output == {"route": "human", "chosen_by": "default"}
    assert result.meta["decision"]["why"]
    assert len(fake_llm.requests) == 1  # no repair turns for a router


def test_a_provider_failure_is_retried_by_policy_not_defaulted(fake_llm, route):
    fake_llm.then(status(429, {"Retry-After": "1"}))

    with pytest.raises(SpentStepError) as failure:
        route()

    assert (failure.value.error_class, failure.value.retry_after_s) == ("rate_limit", 1.0)


def test_offline_the_scripted_provider_answers(route):
    result = route(triage("fast", script=[{"when": "input.body.contains('charged')",
                                           "output": {"route": "billing"}},
                                          {"output": {"route": "technical"}}]))
    assert result.output == {"route": "billing", "chosen_by": "model"}


def test_the_decision_function_only_admits_declared_names():
    spec = triage()
    assert llm_decision(spec, {"route": "technical"}, "")["route"] == "technical"
    assert llm_decision(spec, {"route": "human"}, "") == {"route": "human", "chosen_by": "model"}
    assert llm_decision(spec, {"route": "bill"}, "")["chosen_by"] == "default"
    assert llm_decision(spec, None, "the reply is not valid JSON")["chosen_by"] == "default"
    assert "Routes:" in route_menu(spec)
