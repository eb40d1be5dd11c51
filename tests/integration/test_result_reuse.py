"""Result reuse end to end (docs/definitions.md#cache): real worker processes calling a real
local HTTP server that speaks the OpenAI API, which counts the model calls.

A step that declares `cache` copies the output of an identical earlier step of its team
instead of calling the model: the second run's step costs nothing and the model is called
once. A changed prompt, an expired entry and another team's run all call the model again.
"""
import json
import os
import time
from decimal import Decimal

import pytest
from django.conf import settings
from django.urls import reverse

from audit.models import AuditEntry
from audit.timeline import explain
from budgets.selectors import run_budget
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Event, StepResult, StepRun
from tests.conftest import client_for
from tests.factories import SETUP, TeamFactory, member
from tests.support.fake_llm import SCHEMA, TOKENS_IN, TOKENS_OUT, FakeLLM, reply

from .conftest import WorkerGroup, wait_for_run

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

MODEL = "llm_cached"


@pytest.fixture(scope="module")
def model_workers(workers):
    """The fake LLM server and the worker group whose registry points at it."""
    with FakeLLM(default=reply({"category": "billing"})) as server:
        registry = {MODEL: {"provider": "openai", "base_url": server.openai_base_url,
                            "model_id": "gpt-test", "api_key_env": "STEPWISE_TEST_LLM_KEY",
                            "timeout_s": 10, "input_usd_per_mtok": 1.0,
                            "output_usd_per_mtok": 2.0}}
        env = {"STEPWISE_MODELS": json.dumps({**settings.STEPWISE_MODELS, **registry}),
               "STEPWISE_TEST_LLM_KEY": "sk-test"}
        group = WorkerGroup(f"itest-cache-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}",
                            queues=f"agent.{MODEL},agent.{MODEL}.evaluation", env=env)
        group.start()
        yield server, registry
        group.stop()


@pytest.fixture
def fake(model_workers, settings) -> FakeLLM:
    server, registry = model_workers
    settings.STEPWISE_MODELS = {**settings.STEPWISE_MODELS, **registry}  # for saving definitions
    server.reset()
    return server


def classify_workflow(*, prompt: str = "Classify this ticket: {{ input.body }}",
                      ttl_s: int = 3600, **inputs: dict) -> dict:
    return {
        "name": "cached-classify",
        "input_schema": {"type": "object", "required": ["ticket_id", "body"],
                         "properties": {"ticket_id": {"type": "string"},
                                        "body": {"type": "string"}, **inputs}},
        "steps": [{"name": "classify", "type": "agent", "model": MODEL, "prompt": prompt,
                   "output_schema": SCHEMA,
                   "cache": {"key": "{{ input.ticket_id }}", "ttl_s": ttl_s}}],
    }


def run_of(team, definition: dict, ticket: str = "T-1", body: str = "my invoice is wrong",
           extra: dict | None = None, **start):
    version, _ = workflow_save(team=team, definition=definition, actor=SETUP)
    run = run_start(version=version, input={"ticket_id": ticket, "body": body, **(extra or {})},
                    actor=SETUP, **start)
    run = wait_for_run(run.id, states=("completed", "failed"))
    assert run.state == "completed", run.error
    return run, StepRun.objects.get(run_id=run.id, name="classify")


def test_a_second_run_with_the_same_key_reuses_the_output_and_costs_nothing(fake, team, client,
                                                                          operator):
    first_run, first = run_of(team, classify_workflow())
    second_run, second = run_of(team, classify_workflow(), body="a different text, same ticket")

    assert len(fake.requests) == 1  # the model was asked once, for the first run
    assert (first.tokens_in, first.tokens_out) == (TOKENS_IN, TOKENS_OUT) and first.cost_usd > 0
    assert second.output == first.output == {"category": "billing"}
    assert (second.tokens_in, second.tokens_out, second.cost_usd) == (0, 0, Decimal(0))
    assert (second_run.tokens_in, second_run.cost_usd) == (0, Decimal(0))
    budget = run_budget(second_run)
    assert (budget.spent_usd, budget.reserved_usd) == (0, 0)  # its reservation was released
    source = {"run": str(first_run.id), "step": "classify"}
    attempt = second.attempt_records.get()
    assert attempt.reused_from == source and attempt.model == "" and attempt.cost_usd == 0
    assert first.attempt_records.get().reused_from is None
    # Said so in the run's events and the audit ledger.
    hit = Event.objects.get(run_id=second_run.id, kind="step.cache_hit")
    assert (hit.payload["from_run"], hit.payload["from_step"]) == (str(first_run.id), "classify")
    assert not Event.objects.filter(run_id=first_run.id, kind="step.cache_hit").exists()
    entry = AuditEntry.objects.get(run_id=second_run.id, action="step.cache_hit",
                                   step_name="classify")
    assert explain(entry, entry.data).startswith(
        f"Reused the output of step classify of run {first_run.id}")
    # And in the API's step, and on the live run page.
    requester = member(team, "requester")
    body = client_for(requester).get(f"/api/v1/runs/{second_run.id}/").json()
    [step] = body["steps"]
    assert step["reused_from"]["run"] == str(first_run.id) and step["reused_from"]["step"] == "classify"
    assert step["reused_from"]["url"].endswith(f"/api/v1/runs/{first_run.id}/")
    first_body = client_for(requester).get(f"/api/v1/runs/{first_run.id}/").json()
    assert first_body["steps"][0]["reused_from"] is None
    client.force_login(operator)
    state = client.get(reverse("admin:orchestrator_run_state", args=[second_run.id])).json()
    assert state["steps"][0]["reused_from"] == {
        **source, "url": reverse("admin:orchestrator_run_live", args=[first_run.id])}
    state = client.get(reverse("admin:orchestrator_run_state", args=[first_run.id])).json()
    assert state["steps"][0]["reused_from"] is None


def test_a_changed_prompt_misses_and_calls_the_model(fake, team):
    run_of(team, classify_workflow())
    _, changed = run_of(team, classify_workflow(prompt="Classify, briefly: {{ input.body }}"))

    assert len(fake.requests) == 2
    assert changed.cost_usd > 0 and changed.attempt_records.get().reused_from is None
    # Each prompt's output is kept under its own fingerprint.
    assert StepResult.objects.filter(team=team).count() == 2


def test_another_key_misses(fake, team):
    run_of(team, classify_workflow(), ticket="T-1")
    _, other = run_of(team, classify_workflow(), ticket="T-2")

    assert len(fake.requests) == 2 and other.cost_usd > 0


def test_an_expired_entry_misses_and_is_replaced(fake, team):
    first_run, _ = run_of(team, classify_workflow(ttl_s=1))
    time.sleep(1.2)
    second_run, second = run_of(team, classify_workflow(ttl_s=1))

    assert len(fake.requests) == 2
    assert second.cost_usd > 0 and second.attempt_records.get().reused_from is None
    [entry] = StepResult.objects.filter(team=team)
    assert entry.run_id == second_run.id  # the fresh output took the expired one's place


def test_another_teams_identical_step_misses(fake, team):
    run_of(team, classify_workflow())
    other_team = TeamFactory(slug="billing", name="Billing")
    _, theirs = run_of(other_team, classify_workflow())

    assert len(fake.requests) == 2
    assert theirs.cost_usd > 0 and theirs.attempt_records.get().reused_from is None
    assert not Event.objects.filter(kind="step.cache_hit").exists()


def test_a_sandboxed_run_neither_reads_nor_keeps_live_results(fake, team):
    sandboxed = {"capacity": "evaluation",
                 "sandbox": {"purpose": "evaluation", "responses": {}, "decisions": {}}}
    run_of(team, classify_workflow(), **sandboxed)
    assert not StepResult.objects.exists()

    live_run, _ = run_of(team, classify_workflow())
    _, again = run_of(team, classify_workflow(), **sandboxed)

    assert len(fake.requests) == 3
    assert again.cost_usd > 0 and again.attempt_records.get().reused_from is None
    assert [entry.run_id for entry in StepResult.objects.all()] == [live_run.id]


def test_a_run_with_secret_inputs_neither_reads_nor_keeps_results(fake, team):
    definition = classify_workflow(api_token={"type": "string", "writeOnly": True})

    run_of(team, definition, extra={"api_token": "s3cr3t-value-one"})
    _, second = run_of(team, definition, extra={"api_token": "s3cr3t-value-two"})

    assert len(fake.requests) == 2
    assert second.cost_usd > 0 and second.attempt_records.get().reused_from is None
    assert not StepResult.objects.exists()
