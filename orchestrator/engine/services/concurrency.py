"""Concurrency keys: at most `limit` unfinished runs of a workflow per key — one refund per
customer at a time (docs/definitions.md#concurrency).

A workflow's `concurrency: {key, limit}` renders `key` over a run's input as it starts
(`run_start`). A run whose key already has `limit` runs going is created **held**: `pending`,
its steps not started, with its place in line. When a run of the key ends, the oldest held
runs start, as many as there is room for (`held_runs_release`, sent once the end commits; the
reaper sweeps for a release that was lost). The starts and releases of a keyed workflow take
its row's lock, so two of them never both take the last place.
"""
from datetime import timedelta

from django.db import transaction

from orchestrator.models import Run, Workflow

from ..authz import SCHEDULER, label
from ..definitions.limits import MAX_CONCURRENCY_KEY_CHARS
from ..definitions.templates import TemplateError, render_template
from ..errors import InputInvalid
from ..events import event_record
from ..selectors import held_runs, lock_run
from ..states import RUN_TERMINAL, RunState
from .scheduling import run_advance

GOING = frozenset(set(RunState.values) - RUN_TERMINAL - {RunState.PENDING})


def concurrency_of(definition: dict) -> dict | None:
    return definition.get("concurrency") or None


def concurrency_key_of(definition: dict, input: dict) -> str:
    """The run's concurrency key ("" when its workflow sets none). Raises InputInvalid when the
    key cannot be made from this input. It reads the stored input, where a secret value is a
    marker: a secret never becomes a key."""
    concurrency = concurrency_of(definition)
    if concurrency is None:
        return ""
    try:
        key = render_template(concurrency["key"], {"input": input}).strip()
    except TemplateError as error:
        raise InputInvalid("the run's concurrency key cannot be made from its input",
                           [{"path": "concurrency.key", "message": str(error)}]) from None
    if not key or len(key) > MAX_CONCURRENCY_KEY_CHARS:
        raise InputInvalid("the run's concurrency key cannot be made from its input", [
            {"path": "concurrency.key", "message": f"gave {len(key)} characters; a key has 1 to "
             f"{MAX_CONCURRENCY_KEY_CHARS}"}])
    return key


def keyed_workflow_lock(workflow_id: int) -> None:
    """Take the workflow row's lock for the rest of the transaction (PostgreSQL; SQLite's
    writers are serialized already): its keyed starts and releases go one at a time."""
    Workflow.objects.select_for_update(of=("self",)).filter(pk=workflow_id).values_list("pk").first()


def room_for(workflow_id: int, key: str, limit: int) -> int:
    """How many more runs of `key` may go now."""
    going = Run.objects.filter(version__workflow_id=workflow_id, concurrency_key=key, state__in=GOING).count()
    return max(limit - going, 0)


def held_runs_release(*, workflow_id: int, key: str) -> int:
    """Start the oldest held runs of `key` while the workflow's `concurrency.limit` has room.
    Returns how many started."""
    started = 0
    with transaction.atomic():
        keyed_workflow_lock(workflow_id)
        for run_id in held_runs(workflow_id, key).values_list("id", flat=True)[:100]:
            run = lock_run(run_id)
            if run.state != RunState.PENDING:
                continue
            concurrency = concurrency_of(run.version.normalized)
            if concurrency is None or room_for(workflow_id, key, concurrency["limit"]) == 0:
                break
            run.start()
            max_duration = (run.version.normalized.get("budget") or {}).get("max_duration_s")
            if max_duration:
                run.deadline_at = run.started_at + timedelta(seconds=max_duration)
            run.save()
            event_record(run=run, kind="run.running", actor=label(SCHEDULER),
                         payload={"concurrency_key": key, "released": True})
            run_advance(run, actor=SCHEDULER)
            started += 1
    return started


def held_runs_sweep() -> int:
    """Release the keys whose held runs have room (a release lost with a worker). The reaper
    calls it."""
    started = 0
    keys = (Run.objects.filter(state=RunState.PENDING).exclude(concurrency_key="")
            .values_list("version__workflow_id", "concurrency_key").distinct())
    for workflow_id, key in list(keys[:100]):
        started += held_runs_release(workflow_id=workflow_id, key=key)
    return started
