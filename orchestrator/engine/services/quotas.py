"""A queued step's reservation of its dependency's quota, taken before it is claimed
(docs/operations.md#provider-quotas; the quota itself is `engine/quotas.py`).

A step whose call does not fit its run's class's share stays `queued`: it is not claimed and
its message comes back after a short countdown, as a rate-limited one does
(`worker.step_execute`). Its `waiting_for` says why and a `step.deferred` event records it, once
per reason; the claim clears it. The worker gives the reservation back, settled to the tokens
the call used, when the attempt ends (`step_quota_release`).
"""
import json
import math
import random

from django.conf import settings
from django.db import transaction

from orchestrator.models import StepRun

from .. import limits
from ..definitions import calls_model
from ..events import event_record
from ..quotas import Refusal, Reservation, quota_of, quota_release, quota_reserve
from ..selectors import runs_with_version, spec_of
from ..states import StepState

DEFAULT_OUTPUT_TOKENS = 1024


def quota_dependency_of(spec: dict) -> str:
    """The dependency a step's quota is kept under: its model (`model:<name>`), its named
    connection (`connection:<name>`) or what `limits.dependency_of` calls it."""
    connection = (spec.get("params") or {}).get("connection") if spec["type"] == "tool" else None
    if isinstance(connection, str) and "{" not in connection:
        return f"connection:{connection}"
    return limits.dependency_of(spec)


def tokens_estimate(spec: dict, step_input: dict | None) -> int:
    """What a call is reserved for: its output cap and its prompt, counted high (a token per
    three characters of its templates and of the input they read)."""
    if not calls_model(spec):
        return 0
    model = (getattr(settings, "STEPWISE_MODELS", {}) or {}).get(spec.get("model"), {}) or {}
    output = spec.get("max_tokens") or model.get("max_tokens") or DEFAULT_OUTPUT_TOKENS
    prompt = len(spec.get("prompt") or "") + len(spec.get("system") or "") \
        + len(json.dumps(step_input or {}, default=str))
    return int(output) + math.ceil(prompt / 3)


def step_quota_reserve(*, step_id: int) -> Reservation | float | None:
    """Reserve the call of queued step `step_id` under its dependency's quota, for its run's
    capacity class. Returns the reservation; None when no quota applies (or the step is no
    longer queued: the claim will say so); else the seconds after which to try again, having
    recorded why the step waits."""
    step = StepRun.objects.only("name", "run_id", "state", "input", "waiting_for").filter(
        id=step_id).first()
    if step is None or step.state != StepState.QUEUED:
        return None
    run = runs_with_version().get(id=step.run_id)
    return _reserve(run, step, spec_of(run, step.name), step.input)


def item_quota_reserve(*, run, step: StepRun, spec: dict,
                       item_input: dict) -> Reservation | float | None:
    """The same for one item of waiting map step `step` whose item calls `spec`: the map step
    says why its items wait until it joins (`map_join`), one event per reason."""
    return _reserve(run, step, spec, item_input)


def _reserve(run, step: StepRun, spec: dict, call_input) -> Reservation | float | None:
    dependency = quota_dependency_of(spec)
    if not dependency or quota_of(dependency) is None:
        return None
    reserved = quota_reserve(dependency, run.capacity, tokens_estimate(spec, call_input),
                             hold_s=spec["timeout_s"] + settings.STEPWISE_LEASE_S)
    if isinstance(reserved, Refusal):
        if step.waiting_for != reserved.reason:
            _waiting_record(run, step, reserved)
        # Spread the waiting steps' returns, so they do not all ask at the same instant.
        return reserved.retry_in_s * random.uniform(1.0, 1.5)
    return reserved


def step_quota_release(reservation: Reservation | None, *, tokens_used: int | None) -> None:
    if reservation is not None:
        quota_release(reservation, tokens_used=tokens_used)


def _waiting_record(run, step: StepRun, refusal: Refusal) -> None:
    with transaction.atomic():
        # A queued step, or a map step whose items wait (its state, as read, still holds); once
        # per reason, however many of its items' workers were refused at the same moment.
        if not StepRun.objects.filter(id=step.id, state=step.state).exclude(
                waiting_for=refusal.reason).update(waiting_for=refusal.reason):
            return
        step.waiting_for = refusal.reason
        event_record(run=run, step=step, kind="step.deferred", actor="service:quotas",
                     payload={"dependency": refusal.dependency, "capacity": refusal.capacity,
                              "limit": refusal.limit, "reason": refusal.reason})
