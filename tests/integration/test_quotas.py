"""Provider quotas under real load: four worker processes (two worker groups of two) call a
local OpenAI-compatible server that meters them as a provider would — the requests in flight at
once and the tokens of each calendar minute — and the quota is never exceeded there, by steps or
by a map's items. A step that cannot get its reservation stays `queued` with the reason, then
runs; a map's items wait the same way, the map step saying why.

Workers read STEPWISE_MODELS and STEPWISE_QUOTAS when they start: the quota's models get worker
groups of their own; the session's `workers` group runs everything else.
"""
import json
import os
import shutil
from pathlib import Path

import pytest
from django.conf import settings

from orchestrator.engine.errors import NotAllowed
from orchestrator.engine.services.runs import run_cancel, run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Event, Run, StepRun
from tests.factories import SETUP
from tests.support.fake_llm import TOKENS_IN, TOKENS_OUT, FakeLLM, slow, text

from .conftest import WorkerGroup, wait_for, wait_for_run

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

CALLS = 2  # calls of `llm_calls` in flight at once
PER_CALL = TOKENS_IN + TOKENS_OUT  # what the server meters for each answer
TOKENS = 4 * PER_CALL  # tokens of `llm_tokens` a minute
QUOTAS = {"model:llm_calls": {"concurrent": CALLS},
          "model:llm_tokens": {"tokens_per_minute": TOKENS}}
QUEUES = "agent.llm_calls,agent.llm_tokens,agent.llm_calls.batch"  # .batch: map items


def quota_state_cleared() -> None:
    """No reservation an earlier session left (its minute's tokens) counts against this one."""
    if settings.REDIS_URL:
        import redis

        client = redis.Redis.from_url(settings.REDIS_URL)
        for key in client.scan_iter("stepwise:quota:*"):
            client.delete(key)
        client.close()
    shutil.rmtree(Path(settings.VAR_DIR) / "quotas", ignore_errors=True)


@pytest.fixture(scope="module")
def metered(workers):
    """The metering server, and four worker processes whose registry and quotas point at it."""
    quota_state_cleared()
    with FakeLLM(default=slow(0.4, text('{"ok": true}'))) as server:
        registry = {name: {"provider": "openai", "base_url": server.openai_base_url,
                           "model_id": name, "api_key_env": "STEPWISE_TEST_LLM_KEY",
                           "timeout_s": 10} for name in ("llm_calls", "llm_tokens")}
        env = {"STEPWISE_MODELS": json.dumps({**settings.STEPWISE_MODELS, **registry}),
               "STEPWISE_QUOTAS": json.dumps(QUOTAS), "STEPWISE_TEST_LLM_KEY": "sk-test"}
        xdist = os.environ.get("PYTEST_XDIST_WORKER", "main")
        groups = [WorkerGroup(f"itest-quota-{i}-{xdist}", queues=QUEUES, env=env) for i in (1, 2)]
        for group in groups:
            group.start()
        yield server, registry
        for group in groups:
            group.stop()


@pytest.fixture
def server(metered, settings) -> FakeLLM:
    fake, registry = metered
    settings.STEPWISE_MODELS = {**settings.STEPWISE_MODELS, **registry}  # for saving definitions
    fake.reset()
    return fake


def start_many(team, model: str, count: int) -> list[Run]:
    version, _ = workflow_save(team=team, definition={
        "name": f"quota-{model}", "input_schema": {"type": "object"},
        "steps": [{"name": "ask", "type": "agent", "model": model, "prompt": "Say ok",
                   "max_tokens": 20, "output_schema": {"type": "object"}}]}, actor=SETUP)
    return [run_start(version=version, input={}, actor=SETUP) for _ in range(count)]


def test_calls_in_flight_never_exceed_the_quota_and_waiting_steps_say_why(team, server):
    runs = start_many(team, "llm_calls", 12)

    ended = [wait_for_run(run.id, states=("completed", "failed"), timeout=60) for run in runs]

    assert [run.state for run in ended] == ["completed"] * 12
    # Never more, and the quota was used to the full. Counted per model: a call of the tokens
    # test's cancelled runs may still be answered when this one starts.
    assert server.most_in_flight_of["llm_calls"] == CALLS
    deferred = Event.objects.filter(run__in=runs, kind="step.deferred")
    assert deferred.exists()
    assert {e.payload["reason"] for e in deferred} == {
        "waiting for a call slot of model:llm_calls (interactive quota)"}
    assert not StepRun.objects.filter(run__in=runs).exclude(waiting_for="").exists()


def test_tokens_of_a_minute_never_exceed_the_quota_and_the_rest_wait_queued(team, server):
    runs = start_many(team, "llm_tokens", 10)

    # Four calls' tokens fit a minute at most (fewer reservations: each is counted high before
    # the call, then settled); at most two minutes pass.
    wait_for(lambda: StepRun.objects.filter(run__in=runs, state="completed").exists(), timeout=30)
    waiting = wait_for(lambda: list(StepRun.objects.filter(run__in=runs, state="queued")
                                    .exclude(waiting_for="")), timeout=30)

    assert all(count <= TOKENS for count in server.tokens_by_minute.values()), \
        server.tokens_by_minute
    assert waiting[0].waiting_for == \
        "waiting for tokens this minute of model:llm_tokens (interactive quota)"
    assert StepRun.objects.filter(run__in=runs, state="completed").count() <= 8
    for run in Run.objects.filter(id__in=[run.id for run in runs], state="running"):
        cancel_while_workers_run(run)
    # A step that was running ends its call before its run is cancelled: none is left in
    # flight at the server when the next test starts counting.
    for run in runs:
        wait_for_run(run.id, states=("completed", "failed", "cancelled"), timeout=60)


def cancel_while_workers_run(run) -> None:
    """Cancel `run` while the workers still move its steps (the cancel waits for a move in
    flight: tests/engine/test_cancel_races.py)."""
    try:
        run_cancel(run_id=run.id, actor=SETUP)
    except NotAllowed:
        pass  # it ended since it was read


def test_a_maps_items_share_the_quota_and_the_map_step_says_why_they_wait(team, server):
    version, _ = workflow_save(team=team, definition={
        "name": "quota-map", "input_schema": {"type": "object"}, "max_parallel": 10,
        "steps": [{"name": "each", "type": "map", "over": "[1, 2, 3, 4, 5, 6, 7, 8]", "item": {
            "type": "agent", "model": "llm_calls", "prompt": "Say ok {{ item }}",
            "max_tokens": 20, "output_schema": {"type": "object"}}}]}, actor=SETUP)
    run = run_start(version=version, input={}, actor=SETUP)

    ended = wait_for_run(run.id, states=("completed", "failed"), timeout=60)

    assert ended.state == "completed", ended.error
    assert len(ended.output["each"]) == 8
    assert server.most_in_flight_of["llm_calls"] == CALLS
    [deferred] = Event.objects.filter(run=run, kind="step.deferred")  # once per reason
    assert deferred.payload["reason"] == \
        "waiting for a call slot of model:llm_calls (interactive quota)"
    assert StepRun.objects.get(run=run, name="each").waiting_for == ""
