"""One backend's measurements, in a process of its own: `python -m bench.measure ...`.

bench/run.py starts this module with the backend's environment already set (settings read
the environment at import, so each backend needs a fresh interpreter) and a migrated, empty
database. It starts the API server and real Celery workers, measures, stops them, and
writes one JSON document. Phases, in order:

1. idle: single runs through the real REST API (uvicorn), one at a time: start latency and
   unloaded step-to-step latency;
2. loaded: N concurrent runs of a linear chain of core.echo: step-to-step latency under
   load and throughput;
3. floor: the same two shapes as a bare Celery canvas on the same broker (bench.floor);
4. in process, no worker (bench.inprocess): SQL statements per step, the engine's service
   time per step, the price of a fresh database connection;
5. with `--live-runs N` (after 1): commit-to-screen latency of the live pages (bench.live);
6. with `--api-clients`, `--fanout-items`, `--held-runs`, `--sleeping-runs`, `--signalled-runs`
   or `--evaluation-cases` (after 5, before 2): the scale phases of bench.scale (the sleeping
   one with `celery beat` running).

It reads Stepwise's state only through its models and drives it only through its services
and API; it changes nothing in the engine.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from contextlib import ExitStack
from pathlib import Path

from .procs import (
    EVALUATION_QUEUES,
    LIVE_QUEUES,
    QUEUES,
    ROOT,
    Deadline,
    WorkerDied,
    api_server,
    celery_beat,
    celery_worker,
)
from .stats import chain_latencies_ms, ratio, say, summary

POLL_S = 0.01
WARMUP = 3  # runs (and floor chains) before the measured ones: imports, connections, caches
RUN_ENDED = ("completed", "failed", "cancelled", "timed_out")


def chain_definition(name: str, steps: int) -> dict:
    """A linear chain s0 -> s1 -> ... of the built-in pure tool core.echo."""
    return {
        "name": name,
        "input_schema": {"type": "object"},
        "steps": [
            {"name": f"s{i}", "type": "tool", "tool": "core.echo", "params": {"step": i},
             **({"after": [f"s{i - 1}"]} if i else {})}
            for i in range(steps)
        ],
    }


def wait_until(predicate, *, deadline: float, what: str, check=lambda: None,
               interval: float = POLL_S):
    """Poll `predicate` until truthy; `check()` raises if a process we need has died."""
    while time.time() < deadline:
        check()
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise Deadline(f"{what}: not within the deadline")


# --- fixtures -------------------------------------------------------------------------------


def make_fixtures(steps: int) -> dict:
    """A team, a token user in it, and the N-step chain workflow."""
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    from orchestrator.engine.services.workflows import workflow_save
    from orchestrator.models import Team

    team = Team.objects.create(slug="bench", name="Bench")
    user = get_user_model().objects.create_user("bench")
    team.members.add(user, through_defaults={"role": "owner"})
    token = Token.objects.create(user=user)
    chain, _ = workflow_save(team=team, definition=chain_definition("bench-chain", steps), actor=user)
    return {"token": token.key, "chain": chain, "team": team}


# --- 1. idle: start latency and unloaded step-to-step latency -----------------------------


def idle_runs(base_url: str, token: str, workflow: str, *, runs: int, steps: int, warmup: int,
              deadline: float, check, stop=lambda: False) -> dict:
    """POST one run at a time through the API; the next starts after the previous ended.

    start latency = the first step's started_at (written by the worker's claim) - the instant
    before the POST. With no other run in flight, every consecutive pair of steps gives the
    unloaded step-to-step latency: the engine's own overhead, with no queueing in it. `stop()`
    ends the series early, before the next run (the evaluation phase measures live runs this
    way for as long as its evaluation runs); `runs` is how many at most.
    """
    import httpx

    from orchestrator.models import Run, StepRun

    starts, api, stamps, to_queued, to_started, died = [], [], [], [], [], None
    first_wait = []  # the first step's queued -> started: its message's wait for a worker
    with httpx.Client(base_url=base_url, timeout=30,
                      headers={"Authorization": f"Token {token}"}) as http:
        for i in range(warmup + runs):
            if i >= warmup and stop():
                break
            t0 = time.time()
            response = http.post(f"/api/v1/workflows/{workflow}/runs/", json={"input": {}})
            t1 = time.time()
            if response.status_code != 202:
                raise RuntimeError(f"run start: HTTP {response.status_code} {response.text[:500]}")
            run = Run.objects.filter(id=response.json()["id"])
            try:
                wait_until(lambda run=run: run.filter(state__in=RUN_ENDED).exists(),
                           deadline=deadline, what="single run ended", check=check)
            except WorkerDied as exc:  # keep what the runs before this one measured
                died = str(exc)
                break
            except Deadline as exc:
                states = list(StepRun.objects.filter(run__in=run).values_list("name", "state"))
                raise Deadline(f"{exc}: run {run.first()}, steps {states}") from None
            rows = sorted(StepRun.objects.filter(run__in=run).values_list(
                "run_id", "position", "started_at", "finished_at", "queued_at"), key=lambda r: r[1])
            if i < warmup:
                continue
            starts.append((rows[0][2].timestamp() - t0) * 1000)
            api.append((t1 - t0) * 1000)
            first_wait.append((rows[0][2] - rows[0][4]).total_seconds() * 1000)
            stamps += [(r[0], r[1], _ts(r[2]), _ts(r[3])) for r in rows]
            for previous, step in zip(rows, rows[1:], strict=False):
                to_queued.append((step[4] - previous[3]).total_seconds() * 1000)
                to_started.append((step[2] - step[4]).total_seconds() * 1000)
    return {"latency_ms": summary(starts), "api_ms": summary(api),
            "step_latency_ms": summary(chain_latencies_ms(stamps, chain_length=steps)),
            # where an unloaded step-to-step gap goes: deciding the next step inside the
            # finishing transaction, then commit + broker + worker pickup + claim
            "finished_to_queued_ms": summary(to_queued),
            "queued_to_started_ms": summary(to_started),
            "first_step_wait_ms": summary(first_wait),
            "runs": len(starts), "warmup_runs": warmup, "worker_died": died}


# --- 2. step-to-step latency and throughput ------------------------------------------------


def chain_throughput(version, *, runs: int, steps: int, deadline: float, check) -> dict:
    """Start `runs` chains in one transaction (all dispatched on its commit) and time them."""
    from django.db import transaction

    from orchestrator.engine.authz import System
    from orchestrator.engine.services.runs import run_start
    from orchestrator.models import Run, StepRun

    t0 = time.time()
    with transaction.atomic():
        run_ids = [run_start(version=version, input={}, actor=System("bench")).id for _ in range(runs)]
    published = time.time()
    say(f"stepwise: {runs} runs created and dispatched in {published - t0:.2f}s")
    expected = runs * steps
    chains = Run.objects.filter(id__in=run_ids)
    last_report, died = 0.0, None
    while True:
        try:
            check()
        except WorkerDied as exc:
            died = str(exc)
            say(f"stepwise: WORKER DIED ({died}); reporting what finished")
            break
        ended = chains.filter(state__in=RUN_ENDED).count()
        if ended == runs:
            break
        if time.time() > deadline:
            say(f"stepwise: DEADLINE with {ended}/{runs} runs ended; reporting what finished")
            break
        if time.time() - last_report > 5:
            done = StepRun.objects.filter(run_id__in=run_ids, state="completed").count()
            say(f"stepwise: {done}/{expected} steps completed, {ended}/{runs} runs ended")
            last_report = time.time()
        time.sleep(0.25)

    rows = list(StepRun.objects.filter(run_id__in=run_ids)
                .values_list("run_id", "position", "state", "started_at", "finished_at"))
    done = [r for r in rows if r[2] == "completed"]
    stamps = [(r[0], r[1], _ts(r[3]), _ts(r[4])) for r in done]
    first_start = min((s[2] for s in stamps), default=None)
    last_finish = max((s[3] for s in stamps), default=None)
    wall = (last_finish - first_start) if stamps else None
    return {
        "latency_ms": summary(chain_latencies_ms(stamps, chain_length=steps)),
        "steps_expected": expected,
        "steps_done": len(done),
        "runs_completed": chains.filter(state="completed").count(),
        "runs_failed": chains.filter(state="failed").count(),
        "create_and_dispatch_s": round(published - t0, 3),
        "wall_s": round(wall, 3) if wall else None,
        "total_s": round(last_finish - t0, 3) if stamps else None,
        "steps_per_s": round(len(done) / wall, 2) if wall else None,
        "step_duration_ms": summary((s[3] - s[2]) * 1000 for s in stamps),
        "worker_died": died,
    }


def _ts(value) -> float | None:
    return value.timestamp() if value is not None else None


# --- driver ---------------------------------------------------------------------------------


def measure(args, result: dict) -> None:
    from django.conf import settings

    from . import floor, inprocess

    var_dir = Path(settings.VAR_DIR)
    env = dict(os.environ, CELERY_SKIP_CHECKS="1", PYTHONPATH=str(ROOT))
    result["config"] = {
        "database": settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1],
        "broker": settings.CELERY_BROKER_URL.split("://", 1)[0],
        "runs": args.runs, "steps": args.steps, "start_runs": args.start_runs,
        "concurrency": args.workers_concurrency, "web_processes": args.web_processes,
        "cpus": os.cpu_count(),
        "debug": settings.DEBUG, "python": sys.version.split()[0],
        "net_delay_ms": float(os.environ["BENCH_NET_DELAY_MS"])
        if os.environ.get("BENCH_NET_DELAY_MS") else None,
        # 1, 5, 15-minute load: other work on the machine shows up here, and in the figures
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
    }
    fixtures = make_fixtures(args.steps)
    incidents = result.setdefault("incidents", [])

    def checkpoint() -> None:
        """Write what is measured so far: an interrupted or overrunning run keeps its phases."""
        write_result(args.out, result)

    def start_workers(store: str | None = None):
        """Stepwise's workers; `store` names the store they use (`STEPWISE_STORE`), else the
        settings' default."""
        return celery_worker("stepwise", "orchestrator", concurrency=args.workers_concurrency,
                             env=env if store is None else dict(env, STEPWISE_STORE=store),
                             var_dir=var_dir, deadline=args.deadline,
                             # Evaluations on workers of their own leave it the live queues.
                             queues=LIVE_QUEUES if args.evaluation_workers else QUEUES)

    say("starting the API server (uvicorn) and a Stepwise worker")
    with ExitStack() as stack:
        server, base_url = api_server(env=env, var_dir=var_dir, deadline=args.deadline,
                                      processes=args.web_processes)
        stack.callback(server.stop)
        workers = start_workers()
        stack.callback(lambda: workers.stop())
        say(f"idle: {args.start_runs} runs, one at a time, through POST /api/v1/.../runs/")
        result["start"] = idle_runs(base_url, fixtures["token"], "bench-chain",
                                    runs=args.start_runs, steps=args.steps, warmup=WARMUP,
                                    deadline=args.deadline, check=workers.check)
        if result["start"]["worker_died"]:
            incidents.append(f"idle phase: {result['start']['worker_died']}")
            say(f"idle: WORKER DIED ({result['start']['worker_died']}); restarting it")
            workers.stop()
            workers = start_workers()
        checkpoint()
        if args.live_runs:
            from . import live

            say(f"live: {args.live_runs} runs, commit to a re-read after the websocket's nudge")
            result["live"] = live.commit_to_screen(base_url, fixtures["token"], "bench-chain",
                                                   runs=args.live_runs, deadline=args.deadline)
            checkpoint()
        if args.quota_steps:
            from . import capacity

            result["quota"] = capacity.quota_phase(
                args, base_url=base_url, token=fixtures["token"], env=env, var_dir=var_dir,
                deadline=time.time() + 0.6 * (args.deadline - time.time()), check=workers.check)
            checkpoint()
        if (args.api_clients or args.held_runs or args.fanout_items or args.sleeping_runs
                or args.signalled_runs or args.evaluation_cases):
            scale_phases(args, result, base_url=base_url, token=fixtures["token"],
                         server=server, workers=workers, checkpoint=checkpoint, env=env,
                         var_dir=var_dir)
        say(f"step-to-step: {args.runs} concurrent runs of a {args.steps}-step chain")
        # Leave the floor and the query count a share of the time left.
        share = time.time() + 0.6 * (args.deadline - time.time())
        sessions = inprocess.db_sessions()
        result["stepwise"] = chain_throughput(fixtures["chain"], runs=args.runs,
                                              steps=args.steps, deadline=share,
                                              check=workers.check)
        if result["stepwise"]["worker_died"]:
            incidents.append(f"loaded phase: {result['stepwise']['worker_died']}")
        if sessions is not None:
            time.sleep(1.5)  # backends flush their statistics at most once a second
            opened = inprocess.db_sessions() - sessions
            result["stepwise"]["db_connections_opened"] = opened
            result["stepwise"]["db_connections_per_step"] = round(
                opened / max(result["stepwise"]["steps_done"], 1), 2)
        result["rss_mb"] = {"stepwise": workers.peak_rss()}
        checkpoint()
    say(f"floor: {args.start_runs} bare Celery chains one at a time, then {args.runs} at once")
    try:
        result["floor"] = floor.measure(runs=args.runs, steps=args.steps,
                                        idle_runs=args.start_runs, warmup=WARMUP,
                                        concurrency=args.workers_concurrency, env=env,
                                        var_dir=var_dir, deadline=args.deadline - 20,
                                        rss=result["rss_mb"])
        incidents += [f"floor {d}" for d in result["floor"]["worker_died"]]
    except (Deadline, RuntimeError) as exc:  # the in-process figures do not need the floor
        result["floor"] = {}
        incidents.append(f"floor: {str(exc)[-1000:]}")
        say(f"floor: FAILED ({str(exc)[-300:]})")
    checkpoint()
    throughput_rounds(args, result, fixtures["chain"], start_workers=start_workers, env=env,
                      var_dir=var_dir, checkpoint=checkpoint)
    say("queries per step: one chain through the step services, in process")
    result["queries"] = inprocess.queries_per_step(fixtures["chain"])
    result["queries"]["api_start"] = inprocess.api_start_statements(fixtures["token"], "bench-chain")
    say("service time per step: claim + execute + succeed in process, no broker hop")
    result["service_ms"] = inprocess.service_time_per_step(fixtures["chain"])
    result["carried_service_ms"] = inprocess.carried_service_time_per_step(fixtures["chain"])
    result["python_calls"] = inprocess.python_calls_per_carried_step(fixtures["chain"])
    result["attestation"] = inprocess.attestation_cost_per_step(fixtures["chain"])
    result["round_trips"] = inprocess.round_trips_per_carried_step(fixtures["chain"])
    result["db_connect_ms"] = inprocess.db_connect_ms()
    checkpoint()
    say("large values: a chain of 256 KB outputs, in the row and as artifacts")
    result["large_values"] = inprocess.large_values(fixtures["team"])


def throughput_rounds(args, result: dict, version, *, start_workers, env: dict, var_dir: Path,
                      checkpoint) -> None:
    """The loaded throughput again, Stepwise then the floor, `--rounds` times in all (the first
    round is the loaded phases above). The machine's speed moves within a minute, and each
    loaded phase lasts seconds: the ratio of one round can catch one side in a slow moment.
    Each round's ratio is kept; the table gives them and their median. Each round also runs
    Stepwise on the reference store (orchestrator/store/reference.py), so its ratio is read
    beside the fast store's under the same conditions."""
    from . import floor

    def on_the_reference_store() -> float | None:
        workers = start_workers(store="reference")
        try:
            done = chain_throughput(version, runs=args.runs, steps=args.steps,
                                    deadline=time.time() + ROUND_BUDGET_S / 2, check=workers.check)
        finally:
            workers.stop()
        return done["steps_per_s"] if done["steps_done"] == done["steps_expected"] else None

    sw, fl = result.get("stepwise", {}).get("steps_per_s"), result.get("floor", {}).get("steps_per_s")
    say(f"throughput round 1/{args.rounds}: {args.runs} Stepwise runs on the reference store")
    reference = on_the_reference_store()
    rounds = result["throughput_rounds"] = [{"stepwise": sw, "floor": fl, "ratio": ratio(sw, fl),
                                             "reference": reference,
                                             "reference_ratio": ratio(reference, fl)}]
    checkpoint()
    for n in range(2, args.rounds + 1):
        if time.time() + ROUND_BUDGET_S > args.deadline - 60:  # leave the in-process phases time
            result.setdefault("incidents", []).append(f"throughput rounds: stopped before round {n}"
                                                      " (deadline)")
            break
        say(f"throughput round {n}/{args.rounds}: {args.runs} Stepwise runs, then the floor")
        workers = start_workers()
        try:
            mine = chain_throughput(version, runs=args.runs, steps=args.steps,
                                    deadline=time.time() + ROUND_BUDGET_S / 2, check=workers.check)
        finally:
            workers.stop()
        try:
            theirs = floor.throughput_round(tag=f"round{n}", runs=args.runs, steps=args.steps,
                                            concurrency=args.workers_concurrency, env=env,
                                            var_dir=var_dir, deadline=time.time() + ROUND_BUDGET_S / 2)
        except (Deadline, RuntimeError) as exc:
            result.setdefault("incidents", []).append(f"floor round {n}: {str(exc)[-500:]}")
            theirs = None
        sw = mine["steps_per_s"] if mine["steps_done"] == mine["steps_expected"] else None
        say(f"throughput round {n}/{args.rounds}: {args.runs} Stepwise runs on the reference store")
        reference = on_the_reference_store()
        rounds.append({"stepwise": sw, "floor": theirs, "ratio": ratio(sw, theirs),
                       "reference": reference, "reference_ratio": ratio(reference, theirs)})
        checkpoint()


# What one more throughput round may take at most (workers' starts included).
ROUND_BUDGET_S = 120


def scale_phases(args, result: dict, *, base_url: str, token: str, server, workers,
                 checkpoint, env: dict, var_dir: Path) -> None:
    """The opt-in phases of bench.scale, each given half of the time left when it starts."""
    from . import scale

    fixtures = scale.make_fixtures()

    def until() -> float:
        return time.time() + 0.5 * (args.deadline - time.time())

    if args.api_clients:
        say(f"api: {args.api_requests} POST .../runs/ from {args.api_clients} concurrent clients")
        result["api_load"] = scale.api_submission(base_url, token, "bench-api",
                                                  clients=args.api_clients,
                                                  requests=args.api_requests, deadline=until())
        checkpoint()
        capacity = result["api_load"]["requests_per_s"]
        if capacity:
            # The same clients below saturation: latency at half the rate the server managed.
            say(f"api: {args.api_requests // 2} POSTs paced at {capacity / 2:.1f}/s from "
                f"{args.api_clients} clients")
            result["api_paced"] = scale.api_submission(
                base_url, token, "bench-api", clients=args.api_clients,
                requests=args.api_requests // 2, deadline=until(), rate=capacity / 2)
            checkpoint()
        # Starts of runs that execute (one tool step each) while more arrive: the closed loop's
        # rate, then Poisson arrivals at half of it, each followed by the runs' drain.
        say(f"api: {args.api_requests} POSTs of runs that execute from {args.api_clients} clients")
        result["api_executing"] = scale.api_submission(
            base_url, token, "bench-single", clients=args.api_clients,
            requests=args.api_requests, deadline=until())
        result["api_executing"]["drained_s"] = scale.runs_drained("bench-single", deadline=until())
        checkpoint()
        executing = result["api_executing"]["requests_per_s"]
        if executing:
            say(f"api: {args.api_requests // 2} POSTs of runs that execute, Poisson arrivals at "
                f"{executing / 2:.1f}/s")
            result["api_poisson"] = scale.api_submission(
                base_url, token, "bench-single", clients=args.api_clients,
                requests=args.api_requests // 2, deadline=until(), rate=executing / 2,
                poisson=True)
            result["api_poisson"]["drained_s"] = scale.runs_drained("bench-single",
                                                                    deadline=until())
            checkpoint()
        # A web process's memory after every POST above: a request that left something behind
        # shows here as growth with --api-requests.
        result["api_web_rss_mb"] = server.peak_rss()
    if args.fanout_items:
        say(f"fan-out: {args.fanout_items} map items while single-step runs start one at a time")
        result["fanout"] = scale.fanout(base_url, token, items=args.fanout_items,
                                        probes=args.fanout_probes, deadline=until(),
                                        check=workers.check)
        checkpoint()

    def idle() -> dict:
        return idle_runs(base_url, token, "bench-chain", runs=min(10, args.start_runs),
                         steps=args.steps, warmup=1, deadline=until(), check=workers.check)

    if args.held_runs:
        say(f"held: {args.held_runs} runs waiting at a gate at once")

        result["held"] = scale.held_runs(
            fixtures["versions"]["bench-held"], runs=args.held_runs, approver=fixtures["approver"],
            idle=idle, deadline=until(), check=workers.check,
            processes={"api": server.proc.pid, "worker": workers.proc.pid})
        checkpoint()
    if args.sleeping_runs:
        # Only this phase runs beat: the reaper's sweeps are what wakes a sleep, and the other
        # phases are measured without them.
        window = args.sleep_window or max(args.sleeping_runs / 50, 10)
        say(f"sleeping: {args.sleeping_runs} runs asleep at once, woken over {window:.0f} s")
        beat = celery_beat(env=env, var_dir=var_dir, deadline=args.deadline)
        try:
            result["sleeping"] = scale.sleeping_runs(
                fixtures["versions"]["bench-sleep"], runs=args.sleeping_runs, window_s=window,
                idle=idle, deadline=until(), check=workers.check,
                processes={"api": server.proc.pid, "worker": workers.proc.pid,
                           "beat": beat.proc.pid})
        finally:
            beat.stop()
        checkpoint()
    if args.signalled_runs:
        say(f"signalled: {args.signalled_runs} runs waiting for a signal at once")
        result["signalled"] = scale.signalled_runs(
            fixtures["versions"]["bench-wait"], runs=args.signalled_runs,
            rate=args.signal_rate, idle=idle, deadline=until(), check=workers.check,
            processes={"api": server.proc.pid, "worker": workers.proc.pid})
        checkpoint()
    if args.evaluation_cases:
        evaluation_phase(args, result, base_url=base_url, token=token, workers=workers,
                         version=fixtures["versions"]["bench-eval"], owner=fixtures["owner"],
                         env=env, var_dir=var_dir, deadline=until())
        checkpoint()


def evaluation_phase(args, result: dict, *, base_url: str, token: str, workers, version, owner,
                     env: dict, var_dir: Path, deadline: float) -> None:
    """bench.scale's evaluation beside live runs; the live runs are the idle phase's, started
    for as long as the evaluation runs. With `--evaluation-workers` (the default, as the
    Procfile runs them) the evaluation runs on a worker of its own, started for the phase, and
    the Stepwise worker serves the live queues alone (docs/operations.md, "Queues")."""
    from . import scale

    def live(stop) -> dict:
        return idle_runs(base_url, token, "bench-chain", runs=1_000_000, steps=args.steps,
                         warmup=0, deadline=args.deadline, check=workers.check, stop=stop)

    evaluators = None
    if args.evaluation_workers:
        say(f"evaluation: a worker of {args.evaluation_workers} process(es) on the evaluation queues"
            f"{f', at nice {args.evaluation_nice}' if args.evaluation_nice else ''}")
        evaluators = celery_worker("evaluation", "orchestrator", concurrency=args.evaluation_workers,
                                   env=env, var_dir=var_dir, deadline=args.deadline,
                                   queues=EVALUATION_QUEUES, nice=args.evaluation_nice)

    def check() -> None:
        workers.check()
        if evaluators is not None:
            evaluators.check()

    say(f"evaluation: {args.evaluation_cases} cases beside live runs")
    try:
        phase = result["evaluation"] = scale.evaluation_beside_live(
            version, owner=owner, cases=args.evaluation_cases, concurrency=args.evaluation_concurrency,
            budget_share=args.evaluation_budget_share, live=live, deadline=deadline, check=check)
    finally:
        if evaluators is not None:
            rss = evaluators.peak_rss()
            evaluators.stop()
    phase["evaluation_workers"] = args.evaluation_workers
    phase["evaluation_nice"] = args.evaluation_nice if evaluators is not None else 0
    if evaluators is not None:
        phase["evaluation_worker_rss"] = rss
    for name, baseline in (("live_vs_idle", result["start"]), ("live_vs_control", phase["control"])):
        if baseline:
            phase[name] = {figure: {q: ratio(phase["live"][figure][q], baseline[figure][q])
                                    for q in ("p50", "p99")}
                           for figure in ("step_latency_ms", "latency_ms", "first_step_wait_ms")}


def _terminate(signum, frame):
    raise SystemExit(f"terminated by signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", required=True)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--start-runs", type=int, default=30)
    parser.add_argument("--workers-concurrency", type=int, default=2)
    parser.add_argument("--web-processes", type=int, default=1)
    parser.add_argument("--live-runs", type=int, default=0)
    parser.add_argument("--api-clients", type=int, default=0)
    parser.add_argument("--api-requests", type=int, default=400)
    parser.add_argument("--held-runs", type=int, default=0)
    parser.add_argument("--sleeping-runs", type=int, default=0)
    parser.add_argument("--signalled-runs", type=int, default=0)
    parser.add_argument("--signal-rate", type=float, default=50)
    parser.add_argument("--sleep-window", type=float, default=0)
    parser.add_argument("--fanout-items", type=int, default=0)
    parser.add_argument("--fanout-probes", type=int, default=30)
    parser.add_argument("--evaluation-cases", type=int, default=0)
    parser.add_argument("--quota-steps", type=int, default=0)
    parser.add_argument("--quota-concurrent", type=int, default=4)
    parser.add_argument("--quota-tokens-per-minute", type=int, default=1_000_000)
    parser.add_argument("--quota-window-s", type=float, default=240)
    parser.add_argument("--model-latency-ms", type=float, default=50)
    parser.add_argument("--evaluation-concurrency", type=int, default=4)
    parser.add_argument("--evaluation-budget-share", type=float, default=0.65)
    parser.add_argument("--evaluation-workers", type=int, default=1)
    parser.add_argument("--evaluation-nice", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--deadline", type=float, required=True, help="epoch seconds")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    os.environ["BENCH_BACKEND"] = args.backend
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "orchestrator.settings")
    import django

    django.setup()
    logging.getLogger("httpx").setLevel(logging.WARNING)
    result: dict = {"backend": args.backend}
    try:
        measure(args, result)
    except (Deadline, RuntimeError) as exc:
        result["error"] = str(exc)[:2000]
        say(f"FAILED: {exc}")
    except KeyboardInterrupt:
        result["error"] = "interrupted"
        return 130
    finally:
        result["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
        write_result(args.out, result)
    return 1 if result.get("error") else 0


def write_result(out: Path, result: dict) -> None:
    out.write_text(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    sys.exit(main())
