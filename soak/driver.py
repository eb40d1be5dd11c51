"""The soak's loop: start runs, inject faults at random, let everything settle, check, report.

Runs inside Django configured for the soak's private PostgreSQL (direct) and Redis; the workers
reach the database through the fault proxy. Every fault returns whether it really happened (a
live process killed, a server restarted, a connection cut, a message sent), and only those are
counted.
"""
import logging
import os
import random
import threading
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import httpx
from django.core.management import call_command
from django.db import close_old_connections
from django.utils import timezone

from approvals.models import ApprovalRequest
from orchestrator.engine import clock
from orchestrator.engine.services import reaper
from orchestrator.engine.services.kinds.human_gate import approval_grant, approval_reject
from orchestrator.models import MapItem, Run, StepRun
from orchestrator.tasks import compensate_run, execute_step, map_item, map_join

from . import cluster, invariants, workload
from .proxy import FaultProxy
from .sink import Sink

LEASE_S = 5
SETTLED = ("completed", "failed", "compensation_failed", "cancelled", "timed_out")
# Fault kinds and their weights: cheap ones often, whole-stack kills rarely.
FAULTS = {
    "kill_worker": 2.5, "kill_beat": 3, "kill_web": 3, "kill_stack": 0.5,
    "restart_broker": 1.5, "restart_database": 1.5,
    "net_latency": 10, "net_reset": 12, "net_partition": 4,
    "duplicate_delivery": 18, "reordered_delivery": 14, "clock_jump": 9,
}
MAX_IN_FLIGHT = 20  # runs not yet settled: the next wave waits below it
# The soak paces its own starts (MAX_IN_FLIGHT) and checks faults, not admission: the web process
# it starts lifts the per-person and per-token start rates and the default cap on unfinished runs.
UNLIMITED_STARTS = {"STEPWISE_RUN_START_RATE_PERSON": "", "STEPWISE_RUN_START_RATE_TOKEN": "",
                    "STEPWISE_TEAM_MAX_LIVE_RUNS": "0"}
logging.getLogger("httpx").setLevel(logging.WARNING)


class Soak:
    def __init__(self, *, minutes: float, seed: int, root: Path, pg_port: int, redis_port: int,
                 log=print):
        self.minutes, self.seed, self.root, self.log = minutes, seed, root, log
        self.rng = random.Random(seed)
        self.faults: Counter = Counter()
        self.skipped: Counter = Counter()  # faults drawn that found nothing to hurt
        self.planned: list[workload.Started] = []
        self.pg = cluster.Postgres(root, port=pg_port)
        self.egress = os.environ.get("STEPWISE_EGRESS", "")
        self.redis = cluster.Redis(root, port=redis_port)
        if os.environ.get("CELERY_BROKER_URL") != self.redis.url:  # never a shared server
            raise RuntimeError("the soak's driver must be started by `stepwise_soak` with its own broker")

    # --- set-up ------------------------------------------------------------------------------

    def start(self) -> None:
        self.redis.start()
        call_command("migrate", verbosity=0)
        self.sink = Sink(seed=self.seed, refused={"/ship": 422, "/refund-refused": 422},
                         transient_rate=0.05)
        self.proxy = FaultProxy("127.0.0.1", self.pg.port)
        self.people = workload.setup(self.sink.url)
        logs = self.root / "logs"
        logs.mkdir(exist_ok=True)
        base = {**os.environ, **UNLIMITED_STARTS, "CELERY_SKIP_CHECKS": "1",
                "STEPWISE_LEASE_S": str(LEASE_S),
                "STEPWISE_REDISPATCH_AFTER_S": "5", "STEPWISE_BEAT_LEASE_S": "4",
                "STEPWISE_EGRESS": self.egress,
                "CELERY_BROKER_URL": self.redis.url, "REDIS_URL": self.redis.url}
        through_proxy = {**base, "DATABASE_URL": f"postgres://postgres@127.0.0.1:{self.proxy.port}/stepwise"}
        self.workers = [cluster.worker(f"soak-worker-{i}", through_proxy, logs) for i in (1, 2)]
        self.beats = [cluster.beat(f"soak-beat-{i}", base, logs) for i in (1, 2)]
        self.web_port = cluster.free_port()
        self.web = cluster.web(self.web_port, base, logs)
        for proc in self.procs:
            proc.start()

    @property
    def procs(self) -> list[cluster.Proc]:
        return [*self.workers, *self.beats, self.web]

    def stop(self) -> None:
        for proc in getattr(self, "web", None) and self.procs or []:
            proc.stop()
        for part in ("proxy", "sink"):
            if hasattr(self, part):
                getattr(self, part).close()
        self.redis.stop()

    # --- the workload ------------------------------------------------------------------------

    def plan_wave(self) -> None:
        for _ in workload.KINDS:
            self.planned.append(workload.plan(self.rng, len(self.planned)))

    def start_planned(self) -> None:
        for started in self.planned:
            if started.run_id:
                continue
            started.via_api = started.via_api or self.rng.random() < 0.3
            try:
                started.run_id = self._start_api(started) if started.via_api else \
                    str(workload.start_direct(self.people, started).id)
            except Exception:  # the database, the broker or the web is down: again later
                close_old_connections()
                return

    def _start_api(self, started: workload.Started) -> str:
        response = httpx.post(
            f"http://127.0.0.1:{self.web_port}/api/v1/workflows/soak-{started.kind}/runs/",
            json={"input": workload.input_of(started)}, timeout=10,
            headers={"Authorization": f"Token {self.people.token}", "Idempotency-Key": started.order})
        response.raise_for_status()
        return response.json()["id"]

    def review(self) -> None:
        """The simulated reviewer decides every pending gate as planned for its run."""
        decisions = {s.run_id: s.decision for s in self.planned if s.kind == "gate" and s.run_id}
        try:
            pending = list(ApprovalRequest.objects.filter(state="pending", run_id__in=list(decisions)))
            for approval in pending:
                if decisions[str(approval.run_id)] == "approve":
                    approval_grant(approval_id=approval.id, user=self.people.reviewer,
                                   proposal_hash=approval.proposal_hash)
                else:
                    approval_reject(approval_id=approval.id, user=self.people.reviewer,
                                    proposal_hash=approval.proposal_hash, note="soak: rejected")
        except Exception:
            close_old_connections()

    def in_flight(self) -> int:
        ids = [s.run_id for s in self.planned if s.run_id]
        try:
            return Run.objects.filter(id__in=ids).exclude(state__in=SETTLED).count() + \
                sum(1 for s in self.planned if not s.run_id)
        except Exception:
            close_old_connections()
            return MAX_IN_FLIGHT

    # --- faults ------------------------------------------------------------------------------

    def _kill_and_restart(self, procs: list[cluster.Proc]) -> bool:
        killed = [proc.kill() for proc in procs]
        for proc in procs:
            proc.start()
        return any(killed)

    def kill_worker(self) -> bool:
        return self._kill_and_restart([self.rng.choice(self.workers)])

    def kill_beat(self) -> bool:
        return self._kill_and_restart([self.rng.choice(self.beats)])

    def kill_web(self) -> bool:
        return self._kill_and_restart([self.web])

    def kill_stack(self) -> bool:
        return self._kill_and_restart(self.procs)

    def restart_broker(self) -> bool:
        return self.redis.restart()

    def restart_database(self) -> bool:
        ok = self.pg.restart()
        close_old_connections()
        return ok

    def _for_a_while(self, seconds: float, end) -> None:
        """End a network fault after `seconds`, while the loop goes on injecting others."""
        timer = threading.Timer(seconds, end)
        timer.daemon = True
        timer.start()

    def net_latency(self) -> bool:
        if self.proxy.delay_s:
            return False  # already slow
        self.proxy.latency(self.rng.uniform(0.02, 0.2))
        self._for_a_while(self.rng.uniform(1, 4), lambda: self.proxy.latency(0))
        return True

    def net_reset(self) -> bool:
        return self.proxy.reset() > 0

    def net_partition(self) -> bool:
        if self.proxy.partitioned.is_set():
            return False  # already cut off
        self.proxy.partition()
        # Sometimes longer than the lease: the workers' claims expire while they run (fencing).
        self._for_a_while(self.rng.uniform(1, 2 * LEASE_S), self.proxy.heal)
        return True

    def _messages(self) -> list[tuple]:
        ids = [s.run_id for s in self.planned if s.run_id]
        live = Run.objects.filter(id__in=ids).exclude(state__in=SETTLED)
        steps = list(StepRun.objects.filter(run__in=live).values_list("id", "queue"))
        messages = [(execute_step, (sid,), queue or "tools") for sid, queue in steps]
        for sid, index in MapItem.objects.filter(step__run__in=live).values_list("step_id", "index"):
            messages += [(map_item, (sid, index), "tools"), (map_join, (sid,), "orchestrator")]
        messages += [(compensate_run, (str(rid),), "tools")
                     for rid in live.filter(state="compensating").values_list("id", flat=True)]
        return messages

    def _deliver(self, *, reorder: bool) -> bool:
        try:
            messages = self._messages()
        except Exception:
            close_old_connections()
            return False
        if not messages:
            return False
        batch = self.rng.sample(messages, min(len(messages), self.rng.randint(1, 12)))
        sent = 0
        for task, args, queue in batch:
            countdown = self.rng.uniform(0, 3) if reorder else 0
            try:
                task.apply_async(args, queue=queue, countdown=countdown, retry=False)
                sent += 1
            except Exception:
                break  # the broker is down
        return sent > 0

    def duplicate_delivery(self) -> bool:
        return self._deliver(reorder=False)

    def reordered_delivery(self) -> bool:
        return self._deliver(reorder=True)

    def clock_jump(self) -> bool:
        """The reaper sweeps with its clock jumped past every lease: live workers' claims look
        lost, their steps are retried while they still run — fencing must keep them apart."""
        jump = timedelta(seconds=LEASE_S + self.rng.uniform(1, 5))
        clock._source = lambda: timezone.now() + jump
        try:
            reaper.reap()
            return True
        except Exception:
            close_old_connections()
            return False
        finally:
            clock._source = timezone.now

    # --- the loop ----------------------------------------------------------------------------

    def run(self) -> dict:
        began = time.monotonic()
        try:
            self.start()
            # The minutes are of faults: a slow start on a busy machine takes none of them.
            faulting = time.monotonic()
            self.loop(until=faulting + self.minutes * 60)
            faulting_s = time.monotonic() - faulting
            settled = self.drain(timeout_s=300)
            report = self.check(settled)
        finally:
            self.stop()
        report["faulting_s"] = round(faulting_s)
        report["seconds"] = round(time.monotonic() - began)
        return report

    def loop(self, *, until: float) -> None:
        names, weights = list(FAULTS), list(FAULTS.values())
        next_wave = 0.0
        while time.monotonic() < until:
            if time.monotonic() >= next_wave and self.in_flight() < MAX_IN_FLIGHT:
                self.plan_wave()
                next_wave = time.monotonic() + 3
            self.start_planned()
            self.review()
            name = self.rng.choices(names, weights)[0]
            try:
                happened = getattr(self, name)()
            except Exception as exc:  # a fault that could not be injected is not counted
                self.log(f"soak: {name} failed to inject: {exc!r}")
                happened = False
            (self.faults if happened else self.skipped)[name] += 1
            total = sum(self.faults.values())
            if total % 25 == 0 and happened:
                self.log(f"soak: {total} faults, {len(self.planned)} runs planned, "
                         f"{self.in_flight()} in flight")
            time.sleep(self.rng.uniform(0.05, 0.35))

    def drain(self, *, timeout_s: float) -> bool:
        """Heal everything, then wait (the beats reap) until every planned run has settled."""
        self.proxy.latency(0)
        self.proxy.heal()
        for proc in self.procs:
            if not proc.alive():
                proc.start()
        self.log(f"soak: faults stopped after {sum(self.faults.values())}; draining "
                 f"{self.in_flight()} runs in flight")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.start_planned()
            self.review()
            if self.in_flight() == 0:
                return True
            time.sleep(1)
        return False

    def check(self, settled: bool) -> dict:
        close_old_connections()
        observed = invariants.collect(self.planned, self.sink.effects, self.sink.answered_ok)
        problems = invariants.violations(observed)
        kinds = Counter(s.kind for s in self.planned)
        return {
            "seed": self.seed, "minutes": self.minutes, "settled": settled,
            "faults": sum(self.faults.values()), "faults_by_kind": dict(sorted(self.faults.items())),
            "faults_drawn_without_target": dict(sorted(self.skipped.items())),
            "runs": len(self.planned), "runs_by_kind": dict(sorted(kinds.items())),
            "runs_via_api": sum(1 for s in self.planned if s.via_api),
            "runs_by_state": dict(Counter(f.state for f in observed.runs)),
            "effects": sum(observed.effects.values()),
            "requests_at_sink": self.sink.requests,
            "stale_writers_refused_at_sink": sum(self.sink.stale_refused.values()),
            "transient_503s_served": sum(self.sink.transient_served.values()),
            "lost_outcomes_resent": sum(sum(f.resent_after_lost.values()) for f in observed.runs),
            "database_restarts": self.pg.restarts,
            "violations": len(problems), "violation_list": problems[:50],
        }


def table(report: dict) -> str:
    """The totals as a Markdown table."""
    rows = [("faults injected", report["faults"])]
    rows += [(f"  {kind}", n) for kind, n in report["faults_by_kind"].items()]
    rows += [("runs", report["runs"])]
    rows += [(f"  {kind}", n) for kind, n in report["runs_by_kind"].items()]
    rows += [("  started through the web API", report["runs_via_api"])]
    rows += [(f"  ended {state}", n) for state, n in sorted(report["runs_by_state"].items(), key=str)]
    rows += [("effects at the sink (one per key)", report["effects"]),
             ("requests at the sink", report["requests_at_sink"]),
             ("stale writers refused by fencing token", report["stale_writers_refused_at_sink"]),
             ("lost outcomes reconciled by resending the key", report["lost_outcomes_resent"]),
             ("transient 503s served", report["transient_503s_served"]),
             ("violations", report["violations"])]
    width = max(len(name) for name, _ in rows)
    lines = [f"| {'what':<{width}} | count |", f"|{'-' * (width + 2)}|------:|"]
    lines += [f"| {name:<{width}} | {value} |" for name, value in rows]
    return "\n".join(lines)
