"""The fault suite: randomized crashes, service restarts and duplicate deliveries, then exactly
one effect per logical action, every call accounted for, and every run in a consistent state.

Each iteration starts two kinds of runs against a local HTTP sink:
- checkout: prepare → quote (a map over three lines: fan-out, fan-in) → pay (HTTP, side
  effect) → notify (email, side effect); ends `completed`;
- saga: prepare → hold (compensated by a release) → pay (compensated by a refund) → ship, which
  the remote refuses; the run compensates newest first and ends `failed`, or
  `compensation_failed` when the remote refuses the refund too. The first release of every
  iteration is refused once (503), so the compensation is retried — and walks the refund,
  already done, again: the effect ledger must answer it without calling.
Then it SIGKILLs the worker group before, during or after the payment, or during a refund;
delivers every message again, shuffled, while the workers are down and again after they
restart; lets leases expire and the reaper recover; and restarts the broker or the database
while runs are in flight (or stops the broker while runs start). See tests/support/services.py
for what a restart is on each backend.

What is counted, and asserted:
- every request the sink got, per Idempotency-Key, against the effect ledger's account of that
  key: no call outside the ledger (calls <= its attempts), every attempt explained (a recorded
  failure or a reconciled lost outcome), no call after the ledger recorded a success, and at
  most one more successful call than lost outcomes the engine reconciled — counted as a remote
  that does NOT de-duplicate would count them, besides the de-duplicating count;
- every e-mail request `email.send` got (its request log, which its own de-duplication does
  not filter), not only the outbox;
- every injected fault happened: each kill killed a live worker (and a kill "during" a call
  left that call's answer lost, which the engine then reconciled), each restart shows a new
  server (Redis run_id, PostgreSQL start time) or lost messages (filesystem broker) with runs
  in flight, the injected 503s were served and each retried; on PostgreSQL a planned database
  restart that cannot happen fails the suite.

The totals are printed and written to var/fault-suite-totals.json. STEPWISE_FAULT_ITERATIONS
(default 4: each moment of a kill once, and each server restarted) and STEPWISE_FAULT_SEED tune
it; CI runs more iterations. It restarts shared servers, so it runs in a session of its own:
`pytest -p no:xdist -m restarts_services` (`make test`: alone on PostgreSQL and Redis; on the
embedded default, whose broker folder and SQLite file are its session's own, beside the
parallel session).
"""
import json
import os
import random
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.db import connection

from examples.tools import email_requests_path, outbox_path
from orchestrator.engine.services import reaper
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Effect, Event, MapItem, Run, StepRun
from orchestrator.tasks import compensate_run, execute_step, map_item, map_join
from tests.factories import SETUP
from tests.support import services
from tests.support.http_sink import HttpSink

from .conftest import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.restarts_services,
              pytest.mark.django_db(transaction=True)]
ITERATIONS = int(os.environ.get("STEPWISE_FAULT_ITERATIONS", "4"))
KILL_MOMENTS = ("before", "during", "after", "refunding")  # when the kill lands
SETTLED = ("completed", "failed", "compensation_failed")
RETRY = {"max_attempts": 6, "base_s": 0.2, "max_s": 1, "jitter": True}
PAID_PATHS = ("/pay", "/hold", "/refund", "/release")  # the calls whose answers a kill may lose


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
    """Hold, pay, then ship — which the remote refuses: refund (at input.refund), then release."""
    def undo(path: str, step: str) -> dict:
        return {"tool": "http.request", "params": {
            "method": "POST", "url": sink_url + path,
            "json": {"order": "{{ input.order }}", "undo": "{{ steps." + step + ".output.status }}"}}}

    return {"name": "saga", "input_schema": {"type": "object", "required": ["order", "refund"]}, "steps": [
        {"name": "prepare", "type": "tool", "tool": "core.echo", "params": {"order": "{{ input.order }}"}},
        {"name": "hold", "type": "tool", "tool": "http.request", "side_effect": True, "after": ["prepare"],
         "retry": RETRY, "compensate": undo("/release", "hold"),
         "params": {"method": "POST", "url": f"{sink_url}/hold", "json": {"order": "{{ input.order }}"}}},
        {"name": "pay", "type": "tool", "tool": "http.request", "side_effect": True, "after": ["hold"],
         "retry": RETRY, "compensate": undo("/{{ input.refund }}", "pay"),
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
        messages += [(map_item, (step_id, index), "tools.batch"), (map_join, (step_id,), "orchestrator")]
    messages += [(compensate_run, (str(run.id),), "tools") for run in runs if run.version.workflow.name == "saga"]
    rng.shuffle(messages)
    for task, args, queue in messages:
        task.apply_async(args, queue=queue)
    return len(messages)


class Reaper:
    """Sweeps as beat would, adding up what each sweep acted on."""

    def __init__(self, totals: Counter):
        self.totals = totals

    def reap(self) -> None:
        for what, count in reaper.reap().items():
            self.totals[f"reaper_{what}"] += count


def ids(runs: list[Run]) -> list:
    return [r.id for r in runs]


def describe(runs: list[Run]) -> list:
    return [(str(r.id)[:8], r.state, r.error, [(s.name, s.state, s.attempts, s.error) for s in r.steps.all()])
            for r in Run.objects.filter(id__in=ids(runs))]


def in_flight(runs: list[Run]) -> int:
    return Run.objects.filter(id__in=ids(runs)).exclude(state__in=SETTLED).count()


class Iteration:
    """One round of faults over a fresh set of runs."""

    def __init__(self, number: int, rng: random.Random, sink: HttpSink, versions: dict,
                 totals: Counter, sweeper: Reaper, service: str | None):
        self.number, self.rng, self.sink, self.versions = number, rng, sink, versions
        self.totals, self.sweeper, self.service = totals, sweeper, service
        self.moment = KILL_MOMENTS[number % len(KILL_MOMENTS)]
        self.runs: list[Run] = []
        self.held: list[str] = []  # paths whose calls the sink holds until the kill
        self.lost_keys: set[str] = set()  # calls in flight when the workers were killed

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

    def reaping(self, predicate, timeout: float = 60) -> None:
        """Wait for predicate(), sweeping every second as beat would meanwhile."""
        last = 0.0

        def check():
            nonlocal last
            if time.monotonic() - last > 1:
                self.sweeper.reap()
                last = time.monotonic()
            return predicate()
        wait_for(check, timeout=timeout, interval=0.01)

    def wait_for_moment(self) -> None:
        """Wait for the moment of the kill. A payment or refund to be killed "during" is held
        unanswered by the sink until the workers are dead, so the kill cannot miss it."""
        sink, runs = self.sink, self.runs
        if self.moment == "during":
            self.held = ["/pay"]
        elif self.moment == "refunding":
            self.held = ["/refund", "/refund-refused"]
        for path in self.held:
            sink.hold(path)
        if self.moment == "after":
            self.reaping(lambda: Effect.objects.filter(run__in=runs, status="succeeded").exists())
        elif self.held:
            self.reaping(lambda: any(sink.in_flight[path] for path in self.held))

    def crash(self, workers) -> None:
        before = {k for k, n in self.sink.open_keys.items() if n}
        killed = workers.kill()
        # Calls open before and after the kill were in flight at it: their answers are lost.
        self.lost_keys = before & {k for k, n in self.sink.open_keys.items() if n}
        for path in self.held:
            self.sink.release(path)
        if self.moment == "during":
            assert any(k.endswith(":pay:default") for k in self.lost_keys), "no payment was in flight"
        elif self.moment == "refunding":
            assert any(k.endswith(":pay:compensate") for k in self.lost_keys), "no refund was in flight"
        self.totals[f"kills_{self.moment}"] += 1
        self.totals["calls_lost_at_kills"] += len(self.lost_keys)
        self.totals["duplicates_delivered"] += redeliver_everything(self.runs, self.rng)
        try:
            def no_step_running() -> bool:
                self.sweeper.reap()  # turns every dead worker's claim into a retry
                return not StepRun.objects.filter(run__in=self.runs, state="running").exists()
            wait_for(no_step_running, timeout=30, interval=0.3)
        finally:
            workers.start()
        assert workers.proc.pid != killed and workers.proc.poll() is None, "the workers did not restart"
        self.totals["duplicates_delivered"] += redeliver_everything(self.runs, self.rng)

    def restart_service(self, broker, database) -> None:
        running = in_flight(self.runs)
        assert running, "every run had settled: the restart would test nothing"
        if self.service == "broker":
            restart = broker.restart()
            self.totals["broker_restarts"] += 1
        else:
            restart = database.restart()
            self.totals["database_restarts"] += 1
        assert restart.happened, f"the {self.service} did not restart: {restart}"
        self.totals["runs_in_flight_at_restarts"] += running
        self.totals[f"{self.service}_messages_or_keys_lost"] += restart.lost

    def recover(self, workers, timeout: float = 120) -> None:
        def settled():
            self.sweeper.reap()
            return all(r.state in SETTLED for r in Run.objects.filter(id__in=ids(self.runs)))
        try:
            wait_for(settled, timeout=timeout, interval=0.3)
        except AssertionError:
            # What the workers last did says whether they stopped taking messages or got stuck.
            tail = "\n".join(workers.log.read_text(errors="replace").splitlines()[-80:])
            raise AssertionError(f"iteration {self.number} (kill {self.moment}, restart of "
                                 f"{self.service or 'no server'}): runs did not settle: {describe(self.runs)}\n"
                                 f"the workers' log ends:\n{tail}") from None


def planned_service(number: int, broker, database) -> str | None:
    """Which server the iteration restarts: the broker, the database, or none, in turn. A
    database with no server (SQLite) is never planned; a PostgreSQL this machine cannot restart
    fails the suite rather than pretend."""
    service = ("broker", "database", None)[number % 3]
    if service == "database" and not database.available:
        if database.postgres:
            pytest.fail("the database is PostgreSQL but cannot be restarted from here "
                        "(not local, or no pg_ctlcluster): the fault suite cannot inject its faults")
        return None
    return service


def ledger_account(runs: list[Run]) -> dict[str, dict]:
    """The effect ledger's account of every key: its row and the events that explain it.

    A reconciled outcome is `lost_and_retried` when the ledger let the call be made again (the
    remote de-duplicates by the key, or the tool's lookup did not find the effect) and
    `lost_and_found` when the lookup found it done.
    """
    account: dict[str, dict] = defaultdict(lambda: {"effect": None, "events": Counter()})
    for effect in Effect.objects.filter(run__in=runs):
        account[effect.key]["effect"] = effect
    for kind, payload in Event.objects.filter(run__in=runs, kind__startswith="effect.").values_list("kind", "payload"):
        event = kind.removeprefix("effect.")
        if event == "reconciled":
            event = "lost_and_found" if payload.get("found") is True else "lost_and_retried"
        account[payload["key"]]["events"][event] += 1
    return account


def check_every_call(sink: HttpSink, account: dict[str, dict], lost_keys: set[str]) -> Counter:
    """Each request the sink got, per key, against the ledger's account of that key."""
    figures = Counter()
    calls: dict[str, list[dict]] = defaultdict(list)
    for request in sink.requests:
        calls[request["key"]].append(request)
    problems = []
    for key, requests in calls.items():
        effect, events = account[key]["effect"], account[key]["events"]
        if effect is None:
            problems.append(f"{key}: {len(requests)} call(s) the effect ledger has no row for")
            continue
        again = events["failed"] + events["lost_and_retried"]  # attempts that may be followed by another
        # Every attempt after the first follows a recorded failure or a reconciled lost outcome.
        if not effect.attempts - 1 <= again <= effect.attempts:
            problems.append(f"{key}: {effect.attempts} attempts, events {dict(events)}")
        if len(requests) > effect.attempts:
            problems.append(f"{key}: {len(requests)} calls but {effect.attempts} ledger attempts")
        if effect.status == Effect.Status.SUCCEEDED:
            late = [r for r in requests if r["arrived_at"] > effect.finished_at]
            if late:
                problems.append(f"{key}: called {len(late)} time(s) after its success was recorded")
        # A remote that does not de-duplicate acts on every successful call: only a lost
        # outcome the engine reconciled by sending the key again may add one.
        if sink.calls_by_key[key] > 1 + events["lost_and_retried"]:
            problems.append(f"{key}: {sink.calls_by_key[key]} successful calls, "
                            f"{events['lost_and_retried']} lost outcomes")
        refused = sum(1 for r in requests if r["status"] != 200)
        if refused > again:
            problems.append(f"{key}: {refused} refusals, events {dict(events)}")
        figures["calls"] += len(requests)
        figures["calls_repeated"] += len(requests) - 1
        figures["calls_repeated_after_a_lost_outcome"] += min(len(requests) - 1, events["lost_and_retried"])
        figures["successful_calls_at_a_remote_without_dedup"] += sink.calls_by_key[key]
    for key in lost_keys:  # a call whose answer a kill lost: the engine must have reconciled it
        events = account[key]["events"]
        if not (events["lost_and_retried"] + events["lost_and_found"]):
            problems.append(f"{key}: in flight at a kill, never reconciled ({dict(events)})")
    assert not problems, problems
    return figures


# Each iteration's waits are bounded (the moment, the workers' restart, the recovery): the
# test's limit grows with the iterations asked for, so only a hang reaches it.
@pytest.mark.timeout(600 + 300 * ITERATIONS)
def test_crashes_restarts_and_duplicates_never_lose_a_run_nor_repeat_an_effect(workers, team, api, capsys, settings):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        pytest.skip("restarts shared servers: run it alone, `pytest -p no:xdist -m restarts_services`")
    # A killed worker or a restarted broker loses the messages it held; the reaper re-sends a
    # queued step nobody claimed after this long (60 s in production).
    settings.STEPWISE_REDISPATCH_AFTER_S = 3
    seed = int(os.environ.get("STEPWISE_FAULT_SEED", "20261130"))
    rng = random.Random(seed)
    totals = Counter()
    sweeper = Reaper(totals)
    broker, database = services.broker(), services.DatabaseServer()
    outbox_path().unlink(missing_ok=True)
    email_requests_path().unlink(missing_ok=True)
    lost_keys: set[str] = set()
    with HttpSink() as sink:
        sink.refuse("/ship", 422)
        sink.refuse("/refund-refused", 422)
        versions = {name: workflow_save(team=team, definition=build(sink.url), actor=SETUP)[0]
                    for name, build in (("checkout", checkout), ("saga", saga))}
        all_runs: list[Run] = []
        for number in range(ITERATIONS):
            sink.delay_s = rng.uniform(0.3, 1.0)
            sink.fail_next(1, 503, path="/release")  # the refunded saga's compensation is retried
            if rng.random() < 0.5:
                sink.fail_next(1, 503, path="/refund")  # a transient refusal: retried
            service = planned_service(number, broker, database)
            iteration = Iteration(number, rng, sink, versions, totals, sweeper, service)
            if service == "broker" and broker.kind == "redis" and number % 2:
                with broker.down() as outage:  # runs start while the broker is down: their first message is lost
                    iteration.start_runs(api)
                assert outage[0].happened, f"the broker did not restart: {outage[0]}"
                totals["runs_started_with_broker_down"] += len(iteration.runs)
                totals["broker_restarts"] += 1
                iteration.service = None
            else:
                iteration.start_runs()
            all_runs += iteration.runs
            iteration.wait_for_moment()
            iteration.crash(workers)
            lost_keys |= iteration.lost_keys
            if iteration.service:
                iteration.restart_service(broker, database)
            iteration.recover(workers)
            totals["iterations"] += 1

        run_ids = ids(all_runs)
        checkouts = [r for r in all_runs if r.version_id == versions["checkout"].id]
        sagas = {r.id: r.input["refund"] for r in all_runs if r.version_id == versions["saga"].id}
        expected = {r.id: "completed" for r in checkouts}
        expected |= {rid: "failed" if refund == "refund" else "compensation_failed" for rid, refund in sagas.items()}
        states = dict(Run.objects.filter(id__in=run_ids).values_list("id", "state"))
        wrong = [run for run in all_runs if states[run.id] != expected[run.id]]
        assert not wrong, (describe(wrong), list(Effect.objects.filter(run__in=wrong).values_list(
            "key", "status", "attempts", "error")))

        # Every fan-out joined with all its items, in order, whatever was lost.
        quotes = StepRun.objects.filter(run__in=checkouts, name="quote").values_list("output", flat=True)
        assert list(quotes) == [[{"line": x} for x in "abc"]] * len(checkouts)

        # Exactly one effect per logical action at the remote that de-duplicates, nothing shipped.
        refunded = {rid for rid, refund in sagas.items() if refund == "refund"}
        expected_effects = {f"{rid}:pay:default": 1 for rid in run_ids}
        expected_effects |= {f"{rid}:hold:default": 1 for rid in sagas}
        expected_effects |= {f"{rid}:pay:compensate": 1 for rid in refunded}
        expected_effects |= {f"{rid}:hold:compensate": 1 for rid in refunded}
        assert dict(sink.effects) == expected_effects
        for run in Run.objects.filter(id__in=sagas, state="compensation_failed"):
            assert run.error["compensation"]["step"] == "pay"

        # Every call, per key, against the ledger — what a remote without de-duplication saw.
        account = ledger_account(all_runs)
        totals.update(check_every_call(sink, account, lost_keys))

        # E-mails: the outbox has one per checkout, and email.send was asked no more often than
        # lost outcomes explain — counted from its request log, which its de-duplication does
        # not filter (a repeated send it answered "duplicate" is still a repeated send).
        emails = Counter(json.loads(line)["idempotency_key"] for line in outbox_path().read_text().splitlines())
        assert emails == {f"{r.id}:notify:default": 1 for r in checkouts}
        asked = [json.loads(line) for line in email_requests_path().read_text().splitlines()]
        assert not [r for r in asked if r["duplicate"]], "email.send was asked to send an e-mail it had sent"
        for key, count in Counter(r["idempotency_key"] for r in asked).items():
            assert count <= 1 + account[key]["events"]["lost_and_retried"], (key, count, account[key])

        # The injected faults happened, and the engine answered each.
        # Each 503 served to a release was retried, unless a kill lost that answer (reconciled above).
        released = [r for r in sink.requests if r["path"] == "/release" and r["status"] == 503]
        answered = [r for r in released if r["key"] not in lost_keys]
        retries = Event.objects.filter(run__in=all_runs, kind="run.compensation_retrying")
        assert released and len(answered) <= retries.filter(payload__step="hold").count() <= len(released)
        if ITERATIONS > KILL_MOMENTS.index("during"):
            assert totals["kills_during"] and totals["calls_lost_at_kills"] >= totals["kills_during"]
        planned = [planned_service(n, broker, database) for n in range(ITERATIONS)]
        assert totals["broker_restarts"] == planned.count("broker")
        assert totals["database_restarts"] == planned.count("database")

        totals["runs"] = len(all_runs)
        totals["runs_completed"] = len(checkouts)
        totals["runs_compensated"] = len(refunded)
        totals["runs_compensation_failed"] = len(sagas) - len(refunded)
        totals["http_requests"] = len(sink.requests)
        totals["payments"] = sum(sink.effects[f"{rid}:pay:default"] for rid in run_ids)
        totals["refunds"] = sum(sink.effects[f"{rid}:pay:compensate"] for rid in refunded)
        totals["emails_sent"] = sum(emails.values())
        totals["email_requests"] = len(asked)
        totals["attempts_lost"] = StepRun.objects.filter(run__in=all_runs, attempt_records__outcome="lost").count()
        totals["effects_reconciled"] = Event.objects.filter(run__in=all_runs, kind="effect.reconciled").count()
        totals["effects_replayed"] = Event.objects.filter(run__in=all_runs, kind="effect.replayed").count()
        totals["compensation_retries"] = retries.count()
        totals["map_item_retries"] = Event.objects.filter(run__in=all_runs, kind="step.item_retrying").count()
    report = {"seed": seed, "broker": broker.kind, "database": connection.vendor,
              **dict(sorted(totals.items()))}
    Path(django_settings.VAR_DIR, "fault-suite-totals.json").write_text(json.dumps(report, indent=2))
    with capsys.disabled():
        print(f"\nfault suite totals: {json.dumps(report)}")
