"""The floor: a bare Celery app whose one task does nothing but note when it ran.

Workers for the floor run start with `celery -A bench.floor_app worker ...` and the same queues,
pool, concurrency and command-line switches as the Stepwise workers. The app takes its whole
configuration from the JSON in BENCH_FLOOR_CELERY, which `bench.measure` builds from the
CELERY_* Django settings (same broker URL and transport options, acks_late, prefetch 1,
reject on worker lost, json). It must not import Django: the floor workers run without
DJANGO_SETTINGS_MODULE, so Celery's Django fixup (which closes the database connection around
every task) is not part of the floor.

Each task appends one line, "tag run index started finished" (epoch seconds), to a file of
its own process under BENCH_FLOOR_DIR: one buffered write to the page cache, the cheapest
record that needs no server and costs the same on both backends.
"""
import json
import os
import time

from celery import Celery

app = Celery("bench_floor")
app.conf.update(json.loads(os.environ.get("BENCH_FLOOR_CELERY", "{}")))

_logs: dict[int, object] = {}


def _log():
    pid = os.getpid()  # prefork children inherit module state: one file per process
    if pid not in _logs:
        folder = os.environ["BENCH_FLOOR_DIR"]
        _logs[pid] = open(os.path.join(folder, f"{pid}.log"), "a", buffering=1)
    return _logs[pid]


@app.task(name="bench.floor_step")
def floor_step(tag: str, run: int, index: int) -> None:
    """A chain link: note start and finish. The next link is sent by Celery on return."""
    started = time.time()
    finished = time.time()
    _log().write(f"{tag} {run} {index} {started:.6f} {finished:.6f}\n")
