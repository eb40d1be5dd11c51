"""The fault suite: randomized crashes and duplicate deliveries, then exactly one effect each.

Each iteration starts runs whose middle step makes a side-effecting HTTP call to a local sink
that counts effects by idempotency key, SIGKILLs the worker group before, during or after that
call, re-delivers every step's message (out of order, and twice), lets leases expire and the
reaper recover, restarts the workers, and waits. Then every run must be completed and every
logical action must have taken effect exactly once. The totals are printed and written to
var/fault-suite-totals.json. STEPWISE_FAULT_ITERATIONS and STEPWISE_FAULT_SEED tune it.
"""
import json
import os
import random
from collections import Counter
from pathlib import Path

import pytest
from django.conf import settings as django_settings

from examples.tools import outbox_path
from orchestrator.models import Effect, Run, StepRun
from orchestrator.services import reaper
from orchestrator.services.runs import run_start
from orchestrator.services.workflows import workflow_save
from orchestrator.tasks import execute_step
from tests.support.http_sink import HttpSink

from .conftest import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
ITERATIONS = int(os.environ.get("STEPWISE_FAULT_ITERATIONS", "6"))
MOMENTS = ("before", "during", "after")  # when the kill lands, relative to the effect
RUNS_PER_ITERATION = 3


def definition(sink_url: str) -> dict:
    retry = {"max_attempts": 6, "base_s": 0.2, "max_s": 1, "jitter": True}
    return {"name": "checkout", "input_schema": {"type": "object", "required": ["order"]}, "steps": [
        {"name": "prepare", "type": "tool", "tool": "core.echo", "params": {"order": "{{ input.order }}"}},
        {"name": "pay", "type": "tool", "tool": "http.request", "side_effect": True, "after": ["prepare"],
         "retry": retry, "params": {"method": "POST", "url": f"{sink_url}/pay",
                                    "json": {"order": "{{ input.order }}"}}},
        {"name": "notify", "type": "tool", "tool": "email.send", "side_effect": True, "after": ["pay"],
         "retry": retry, "params": {"to": "buyer@example.com", "subject": "Paid",
                                    "body": "order {{ input.order }}"}},
    ]}


def redeliver_everything(runs: list[Run], rng: random.Random) -> int:
    """Send every step's message again, in random order (the broker may replay anything)."""
    steps = list(StepRun.objects.filter(run__in=runs).values_list("id", "queue"))
    rng.shuffle(steps)
    for step_id, queue in steps:
        execute_step.apply_async((step_id,), queue=queue or "tools")
    return len(steps)


def no_step_running(runs: list[Run]) -> bool:
    """The reaper has turned every dead worker's claim into a retry."""
    reaper.reap()
    return not StepRun.objects.filter(run__in=runs, state="running").exists()


def recover(runs: list[Run], timeout: float = 90) -> None:
    def settled():
        reaper.reap()
        return all(r.state in ("completed", "failed") for r in Run.objects.filter(id__in=[r.id for r in runs]))
    try:
        wait_for(settled, timeout=timeout, interval=0.3)
    except AssertionError:
        detail = [(str(r.id)[:8], r.state, [(s.name, s.state, s.attempts, s.error) for s in r.steps.all()])
                  for r in Run.objects.filter(id__in=[r.id for r in runs])]
        effects = list(Effect.objects.filter(run__in=runs).values_list("key", "status", "attempts"))
        raise AssertionError(f"runs did not settle: {detail} effects: {effects}") from None


def test_crashes_and_duplicates_never_lose_a_run_nor_repeat_an_effect(workers, team, capsys, settings):
    # A killed worker takes the messages it had fetched with it; the reaper re-sends a queued
    # step nobody claimed after this long (60 s in production).
    settings.STEPWISE_REDISPATCH_AFTER_S = 3
    seed = int(os.environ.get("STEPWISE_FAULT_SEED", "20261130"))
    rng = random.Random(seed)
    totals = Counter()
    outbox_path().unlink(missing_ok=True)
    with HttpSink() as sink:
        version, _ = workflow_save(team=team, definition=definition(sink.url))
        all_runs: list[Run] = []
        for iteration in range(ITERATIONS):
            sink.delay_s = rng.uniform(0.3, 1.0)
            arrived = sink.arrived
            runs = [run_start(version=version, input={"order": f"o-{iteration}-{i}"})
                    for i in range(RUNS_PER_ITERATION)]
            all_runs += runs
            moment = MOMENTS[iteration % len(MOMENTS)]
            if moment == "during":
                wait_for(lambda: sink.arrived > arrived, timeout=30, interval=0.01)  # noqa: B023
            elif moment == "after":
                wait_for(lambda: Effect.objects.filter(run__in=runs, status="succeeded")  # noqa: B023
                         .exists(), timeout=30, interval=0.01)
            workers.kill()
            totals[f"kills_{moment}"] += 1
            totals["duplicates_delivered"] += redeliver_everything(runs, rng)
            try:
                wait_for(lambda: no_step_running(runs), timeout=30, interval=0.3)  # noqa: B023
            finally:
                workers.start()
            totals["duplicates_delivered"] += redeliver_everything(runs, rng)
            recover(runs)
            totals["iterations"] += 1

        states = Counter(Run.objects.filter(id__in=[r.id for r in all_runs]).values_list("state", flat=True))
        failed = [(r.error, [(x.name, x.state, x.attempts, x.error) for x in r.steps.all()])
                  for r in Run.objects.filter(id__in=[r.id for r in all_runs]).exclude(state="completed")]
        assert states == {"completed": len(all_runs)}, failed
        pay_keys = {f"{r.id}:pay:default" for r in all_runs}
        assert {k: sink.effects[k] for k in pay_keys} == {k: 1 for k in pay_keys}
        emails = Counter(json.loads(line)["idempotency_key"] for line in outbox_path().read_text().splitlines())
        assert emails == {f"{r.id}:notify:default": 1 for r in all_runs}

        totals["runs"] = len(all_runs)
        totals["http_requests"] = len(sink.requests)
        totals["http_effects"] = sum(sink.effects[k] for k in pay_keys)
        totals["emails_sent"] = sum(emails.values())
        totals["attempts_lost"] = StepRun.objects.filter(run__in=all_runs).values_list(
            "attempt_records__outcome", flat=True).filter(attempt_records__outcome="lost").count()
    report = {"seed": seed, **dict(sorted(totals.items()))}
    Path(django_settings.VAR_DIR, "fault-suite-totals.json").write_text(json.dumps(report, indent=2))
    with capsys.disabled():
        print(f"\nfault suite totals: {json.dumps(report)}")
