"""Concurrency keys on a step: at most `limit` steps of one name and key run at once across a
workflow's runs — one refund per customer at a time (docs/definitions.md#step-concurrency).

A step's `concurrency: {key, limit}` renders `key` over its run's input when a worker comes to
claim it (`step_concurrency_admit`, inside the claim's transaction, under the workflow row's
lock). It is claimed only when fewer than `limit` steps of its key are running and none waits
before it (steps of the key wait in the order they were created); otherwise it stays `queued`,
its message dropped, with `waiting_for` giving its place and a `step.held` event. When a step of
the key ends, the steps first in line are sent again, as many as there is room for
(`held_steps_release`, after commit); the reaper's re-dispatch of a queued step is the backstop.
"""
from orchestrator.models import StepRun

from ..definitions.limits import MAX_CONCURRENCY_KEY_CHARS
from ..definitions.templates import TemplateError, render_template
from ..dispatch import step_dispatch_on_commit
from ..events import event_record
from ..selectors import spec_of
from ..states import StepState
from .concurrency import keyed_workflow_lock


def step_concurrency_of(spec: dict) -> dict | None:
    return spec.get("concurrency") or None


def step_concurrency_key(spec: dict, run_input: dict) -> str:
    """The step's rendered key; a key its input cannot make is the key's template itself, so
    such steps still go one `limit` at a time rather than all at once."""
    try:
        key = render_template(spec["concurrency"]["key"], {"input": run_input}).strip()
    except TemplateError:
        key = ""
    return (key or spec["concurrency"]["key"])[:MAX_CONCURRENCY_KEY_CHARS]


def step_concurrency_admit(run, step: StepRun, spec: dict) -> str | None:
    """Whether queued `step` may be claimed now under its concurrency key (inside the claim's
    transaction). Sets `step.concurrency_key`. Returns None when it may; else records why it
    waits (once per place) and returns that reason."""
    concurrency = step_concurrency_of(spec)
    if concurrency is None:
        return None
    key = step_concurrency_key(spec, run.input)
    keyed_workflow_lock(run.version.workflow_id)
    _keys_of_earlier_steps(run, step)
    same = StepRun.objects.filter(run__version__workflow_id=run.version.workflow_id,
                                  name=step.name, concurrency_key=key)
    running = same.filter(state=StepState.RUNNING).count()
    ahead = same.filter(state=StepState.QUEUED, id__lt=step.id).count()
    step.concurrency_key = key
    if running + ahead < concurrency["limit"]:
        return None
    reason = f"waiting its turn for concurrency key {key!r} (place {ahead + 1})"
    if step.waiting_for != reason:
        StepRun.objects.filter(id=step.id).update(concurrency_key=key, waiting_for=reason)
        step.waiting_for = reason
        event_record(run=run, step=step, kind="step.held", actor="service:scheduler",
                     payload={"concurrency_key": key, "place": ahead + 1})
    return reason


def _keys_of_earlier_steps(run, step: StepRun) -> None:
    """Give the queued steps of this name created before `step` whose messages no worker has
    taken yet their keys, so that they count as ahead of it in line."""
    unkeyed = StepRun.objects.filter(
        run__version__workflow_id=run.version.workflow_id, name=step.name,
        state=StepState.QUEUED, concurrency_key="", id__lt=step.id,
    ).select_related("run__version").only("id", "name", "run__input", "run__version__digest")
    for earlier in unkeyed:
        spec = spec_of(earlier.run, earlier.name)
        if step_concurrency_of(spec) is not None:
            StepRun.objects.filter(id=earlier.id).update(
                concurrency_key=step_concurrency_key(spec, earlier.run.input))


def held_steps_release(run, step: StepRun) -> None:
    """`step`, of a concurrency key, has ended: send the steps first in line again, after
    commit (inside the transaction that ended it)."""
    if not step.concurrency_key:
        return
    concurrency = step_concurrency_of(spec_of(run, step.name)) or {"limit": 1}
    same = StepRun.objects.filter(run__version__workflow_id=run.version.workflow_id,
                                  name=step.name, concurrency_key=step.concurrency_key)
    room = concurrency["limit"] - same.filter(state=StepState.RUNNING).count()
    for waiting in same.filter(state=StepState.QUEUED).order_by("id")[:max(room, 0)] \
            .only("id", "queue", "run_id", "name", "state"):
        step_dispatch_on_commit(waiting.id, waiting.queue, run_id=waiting.run_id,
                                step_name=waiting.name)

