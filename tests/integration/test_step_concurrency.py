"""Concurrency keys on a step, on real worker processes: a step keyed by customer with a limit of
1 runs one at a time for one customer across runs, in the order its steps were created, each
waiting `queued` with its place until the one before ends; another customer's step passes.

The step asks a local OpenAI-compatible server that takes a moment to answer, on a worker group
of its own (two processes), so steps of one customer would overlap without the key.
"""
import json
import os

import pytest
from django.conf import settings
from django.db import transaction

from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Event, StepRun
from tests.factories import SETUP
from tests.support.fake_llm import FakeLLM, slow, text

from .conftest import WorkerGroup, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def model_workers(workers):
    with FakeLLM(default=slow(0.3, text('{"ok": true}'))) as server:
        registry = {"llm_keyed": {"provider": "openai", "base_url": server.openai_base_url,
                                  "model_id": "gpt-test", "api_key_env": "STEPWISE_TEST_LLM_KEY",
                                  "timeout_s": 10}}
        env = {"STEPWISE_MODELS": json.dumps({**settings.STEPWISE_MODELS, **registry}),
               "STEPWISE_TEST_LLM_KEY": "sk-test"}
        group = WorkerGroup(f"itest-keyed-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}",
                            queues="agent.llm_keyed", env=env)
        group.start()
        yield registry
        group.stop()


def test_a_step_key_of_one_serializes_a_customer_s_steps_across_runs_and_lets_another_pass(
        model_workers, settings, team):
    settings.STEPWISE_MODELS = {**settings.STEPWISE_MODELS, **model_workers}
    version, _ = workflow_save(team=team, definition={
        "name": "refund-step-per-customer",
        "input_schema": {"type": "object", "required": ["customer"],
                         "properties": {"customer": {"type": "string"}}},
        "steps": [{"name": "refund", "type": "agent", "model": "llm_keyed", "prompt": "Refund?",
                   "output_schema": {"type": "object"},
                   "concurrency": {"key": "{{ input.customer }}", "limit": 1}}]}, actor=SETUP)
    with transaction.atomic():  # every step exists before the first is sent to a worker
        alice = [run_start(version=version, input={"customer": "alice"}, actor=SETUP)
                 for _ in range(6)]
        bob = run_start(version=version, input={"customer": "bob"}, actor=SETUP)

    def ended() -> list[StepRun]:
        steps = list(StepRun.objects.filter(run__in=[*alice, bob]).order_by("id"))
        return steps if all(s.state == "completed" for s in steps) else []

    steps = wait_for(ended, timeout=60)

    alices = [s for s in steps if s.run_id != bob.id]
    by_start = sorted(alices, key=lambda s: s.started_at)
    assert [s.id for s in by_start] == [s.id for s in alices]  # in the order they were created
    assert [(a.name, b.name) for a, b in zip(by_start, by_start[1:], strict=False)
            if b.started_at < a.finished_at] == []  # never two of alice's at once
    assert {s.concurrency_key for s in alices} == {"alice"}
    held = Event.objects.filter(run__in=alice, kind="step.held")
    assert held.exists()
    assert all(e.payload["concurrency_key"] == "alice" and e.payload["place"] >= 1 for e in held)
    # Bob's step did not wait behind alice's: it ended before her last one started.
    (bobs,) = [s for s in steps if s.run_id == bob.id]
    assert bobs.finished_at < by_start[-1].started_at
    assert all(s.waiting_for == "" for s in steps)
