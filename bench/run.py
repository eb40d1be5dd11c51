"""Benchmark entry point: `python bench/run.py [--backend embedded|postgres|both] ...`.

For each backend: a fresh var dir (and database), `manage.py migrate`, then `bench.measure`
in a subprocess with that backend's environment, under a deadline. Prints progress while it
waits, a table at the end, and writes each backend's figures as JSON under var/bench/
(gitignored). Cleans up on every exit: worker and server process groups, the bench database,
the temporary directories.
"""
from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: make the `bench` package importable
    sys.path.insert(0, str(ROOT))

from bench.backends import BACKENDS, backend_env  # noqa: E402
from bench.netdelay import DelayProxy, target_of, through  # noqa: E402
from bench.procs import reap_ledger  # noqa: E402
from bench.stats import table  # noqa: E402


def run_backend(backend: str, args, deadline: float) -> dict:
    print(f"=== {backend}: deadline in {deadline - time.time():.0f}s", flush=True)
    with backend_env(backend, keep=args.keep) as (env, var_dir), ExitStack() as proxies:
        if args.net_delay_ms is not None:
            network(env, args.net_delay_ms, proxies)
        # Outside the scratch dir: what the measuring process wrote survives an interruption.
        args.out_dir.mkdir(parents=True, exist_ok=True)
        out = args.out_dir / f"results-{backend}.json"
        out.unlink(missing_ok=True)
        try:
            subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env,
                           check=True, timeout=max(deadline - time.time(), 1))
            cmd = [sys.executable, "-m", "bench.measure", "--backend", backend, "--out", str(out),
                   "--runs", str(args.runs), "--steps", str(args.steps),
                   "--start-runs", str(args.start_runs),
                   "--workers-concurrency", str(args.workers_concurrency),
                   "--web-processes", str(args.web_processes),
                   "--live-runs", str(args.live_runs),
                   "--api-clients", str(args.api_clients), "--api-requests", str(args.api_requests),
                   "--held-runs", str(args.held_runs), "--fanout-items", str(args.fanout_items),
                   "--sleeping-runs", str(args.sleeping_runs),
                   "--sleep-window", str(args.sleep_window),
                   "--signalled-runs", str(args.signalled_runs),
                   "--signal-rate", str(args.signal_rate),
                   "--fanout-probes", str(args.fanout_probes),
                   "--evaluation-cases", str(args.evaluation_cases),
                   "--quota-steps", str(args.quota_steps),
                   "--quota-concurrent", str(args.quota_concurrent),
                   "--quota-tokens-per-minute", str(args.quota_tokens_per_minute),
                   "--quota-window-s", str(args.quota_window_s),
                   "--model-latency-ms", str(args.model_latency_ms),
                   "--evaluation-concurrency", str(args.evaluation_concurrency),
                   "--evaluation-budget-share", str(args.evaluation_budget_share),
                   "--evaluation-workers", str(args.evaluation_workers),
                   "--evaluation-nice", str(args.evaluation_nice),
                   "--rounds", str(args.rounds),
                   "--deadline", str(deadline)]
            child = subprocess.Popen(cmd, cwd=ROOT, env=env)
            try:
                child.wait(timeout=max(deadline - time.time(), 0) + 30)
            except subprocess.TimeoutExpired:
                print(f"=== {backend}: measuring process overran; terminating it", flush=True)
                child.send_signal(signal.SIGTERM)
                try:
                    child.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
            finally:
                if child.poll() is None:  # Ctrl-C: the child got SIGINT too; let it clean up
                    try:
                        child.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        child.kill()
                        child.wait()
            if out.exists():
                return json.loads(out.read_text())
            return {"backend": backend, "error": f"no result (exit status {child.returncode})"}
        except subprocess.SubprocessError as exc:
            return {"backend": backend, "error": str(exc)}
        finally:
            killed = reap_ledger(var_dir)
            if killed:
                print(f"=== {backend}: killed {killed} leftover process group(s)", flush=True)


def network(env: dict, delay_ms: float, proxies: ExitStack) -> None:
    """Put a proxy adding `delay_ms` to each round trip between every process the bench
    starts and PostgreSQL and Redis (bench/netdelay.py)."""
    for name, default_port in (("DATABASE_URL", 5432), ("CELERY_BROKER_URL", 6379),
                               ("REDIS_URL", 6379)):
        if name not in env:
            continue
        proxy = DelayProxy(target_of(env[name], default_port), delay_ms)
        proxies.callback(proxy.stop)
        env[name] = through(env[name], proxy)
    env["BENCH_NET_DELAY_MS"] = str(delay_ms)


def scale_history(args) -> int:
    """The scale-history phase alone, on a fresh PostgreSQL database."""
    with backend_env("postgres", keep=args.keep) as (env, _var_dir):
        args.out_dir.mkdir(parents=True, exist_ok=True)
        out = args.out_dir / "results-scale-history.json"
        subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env,
                       check=True)
        done = subprocess.run([sys.executable, "-m", "bench.scale_history",
                               "--runs", str(args.scale_history),
                               "--requests", str(args.scale_requests), "--out", str(out)],
                              cwd=ROOT, env=env, timeout=args.timeout)
        return done.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Stepwise benchmark: start latency, step-to-step latency, throughput, "
        "against a bare-Celery floor. Prints figures; asserts nothing.")
    parser.add_argument("--backend", choices=[*BACKENDS, "both"], default="both")
    parser.add_argument("--runs", type=int, default=200, help="concurrent chains (default 200)")
    parser.add_argument("--steps", type=int, default=10, help="steps per chain (default 10)")
    parser.add_argument("--start-runs", type=int, default=30,
                        help="single runs for the start latency (default 30)")
    parser.add_argument("--workers-concurrency", type=int, default=2,
                        help="prefork processes per worker (default 2)")
    parser.add_argument("--web-processes", type=int, default=1,
                        help="uvicorn processes serving the API (default 1; the compose file runs 2)")
    parser.add_argument("--live-runs", type=int, default=0,
                        help="runs for the live pages' commit-to-screen latency (default 0: skip)")
    parser.add_argument("--api-clients", type=int, default=0,
                        help="concurrent clients POSTing runs (default 0: skip; the target is 16)")
    parser.add_argument("--api-requests", type=int, default=400,
                        help="POSTs in all for --api-clients (default 400)")
    parser.add_argument("--held-runs", type=int, default=0,
                        help="runs held at a gate at once, then released (default 0: skip)")
    parser.add_argument("--sleeping-runs", type=int, default=0,
                        help="runs asleep at once, then woken by the reaper (default 0: skip)")
    parser.add_argument("--sleep-window", type=float, default=0,
                        help="seconds over which the sleeping runs' wake-ups are spread "
                        "(default: one per 20 ms, at least 10 s)")
    parser.add_argument("--signalled-runs", type=int, default=0,
                        help="runs waiting for a signal at once, then signalled (default 0: skip)")
    parser.add_argument("--signal-rate", type=float, default=50,
                        help="signals sent a second to the waiting runs (default 50)")
    parser.add_argument("--fanout-items", type=int, default=0,
                        help="map items of one run while single steps are probed (default 0: skip)")
    parser.add_argument("--fanout-probes", type=int, default=30,
                        help="single-step runs started one at a time during the fan-out (default 30)")
    parser.add_argument("--evaluation-cases", type=int, default=0,
                        help="cases of an evaluation run while live runs are started one at a "
                        "time (default 0: skip; the target is 1000)")
    parser.add_argument("--quota-steps", type=int, default=0,
                        help="an evaluation of N model steps beside interactive runs, every call "
                             "under one provider quota (bench/capacity.py; 0: skip)")
    parser.add_argument("--quota-concurrent", type=int, default=4,
                        help="the quota's calls in flight at once (default 4)")
    parser.add_argument("--quota-tokens-per-minute", type=int, default=1_000_000,
                        help="the quota's tokens a minute (default 1,000,000)")
    parser.add_argument("--quota-window-s", type=float, default=240,
                        help="the longest the quota phase's evaluation runs (default 300 s)")
    parser.add_argument("--model-latency-ms", type=float, default=50,
                        help="how long the local model server takes to answer (default 50 ms)")
    parser.add_argument("--evaluation-concurrency", type=int, default=4,
                        help="the evaluation's runs at a time (default 4, the engine's default)")
    parser.add_argument("--evaluation-budget-share", type=float, default=0.65,
                        help="the evaluation's budget as a share of what all its cases would cost "
                        "(default 0.65: it stops at its budget after about 65%% of them)")
    parser.add_argument("--evaluation-workers", type=int, default=1,
                        help="processes of a worker of the evaluation queues alone, the Stepwise "
                        "worker on the live queues alone, as the Procfile runs them (default 1; "
                        "0: one worker on every queue)")
    parser.add_argument("--evaluation-nice", type=int, default=0,
                        help="the CPU priority (nice -n) of the evaluation worker (default 0)")
    parser.add_argument("--net-delay-ms", type=float, default=None,
                        help="PostgreSQL and Redis behind proxies adding this to each round "
                        "trip, as a network between machines (postgres backend)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="loaded throughput rounds, Stepwise then the floor in each; the "
                        "table gives each round's ratio and their median (default 3)")
    parser.add_argument("--timeout", type=float, default=600,
                        help="seconds for the whole invocation, shared by the backends (default 600)")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "var" / "bench",
                        help="where results-<backend>.json go (default var/bench, gitignored)")
    parser.add_argument("--keep", action="store_true",
                        help="keep each backend's temporary var dir (logs, SQLite file)")
    parser.add_argument("--scale-history", type=int, default=0, metavar="N",
                        help="only the scale-history phase (PostgreSQL): seed N finished runs "
                        "in the database, then p50/p99 of each list and page (bench/scale_history.py)")
    parser.add_argument("--scale-requests", type=int, default=30,
                        help="requests per page in the scale-history phase (default 30)")
    args = parser.parse_args(argv)
    if args.scale_history:
        return scale_history(args)
    if args.steps < 2 or args.runs < 1 or args.start_runs < 1 or args.rounds < 1:
        parser.error("--steps must be >= 2, --runs, --start-runs and --rounds >= 1")
    if args.net_delay_ms is not None and args.backend != "postgres":
        parser.error("--net-delay-ms needs --backend postgres (the embedded default has no network)")

    backends = list(BACKENDS) if args.backend == "both" else [args.backend]
    end = time.time() + args.timeout
    results = []
    try:
        for i, backend in enumerate(backends):
            share = (end - time.time()) / (len(backends) - i)
            results.append(run_backend(backend, args, time.time() + share))
    except KeyboardInterrupt:
        print(f"\ninterrupted; cleaned up (what was measured: {args.out_dir}/results-*.json)",
              flush=True)
        return 130
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for result in results:
        (args.out_dir / f"results-{result['backend']}.json").write_text(json.dumps(result, indent=2))
    print()
    print(table(results))
    print(f"\nJSON: {args.out_dir}/results-<backend>.json")
    return 1 if any(r.get("error") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
