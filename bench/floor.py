"""The floor run: Stepwise's chain workload as a bare Celery canvas on the same broker.

`runs` chains of `steps` links of bench.floor_app.floor_step, all sent at once to the `tools`
queue (where Stepwise's tool steps go), consumed by a worker started with the same command line
as the Stepwise worker but `-A bench.floor_app`. Latency = next link's start - previous link's
finish, from the timestamps each link writes (see bench/floor_app.py).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from .procs import Deadline, WorkerDied, celery_worker
from .stats import chain_latencies_ms, say, summary

# Settings that are not about moving messages: the floor has no beat and keeps no results.
NOT_FOR_FLOOR = {"beat_schedule", "beat_scheduler", "result_backend", "result_extended",
                 "worker_hijack_root_logger"}


def celery_config() -> dict:
    """Every CELERY_* Django setting, as the Stepwise app reads it (namespace CELERY).

    The broker transport is pinned to the class the Stepwise app resolves for its URL, by
    import path: an alias Stepwise registers at import (such as a scheme of its own for the
    embedded broker) means nothing to a process that does not import Stepwise.
    """
    from django.conf import settings
    from kombu.transport import resolve_transport

    conf = {name[len("CELERY_"):].lower(): getattr(settings, name)
            for name in dir(settings) if name.startswith("CELERY_")}
    conf = {k: v for k, v in conf.items() if k not in NOT_FOR_FLOOR}
    transport = resolve_transport(conf.get("broker_transport") or conf["broker_url"].split(":", 1)[0])
    conf["broker_transport"] = f"{transport.__module__}:{transport.__name__}"
    return conf


def read_stamps(folder: Path, tag: str) -> list[tuple]:
    """(run, index, started, finished) of every complete line written with `tag`."""
    stamps = []
    for path in folder.glob("*.log"):
        text = path.read_text()
        for line in text[: text.rfind("\n") + 1].splitlines():
            t, run, index, started, finished = line.split()
            if t == tag:
                stamps.append((int(run), int(index), float(started), float(finished)))
    return stamps


def _setup(env: dict, var_dir: Path, steps: int, concurrency: int, deadline: float):
    """(send(tag, run), start_workers(), the folder the links write to)."""
    folder = var_dir / "floor"
    folder.mkdir(exist_ok=True)
    floor_env = {k: v for k, v in env.items() if k != "DJANGO_SETTINGS_MODULE"}
    floor_env.update(BENCH_FLOOR_CELERY=json.dumps(celery_config()), BENCH_FLOOR_DIR=str(folder))
    os.environ.update(BENCH_FLOOR_CELERY=floor_env["BENCH_FLOOR_CELERY"],
                      BENCH_FLOOR_DIR=str(folder))
    from celery import chain

    from .floor_app import floor_step  # configured from the environment just set

    def send(tag: str, run: int) -> None:
        chain(*(floor_step.si(tag, run, i).set(queue="tools") for i in range(steps))).apply_async()

    def start_workers():
        return celery_worker("floor", "bench.floor_app", concurrency=concurrency, env=floor_env,
                             var_dir=var_dir, deadline=deadline)

    return send, start_workers, folder


def throughput_round(*, tag: str, runs: int, steps: int, concurrency: int, env: dict,
                     var_dir: Path, deadline: float) -> float | None:
    """Steps per second of `runs` chains sent at once to a worker started for them (the loaded
    phase of `measure` again, for another round of the throughput; `tag` names its links)."""
    send, start_workers, folder = _setup(env, var_dir, steps, concurrency, deadline)
    workers = start_workers()
    try:
        for r in range(runs):
            send(tag, r)
        stamps = _wait(folder, tag, runs * steps, deadline=deadline, check=workers.check)
    finally:
        workers.stop()
    return _steps_per_s(stamps)


def _steps_per_s(stamps: list[tuple]) -> float | None:
    if not stamps:
        return None
    wall = max(s[3] for s in stamps) - min(s[2] for s in stamps)
    return round(len(stamps) / wall, 2) if wall else None


def measure(*, runs: int, steps: int, idle_runs: int, warmup: int, concurrency: int,
            env: dict, var_dir: Path, deadline: float, rss: dict) -> dict:
    """Idle chains one at a time, then `runs` chains at once; the same shape as Stepwise's."""
    send, start_workers, folder = _setup(env, var_dir, steps, concurrency, deadline)
    workers = start_workers()
    died, starts, idle = [], [], []
    try:
        try:
            for r in range(warmup + idle_runs):
                t0 = time.time()
                send("idle", r)
                idle = _wait(folder, "idle", (r + 1) * steps, deadline=deadline, quiet=True,
                             check=workers.check)
                if r >= warmup:
                    starts.append((min(s[2] for s in idle if s[0] == r) - t0) * 1000)
        except WorkerDied as exc:
            died.append(f"idle phase: {exc}")
            say(f"floor: WORKER DIED ({exc}); restarting it for the loaded phase")
            workers.stop()
            workers = start_workers()
        idle = [s for s in idle if s[0] >= warmup]
        t0 = time.time()
        for r in range(runs):
            send("bench", r)
        published = time.time()
        try:
            stamps = _wait(folder, "bench", runs * steps, deadline=deadline, check=workers.check)
        except WorkerDied as exc:
            died.append(f"loaded phase: {exc}")
            say(f"floor: WORKER DIED ({exc}); reporting what finished")
            stamps = read_stamps(folder, "bench")
        rss["floor"] = workers.peak_rss()
    finally:
        workers.stop()
    first_start = min((s[2] for s in stamps), default=None)
    last_finish = max((s[3] for s in stamps), default=None)
    wall = (last_finish - first_start) if stamps else None
    return {
        "start_latency_ms": summary(starts),
        "idle_latency_ms": summary(chain_latencies_ms(idle, chain_length=steps)),
        "latency_ms": summary(chain_latencies_ms(stamps, chain_length=steps)),
        "steps_expected": runs * steps,
        "steps_done": len(stamps),
        "create_and_dispatch_s": round(published - t0, 3),
        "wall_s": round(wall, 3) if wall else None,
        "total_s": round(last_finish - t0, 3) if stamps else None,
        "steps_per_s": _steps_per_s(stamps),
        "worker_died": died,
        "celery_config": celery_config(),
    }


def _wait(folder: Path, tag: str, expected: int, *, deadline: float, check,
          quiet: bool = False) -> list[tuple]:
    last_report = time.time()
    while True:
        check()
        stamps = read_stamps(folder, tag)
        if len(stamps) >= expected:
            return stamps
        if time.time() > deadline:
            if quiet:
                raise Deadline(f"floor: {tag} chain not done within the deadline")
            say(f"floor: DEADLINE with {len(stamps)}/{expected} {tag} links done")
            return stamps
        if not quiet and time.time() - last_report > 5:
            say(f"floor: {len(stamps)}/{expected} {tag} links done")
            last_report = time.time()
        time.sleep(0.005 if quiet else 0.1)
