"""The fault suite: randomized crashes, service restarts and duplicate deliveries, then exactly
one effect per logical action and every run in a consistent state.

Each iteration starts two kinds of runs against a local HTTP sink that counts effects by
idempotency key:
- checkout: prepare → quote (a map over three lines: fan-out, fan-in) → pay (HTTP, side
  effect) → notify (email, side effect); ends `completed`;
- saga: prepare → pay (compensated by a refund) → ship, which the remote refuses; the run
  compensates and ends `failed`, or `compensation_failed` when the remote refuses the refund too.
Then it SIGKILLs the worker group before, during or after the payment, or during a refund;
delivers every message again, shuffled, while the workers are down and again after they
restart; lets leases expire and the reaper recover; and in two iterations of three restarts
the broker or the database while runs are in flight (or stops the broker while runs start).
See tests/support/services.py for what a restart is on each backend.

The totals are printed and written to var/fault-suite-totals.json. STEPWISE_FAULT_ITERATIONS
(default 8) and STEPWISE_FAULT_SEED tune it. It restarts shared servers, so it runs in a
session of its own: `pytest -p no:xdist -m restarts_services` (as `make test` does).
"""
import json
import os
import random
import time
from collections import Counter
from pathlib import Path

import pytest
from django.conf import settings as django_settings

from examples.tools import outbox_path
from orchestrator.models import Effect, Event, MapItem, Run, StepRun
from orchestrator.services import reaper
from orchestrator.services.runs import run_start
from orchestrator.services.workflows import workflow_save
from orchestrator.tasks import compensate_run, execute_step, map_item, map_join
from tests.factories import SETUP
from tests.support import services
from tests.support.http_sink import HttpSink

from .conftest import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.restarts_services,
              pytest.mark.django_db(transaction=True)]
ITERATIONS = int(os.environ.get("STEPWISE_FAULT_ITERATIONS", "8"))
KILL_MOMENTS = ("before", "during", "after", "refunding")  # when the kill lands
SERVICE_FAULTS = ("broker", "database", None)
SETTLED = ("completed", "failed", "compensation_failed")
RETRY = {"max_attempts": 6, "base_s": 0.2, "max_s": 1, "jitter": True}


def checkout(sink_url: str) -> dict:
    return {"name": "checkout", "input_schema": {"type": "object", "required": ["order"]}, "steps": [
        {"name": "prepare", "type": "tool", "tool": "core.echo", "params": {"order": "{{ input.order }}"}},
        # A fan-out and fan-in (a chord, whose state a Redis restart loses) before the payment.
        {"name": "quote", "type": "map", "after": ["prepare"], "over": "input.lines",
         "item": {"type": "tool", "tool": "core.echo", "params": {"line": "{{ item }}"}}},
        {"name": "pay", "type": "tool", "tool": "http.request", "side_effect": True, "after": ["quote"],
         "retry": RETRY, "params": {"method": "POST", "url": f"{sink_url}/pay",
                                    "json": {"order": "{{ input.order }}", "lines": "{{ steps.quote.output | length }}"}}},
        {"name": "notify", "type": "tool", "tool": "email.send", "side_effect": True, "after": ["pay"],
         "retry": RETRY, "params": {"to": "buyer@example.com", "subject": "Paid",
                                    "body": "order {{ input.order }}"}},
    ]}


def saga(sink_url: str) -> dict:
    """Pay, then ship — which the remote refuses, so the payment is refunded at input.refund."""
    refund = {"tool": "http.request", "params": {
        "method": "POST", "url": sink_url + "/{{ input.refund }}",
        "json": {"order": "{{ input.order }}", "paid": "{{ steps.pay.output.status }}"}}}
    return {"name": "saga", "input_schema": {"type": "object", "required": ["order", "refund"]}, "steps": [
        {"name": "prepare", "type": "tool", "tool": "core.echo", "params": {"order": "{{ input.order }}"}},
        {"name": "pay", "type": "tool", "tool": "http.request", "side_effect": True, "after": ["prepare"],
         "retry": RETRY, "compensate": refund,
         "params": {"method": "POST", "url": f"{sink_url}/pay", "json": {"order": "{{ input.order }}"}}},
        {"name": "ship", "type": "tool", "tool": "http.request", "side_effect": True, "after": ["pay"],
         "retry": RETRY, "params": {"method": "POST", "url": f"{sink_url}/ship",
                                    "json": {"order": "{{ input.order }}"}}},
    ]}


def redeliver_everything(runs: list[Run], rng: random.Random) -> int:
    """Send every run's messages again, in random order (the broker may replay anything)."""
    messages = [(execute_step, (step_id,), queue or "tools") for step_id, queue in
                StepRun.objects.filter(run__in=runs).values_list("id", "queue")]
    for step_id, index in MapItem.objects.filter(step__run__in=runs).values_list("step_id", "index"):
        messages += [(map_item, (step_id, index), "tools"), (map_join, (step_id,), "orchestrator")]
    messages += [(compensate_run, (str(run.id),), "tools") for run in runs if run.version.workflow.name == "saga"]
    rng.shuffle(messages)
    for task, args, queue in messages:
        task.apply_async(args, queue=queue)
    return len(messages)


def no_step_running(runs: list[Run]) -> bool:
    """The reaper has turned every dead worker's claim into a retry."""
    reaper.reap()
    return not StepRun.objects.filter(run__in=runs, state="running").exists()


def recover(runs: list[Run], timeout: float = 120) -> None:
    def settled():
        reaper.reap()
        return all(r.state in SETTLED for r in Run.objects.filter(id__in=[r.id for r in runs]))
    try:
        wait_for(settled, timeout=timeout, interval=0.3)
    except AssertionError:
        raise AssertionError(f"runs did not settle: {describe(runs)}") from None


def describe(runs: list[Run]) -> list:
    return [(str(r.id)[:8], r.state, r.error, [(s.name, s.state, s.attempts, s.error) for s in r.steps.all()])
            for r in Run.objects.filter(id__in=[r.id for r in runs])]


def reaping(predicate, timeout: float = 60) -> None:
    """Wait for predicate(), sweeping with the reaper every second as beat would meanwhile."""
    last = 0.0

    def check():
        nonlocal last
        if time.monotonic() - last > 1:
            reaper.reap()
            last = time.monotonic()
        return predicate()
    wait_for(check, timeout=timeout, interval=0.01)


def in_flight(runs: list[Run]) -> int:
    return Run.objects.filter(id__in=[r.id for r in runs]).exclude(state__in=SETTLED).count()


class Iteration:
    """One round of faults over a fresh set of runs."""

    def __init__(self, number: int, rng: random.Random, sink: HttpSink, versions: dict, totals: Counter):
        self.number, self.rng, self.sink, self.versions, self.totals = number, rng, sink, versions, totals
        self.moment = KILL_MOMENTS[number % len(KILL_MOMENTS)]
        self.service = SERVICE_FAULTS[number % len(SERVICE_FAULTS)]
        self.runs: list[Run] = []

    def start_runs(self, api=None) -> None:
        """Start the iteration's runs; with `api`, the first through the REST API, as a user would."""
        refused = self.rng.randrange(2)  # which of the two sagas the remote refuses to refund
        for i in range(2):
            checkout_input = {"order": f"c-{self.number}-{i}", "lines": ["a", "b", "c"]}
            if api is not None and i == 0:
                response = api.post("/api/v1/workflows/checkout/runs/", {"input": checkout_input}, format="json")
                assert response.status_code == 202, response.content  # the broker's outage is not the caller's
                self.runs.append(Run.objects.get(id=response.json()["id"]))
            else:
                self.runs.append(run_start(version=self.versions["checkout"], input=checkout_input, actor=SETUP))
        for i in range(2):
            self.runs.append(run_start(version=self.versions["saga"], input={
                "order": f"s-{self.number}-{i}", "refund": "refund-refused" if i == refused else "refund"}, actor=SETUP))

    def wait_for_moment(self) -> None:
        sink, runs = self.sink, self.runs
        if self.moment == "during":
            paid = sink.arrivals["/pay"]
            reaping(lambda: sink.arrivals["/pay"] > paid)
        elif self.moment == "after":
            reaping(lambda: Effect.objects.filter(run__in=runs, status="succeeded").exists())
        elif self.moment == "refunding":
            refunds = sink.arrivals["/refund"] + sink.arrivals["/refund-refused"]
            reaping(lambda: sink.arrivals["/refund"] + sink.arrivals["/refund-refused"] > refunds)

    def crash(self, workers) -> None:
        workers.kill()
        self.totals[f"kills_{self.moment}"] += 1
        self.totals["duplicates_delivered"] += redeliver_everything(self.runs, self.rng)
        try:
            wait_for(lambda: no_step_running(self.runs), timeout=30, interval=0.3)
        finally:
            workers.start()
        self.totals["duplicates_delivered"] += redeliver_everything(self.runs, self.rng)

    def restart_service(self, broker, database) -> None:
        time.sleep(self.rng.uniform(0, 1.0))  # land somewhere in the middle of the recovery
        self.totals["runs_in_flight_at_restarts"] += in_flight(self.runs)
        if self.service == "broker":
            broker.restart()
            self.totals["broker_restarts"] += 1
        elif self.service == "database" and database.available:
            database.restart()
            self.totals["database_restarts"] += 1


def test_crashes_restarts_and_duplicates_never_lose_a_run_nor_repeat_an_effect(workers, team, api, capsys, settings):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        pytest.skip("restarts shared servers: run it alone, `pytest -p no:xdist -m restarts_services`")
    # A killed worker or a restarted broker loses the messages it held; the reaper re-sends a
    # queued step nobody claimed after this long (60 s in production).
    settings.STEPWISE_REDISPATCH_AFTER_S = 3
    seed = int(os.environ.get("STEPWISE_FAULT_SEED", "20261130"))
    rng = random.Random(seed)
    totals = Counter()
    broker, database = services.broker(), services.DatabaseServer()
    outbox_path().unlink(missing_ok=True)
    with HttpSink() as sink:
        sink.refuse("/ship", 422)
        sink.refuse("/refund-refused", 422)
        versions = {name: workflow_save(team=team, definition=build(sink.url), actor=SETUP)[0]
                    for name, build in (("checkout", checkout), ("saga", saga))}
        all_runs: list[Run] = []
        for number in range(ITERATIONS):
            sink.delay_s = rng.uniform(0.3, 1.0)
            if rng.random() < 0.5:
                sink.fail_next(1, 503, path="/refund")  # a transient refusal: retried
            iteration = Iteration(number, rng, sink, versions, totals)
            if iteration.service == "broker" and broker.kind == "redis" and number % 2:
                with broker.down():  # runs start while the broker is down: their first message is lost
                    iteration.start_runs(api)
                totals["runs_started_with_broker_down"] += len(iteration.runs)
                totals["broker_restarts"] += 1
                iteration.service = None
            else:
                iteration.start_runs()
            all_runs += iteration.runs
            iteration.wait_for_moment()
            iteration.crash(workers)
            if iteration.service:
                iteration.restart_service(broker, database)
            recover(iteration.runs)
            totals["iterations"] += 1

        ids = [r.id for r in all_runs]
        checkouts = [r for r in all_runs if r.version_id == versions["checkout"].id]
        sagas = {r.id: r.input["refund"] for r in all_runs if r.version_id == versions["saga"].id}
        expected = {r.id: "completed" for r in checkouts}
        expected |= {rid: "failed" if refund == "refund" else "compensation_failed" for rid, refund in sagas.items()}
        states = dict(Run.objects.filter(id__in=ids).values_list("id", "state"))
        wrong = [run for run in all_runs if states[run.id] != expected[run.id]]
        assert not wrong, (describe(wrong), list(Effect.objects.filter(run__in=wrong).values_list(
            "key", "status", "attempts", "error")))

        # Every fan-out joined with all its items, in order, whatever was lost.
        quotes = StepRun.objects.filter(run__in=checkouts, name="quote").values_list("output", flat=True)
        assert list(quotes) == [[{"line": x} for x in "abc"]] * len(checkouts)

        # Exactly one payment per run, one refund per refunded saga, nothing shipped.
        pay_keys = {f"{rid}:pay:default" for rid in ids}
        assert {k: sink.effects[k] for k in pay_keys} == {k: 1 for k in pay_keys}
        refund_keys = {f"{rid}:pay:compensate": int(refund == "refund") for rid, refund in sagas.items()}
        assert {k: sink.effects[k] for k in refund_keys} == refund_keys
        assert sink.effects.keys() <= pay_keys | refund_keys.keys()
        for run in Run.objects.filter(id__in=sagas, state="compensation_failed"):
            assert run.error["compensation"]["step"] == "pay"
        emails = Counter(json.loads(line)["idempotency_key"] for line in outbox_path().read_text().splitlines())
        assert emails == {f"{r.id}:notify:default": 1 for r in checkouts}

        totals["runs"] = len(all_runs)
        totals["runs_completed"] = len(checkouts)
        totals["runs_compensated"] = sum(refund_keys.values())
        totals["runs_compensation_failed"] = len(sagas) - totals["runs_compensated"]
        totals["http_requests"] = len(sink.requests)
        totals["payments"] = sum(sink.effects[k] for k in pay_keys)
        totals["refunds"] = sum(sink.effects[k] for k in refund_keys)
        totals["emails_sent"] = sum(emails.values())
        totals["attempts_lost"] = StepRun.objects.filter(run__in=all_runs, attempt_records__outcome="lost").count()
        totals["compensation_retries"] = Event.objects.filter(run__in=all_runs, kind="run.compensation_retrying").count()
        totals["map_item_retries"] = Event.objects.filter(run__in=all_runs, kind="step.item_retrying").count()
    report = {"seed": seed, "broker": broker.kind,
              "database": django_settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1],
              **dict(sorted(totals.items()))}
    Path(django_settings.VAR_DIR, "fault-suite-totals.json").write_text(json.dumps(report, indent=2))
    with capsys.disabled():
        print(f"\nfault suite totals: {json.dumps(report)}")
