"""The attestation's cost per step, alone: `python -m bench.attestation [--backend B] [--steps N]
[--runs R]` (docs/benchmark.md#attestation).

For each backend (embedded, postgres or both), on its scratch state (bench/backends.py), it
migrates, creates the N-step chain workflow and drives R chains through the step services in
one process, as a worker does (bench/inprocess.py `attestation_cost_per_step`), then prints
the figures (bench/stats.py `attestation_line`). No worker, no broker hop: the service time it
compares with is the engine's own, so the share it prints is the largest the attestation
takes of a step. The whole benchmark (`bench/run.py`) prints the same line.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from .backends import BACKENDS, backend_env

ROOT = Path(__file__).resolve().parents[1]


def child(steps: int, runs: int) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "orchestrator.settings")
    import django

    django.setup()
    from . import inprocess
    from .measure import make_fixtures

    fixtures = make_fixtures(steps)
    print(json.dumps(inprocess.attestation_cost_per_step(fixtures["chain"], runs=runs)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="both", choices=(*BACKENDS, "both"))
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.steps, args.runs)
        return 0
    from .stats import attestation_line

    status = 0
    for backend in BACKENDS if args.backend == "both" else (args.backend,):
        with backend_env(backend) as (env, _):
            subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env,
                           check=True)
            done = subprocess.run([sys.executable, "-m", "bench.attestation", "--child",
                                   "--steps", str(args.steps), "--runs", str(args.runs)],
                                  cwd=ROOT, env=env, capture_output=True, text=True)
        if done.returncode:
            print(f"{backend}: FAILED\n{done.stderr[-3000:]}", flush=True)
            status = 1
            continue
        print(attestation_line(backend, json.loads(done.stdout.strip().splitlines()[-1])), flush=True)
        print(f"{'':<10}load average {[round(x, 2) for x in os.getloadavg()]}", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
