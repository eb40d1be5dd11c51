"""The one path from a trigger to a run, and admission control.

`fire(trigger, key=..., context=..., origin=...)` is what every kind of trigger calls, inside
its own transaction with the trigger row locked (`trigger_lock`):

1. a key already fired returns its firing (a replayed tick, a redelivered message, a retried
   webhook): **one run per key, ever** — and the run's idempotency key repeats it;
2. the filter decides whether the event concerns the trigger at all;
3. the input template builds the run input, checked against the workflow's input schema;
4. admission: past the trigger's `max_per_minute`, or while `budgets.services.budget_admit`
   refuses a new run (the team's cap on unfinished runs, the same on every start path, or a
   spent budget), the firing is refused or held (`when_limited`), never started;
5. `orchestrator.engine.services.runs.run_start` — the same service as the REST API — starts it,
   with the trigger's provenance: the people who created and last changed it (and who fired it).

Refusals write an audit entry. Held firings are started by `queued_firings_admit` (beat, every
2 s), oldest first, as the rate and the team's cap allow; the person who fired one must still
be allowed to start runs in the team then, or it is refused (recorded on the firing).

A trigger with `debounce_s` holds each valid event (`debouncing`) before step 4: a newer event
of the same group (`debounce_key`) takes its place (the older one is `coalesced` into it) and
waits again, up to `debounce_max_s` from the group's first event; `queued_firings_admit` lets
a quiet group's event go through admission as a held firing.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import timedelta

from django.db import transaction
from django.db.models import Count, Q

from audit.services import audit_record
from budgets.services import admission_refusal
from orchestrator.engine.authz import Action, Actor, System, label, may, require
from orchestrator.engine.clock import now
from orchestrator.engine.definitions.limits import run_input_problems
from orchestrator.engine.errors import (
    BudgetExceeded,
    Forbidden,
    IdempotencyConflict,
    InputInvalid,
    NotAllowed,
)
from orchestrator.engine.provenance import (
    FIRED,
    TRIGGER_CHANGED,
    TRIGGER_CREATED,
    merged,
    person_entry,
)
from orchestrator.engine.selectors import lock_run, spec_of
from orchestrator.engine.services.admission import refusal_audit_once
from orchestrator.engine.services.runs import input_problems, run_start, version_start_refusal
from orchestrator.engine.services.signals import correlated_step, signal_deliver
from orchestrator.models import Run

from ..mapping import MappingFailed, correlation_key, event_matches, input_from_event
from ..models import Firing, Trigger, TriggerKind, Uncorrelated, WhenLimited
from ..selectors import trigger_actor, version_to_run

RATE_WINDOW = timedelta(seconds=60)
SYSTEM_DEBOUNCE = System("debounce")
ADMIT_BATCH = 50  # firings one trigger admits per sweep, so one trigger cannot hog it


@dataclass
class FireOutcome:
    """What became of a firing.

    `status`: started (a new run), signalled (delivered to a waiting run: `correlate`), duplicate (the key had fired: its run, or its held firing),
    queued (held by admission control), debounced (held for the trigger's debounce window), ignored (the filter said no), invalid (the event did
    not make a valid input: `problems`), refused (`reason`: rate, concurrent_runs, budget,
    queue_full, disabled, refused_at_admission, uncorrelated, or the webhook's signature
    reasons), not_found.
    """

    status: str
    run: Run | None = None
    firing: Firing | None = None
    reason: str = ""
    problems: list[dict] = field(default_factory=list)
    retry_after_s: int | None = None

    @property
    def accepted(self) -> bool:
        """The event was taken care of: a run exists or will, or it concerns no one."""
        return self.status in ("started", "signalled", "duplicate", "queued", "debounced", "ignored")


def trigger_lock(trigger_id) -> Trigger:
    """The trigger with its row locked for the rest of the transaction (PostgreSQL; SQLite's
    IMMEDIATE transactions serialize writers instead): firings of one trigger are admitted one
    at a time, so two of them never both take the last place under its rate."""
    return Trigger.objects.select_for_update(of=("self",)).select_related(
        "team", "workflow", "created_by", "updated_by").get(id=trigger_id)


def trigger_audit(trigger: Trigger, *, action: str, actor: str, outcome: str, payload: dict,
                  idempotency_key: str = "") -> None:
    """An audit entry about a trigger (created, changed, refused a firing, ...), in the
    caller's transaction. Never pass a secret in `payload`."""
    audit_record(action=action, actor=actor, subject_type="trigger", subject_id=trigger.id,
                 outcome=outcome, team=trigger.team.slug, workflow=trigger.workflow.name,
                 payload={"trigger": trigger.name, "kind": trigger.kind, **payload},
                 idempotency_key=idempotency_key)


# Refusals that a flood repeats: audited once per trigger, reason and window (admission.py).
ADMISSION_REASONS = frozenset({"rate", "concurrent_runs", "budget", "queue_full"})


def refusal(trigger: Trigger, *, key: str, reason: str, problems: list[dict], actor: str,
            origin: dict | None = None, retry_after_s: int | None = None,
            status: str = "refused") -> FireOutcome:
    """Record (audit) that a firing was refused, and say so. In the caller's transaction.
    A refusal by admission (ADMISSION_REASONS) is audited once per window."""
    payload = {"key": key, "reason": reason, "problems": problems, "origin": origin or {}}
    if reason in ADMISSION_REASONS:
        refusal_audit_once(limit=reason, subject=f"trigger:{trigger.id}", write=lambda window: (
            trigger_audit(trigger, action="trigger.refused", actor=actor, outcome=reason,
                          payload={**payload, **window})))
    else:
        trigger_audit(trigger, action="trigger.refused", actor=actor, outcome=reason,
                      payload=payload)
    return FireOutcome(status, reason=reason, problems=problems, retry_after_s=retry_after_s)


@dataclass(frozen=True)
class _Limit:
    reason: str
    message: str
    retry_after_s: int


def _limit(trigger: Trigger) -> _Limit | None:
    """Why a firing may not start now, or None."""
    moment = now()
    recent = Firing.objects.filter(trigger=trigger, started_at__gt=moment - RATE_WINDOW)
    count = recent.count()
    if count >= trigger.max_per_minute:
        oldest = recent.order_by("started_at").values_list("started_at", flat=True).first()
        wait = (oldest + RATE_WINDOW - moment).total_seconds() if oldest else 1
        return _Limit("rate", f"trigger '{trigger.name}' started {count} runs in the last minute "
                      f"(max_per_minute {trigger.max_per_minute})", max(1, math.ceil(wait)))
    if refused := admission_refusal(team=trigger.team, workflow=trigger.workflow):
        reason = "concurrent_runs" if refused.detail["level"].endswith("concurrent_runs") else "budget"
        return _Limit(reason, str(refused), refused.retry_after_s or 30)
    return None


def _origin(trigger: Trigger, key: str, extra: dict) -> dict:
    return {"trigger": str(trigger.id), "name": trigger.name, "kind": trigger.kind, "key": key,
            **extra}


def trigger_provenance(trigger: Trigger, *, fired_by=None) -> dict:
    """Who set a run of `trigger` in motion (orchestrator/engine/provenance.py): the person who
    fired it (an api trigger), and whoever created it or last changed its settings or secret — a
    schedule, a webhook or a queue event runs what they set up."""
    people = [person_entry(fired_by, FIRED)] if fired_by is not None else []
    if trigger.created_by is not None:
        people.append(person_entry(trigger.created_by, TRIGGER_CREATED))
    if trigger.updated_by is not None:
        people.append(person_entry(trigger.updated_by, TRIGGER_CHANGED))
    return {"path": "api_trigger" if trigger.kind == TriggerKind.API else trigger.kind,
            "people": merged(people),
            "trigger": {"id": str(trigger.id), "name": trigger.name, "kind": trigger.kind,
                        "revision": trigger.revision}}


def _start(trigger: Trigger, *, key: str, run_input: dict, origin: dict, actor: Actor) -> Run:
    version = version_to_run(trigger)
    if version is None:
        raise InputInvalid("the trigger's workflow version does not exist",
                           [{"path": "workflow_version", "message": "no such version"}])
    return run_start(version=version, input=run_input, actor=actor,
                     idempotency_key=f"trigger:{trigger.id}:{key}", trigger=trigger.kind,
                     origin=_origin(trigger, key, origin), capacity=trigger.capacity or None,
                     provenance=trigger_provenance(trigger, fired_by=_person(actor)))


def fire(trigger: Trigger, *, key: str, context: dict, origin: dict,
         actor: Actor | None = None) -> FireOutcome:
    """Fire `trigger` (locked by the caller, `trigger_lock`) for the event `key`.

    `context` is what the filter and the template read (mapping.py); `origin` what the run
    and the ledger record about the event (a slot, a delivery id, a message id). `actor`
    defaults to the trigger itself; a programmatic trigger passes the person firing it.
    Raises Forbidden when a person may not start runs in the trigger's team.
    """
    actor = actor or trigger_actor(trigger)
    existing = Firing.objects.filter(trigger=trigger, key=key).select_related("run").first()
    if existing is not None and existing.state == Firing.State.REFUSED:
        return FireOutcome("refused", firing=existing, reason=existing.reason,
                           problems=existing.problems)
    if existing is not None:
        taken = existing.coalesced_into if existing.coalesced_into_id else existing
        return FireOutcome("duplicate", run=taken.run or existing.signalled_run, firing=existing)
    who = label(actor)
    if not trigger.enabled:
        return refusal(trigger, key=key, reason="disabled", actor=who, origin=origin,
                       problems=[{"path": "", "message": f"trigger '{trigger.name}' is disabled"}])
    context = {**context, "trigger": {"name": trigger.name, "kind": trigger.kind}}
    try:
        if not event_matches(trigger.filter, context):
            return FireOutcome("ignored", reason="filter")
        correlated = correlation_key(trigger.correlate, context)
        run_input = input_from_event(trigger.input_template, context)
    except MappingFailed as failed:
        return refusal(trigger, key=key, reason=failed.reason_class, problems=failed.problems,
                       actor=who, origin=origin, status="invalid")
    if correlated is not None and (delivered := _correlated(
            trigger, key=key, correlated=correlated, payload=run_input, origin=origin,
            actor=actor)) is not None:
        return delivered
    version = version_to_run(trigger)
    missing = (f"version {trigger.workflow_version}" if trigger.workflow_version
               else "published version")
    problems = (run_input_problems(run_input) or input_problems(
        version.normalized["input_schema"], run_input)) if version else [
        {"path": "workflow_version",
         "message": f"workflow '{trigger.workflow.name}' has no {missing}"}]
    if version and not problems and (refused := version_start_refusal(version, actor)):
        problems = refused.problems
    if problems:
        return refusal(trigger, key=key, reason="invalid_input", problems=problems, actor=who,
                       origin=origin, status="invalid")
    if not isinstance(actor, System):  # a person fires a programmatic trigger: may they?
        require(actor, Action.RUN_START, team=trigger.team)
    if trigger.debounce_s:
        return _debounce(trigger, key=key, context=context, run_input=run_input, origin=origin,
                         actor=actor)
    held = Firing.objects.filter(trigger=trigger, state=Firing.State.QUEUED)
    limit = _limit(trigger)
    if trigger.when_limited == WhenLimited.QUEUE and (limit or held.exists()):
        # Behind the ones already held, even when this one could go: first come, first served.
        if held.count() >= trigger.max_queued:
            return refusal(trigger, key=key, reason="queue_full", actor=who, origin=origin,
                           retry_after_s=limit.retry_after_s if limit else 30, problems=[
                               {"path": "", "message": f"trigger '{trigger.name}' already holds "
                                f"{trigger.max_queued} firings (max_queued)"}])
        firing = Firing.objects.create(trigger=trigger, key=key, state=Firing.State.QUEUED,
                                       input=run_input, origin=origin, fired_by=_person(actor))
        trigger_audit(trigger, action="trigger.queued", actor=who, outcome="queued",
                      payload={"key": key, "reason": limit.message if limit else "behind held firings"})
        return FireOutcome("queued", firing=firing, reason=limit.reason if limit else "held")
    if limit:
        return refusal(trigger, key=key, reason=limit.reason, actor=who, origin=origin,
                       retry_after_s=limit.retry_after_s,
                       problems=[{"path": "", "message": limit.message}])
    try:
        run = _start(trigger, key=key, run_input=run_input, origin=origin, actor=actor)
    except BudgetExceeded as refused:  # admitted a moment ago, refused now: a race for the cap
        # run_start audited it (once per window); say so as every admission refusal.
        reason = "concurrent_runs" if refused.detail["level"].endswith("concurrent_runs") else "budget"
        return FireOutcome("refused", reason=reason, problems=refused.problems,
                           retry_after_s=refused.retry_after_s)
    firing = Firing.objects.create(trigger=trigger, key=key, state=Firing.State.STARTED, run=run,
                                   origin=origin, started_at=now(), fired_by=_person(actor))
    return FireOutcome("started", run=run, firing=firing)


def _correlated(trigger: Trigger, *, key: str, correlated: str, payload: dict, origin: dict,
                actor: Actor) -> FireOutcome | None:
    """Deliver the event as a signal to the run of the trigger's workflow whose wait step waits
    with correlation key `correlated`, once per event key (the firing's and the signal's).
    None when no step waits with it and the trigger starts a run then (`uncorrelated: start`).
    Raises Forbidden when a person may not signal runs in the trigger's team."""
    who = label(actor)
    waiting = correlated_step(workflow_id=trigger.workflow_id, key=correlated)
    if waiting is None:
        if trigger.uncorrelated == Uncorrelated.START:
            return None
        return refusal(trigger, key=key, reason="uncorrelated", actor=who, origin=origin, problems=[
            {"path": "correlate", "message": f"no run of workflow '{trigger.workflow.name}' "
             f"waits with correlation key '{correlated}'"}])
    if not isinstance(actor, System):
        require(actor, Action.RUN_SIGNAL, team=trigger.team)
    run = lock_run(waiting.run_id)
    try:
        signal_deliver(run, name=spec_of(run, waiting.name)["signal"], payload=payload,
                       key=f"trigger:{trigger.id}:{key}", actor=actor,
                       origin={**_origin(trigger, key, origin), "correlation_key": correlated})
    except (InputInvalid, NotAllowed, IdempotencyConflict) as refused:
        return refusal(trigger, key=key, reason="signal_refused", actor=who, origin=origin,
                       problems=refused.problems, status="invalid")
    firing = Firing.objects.create(trigger=trigger, key=key, state=Firing.State.SIGNALLED,
                                   signalled_run=run, origin={**origin, "correlation_key": correlated},
                                   fired_by=_person(actor))
    trigger_audit(trigger, action="trigger.signalled", actor=who, outcome="signalled",
                  payload={"key": key, "run": str(run.id), "correlation_key": correlated})
    return FireOutcome("signalled", run=run, firing=firing)


def _debounce(trigger: Trigger, *, key: str, context: dict, run_input: dict, origin: dict,
              actor: Actor) -> FireOutcome:
    """Hold the event until its group has been quiet for `debounce_s`, in place of the group's
    event held so far (which, and every event it had replaced, is coalesced into this one)."""
    try:
        group = correlation_key(trigger.debounce_key, context, path="debounce_key") or ""
    except MappingFailed as failed:
        return refusal(trigger, key=key, reason=failed.reason_class, problems=failed.problems,
                       actor=label(actor), origin=origin, status="invalid")
    at = now()
    replaced = Firing.objects.filter(trigger=trigger, group=group, state=Firing.State.DEBOUNCING).first()
    since = replaced.held_since if replaced else at
    bound = timedelta(seconds=trigger.debounce_max_s or 10 * trigger.debounce_s)
    due = min(at + timedelta(seconds=trigger.debounce_s), since + bound)
    if replaced is not None:
        replaced.state, replaced.input, replaced.due_at = Firing.State.COALESCED, None, None
        replaced.save(update_fields=["state", "input", "due_at"])
    firing = Firing.objects.create(trigger=trigger, key=key, state=Firing.State.DEBOUNCING,
                                   input=run_input, origin=origin, fired_by=_person(actor),
                                   group=group, held_since=since, due_at=due)
    if replaced is not None:
        Firing.objects.filter(Q(pk=replaced.pk) | Q(coalesced_into=replaced)).update(coalesced_into=firing)
    return FireOutcome("debounced", firing=firing, reason="debounce")


def debounced_firings_release() -> int:
    """Let go each held event whose group has been quiet for its trigger's window (or held for
    its `debounce_max_s`): it becomes a queued firing, started as admission allows. Under its
    trigger's lock, so a newer event never coalesces one already let go."""
    released = 0
    due = Firing.objects.filter(state=Firing.State.DEBOUNCING, due_at__lte=now())
    for trigger_id in list(due.values_list("trigger_id", flat=True).distinct()):
        with transaction.atomic():
            trigger = trigger_lock(trigger_id)
            for firing in due.filter(trigger=trigger).annotate(replaced=Count("coalesced")):
                firing.state = Firing.State.QUEUED
                firing.save(update_fields=["state"])
                # One entry per burst, not per event: a flood of events is not a flood of entries.
                trigger_audit(trigger, action="trigger.debounced", actor=label(SYSTEM_DEBOUNCE),
                              outcome="released", payload={
                                  "key": firing.key, "group": firing.group, "coalesced": firing.replaced,
                                  "held_since": firing.held_since.isoformat()})
                released += 1
    return released


def _person(actor: Actor):
    return None if isinstance(actor, System) else actor


def queued_firings_admit() -> int:
    """Start held firings, oldest first per trigger, as each trigger's rate and its team's
    cap allow. Returns how many started. Called by beat (`triggers.tasks.admit_queued`).

    A firing is started for the person who fired it (an api trigger) only if that person may
    still start runs in the team; otherwise, like a firing whose input the workflow no longer
    accepts, it is refused: kept in state `refused` with the reason, and audited."""
    debounced_firings_release()
    started = 0
    trigger_ids = (Firing.objects.filter(state=Firing.State.QUEUED)
                   .values_list("trigger_id", flat=True).distinct())
    for trigger_id in list(trigger_ids):
        for _ in range(ADMIT_BATCH):
            result = _admit_one(trigger_id)
            if result is None:
                break
            started += result
    return started


def _admit_one(trigger_id) -> int | None:
    """Start the oldest held firing of one trigger: 1 started, 0 dropped, None: stop here."""
    with transaction.atomic():
        trigger = trigger_lock(trigger_id)
        firing = (Firing.objects.filter(trigger=trigger, state=Firing.State.QUEUED)
                  .select_related("fired_by").order_by("created_at", "id").first())
        if firing is None or not trigger.enabled or _limit(trigger):
            return None
        actor = firing.fired_by or trigger_actor(trigger)
        try:
            if trigger.kind == TriggerKind.API and firing.fired_by is None:
                raise Forbidden("the person who fired it no longer exists")
            if not may(actor, Action.RUN_START, team=trigger.team):
                raise Forbidden(f"{label(actor)} may no longer start runs in team "
                                f"'{trigger.team.slug}' (docs/permissions.md)")
            run = _start(trigger, key=firing.key, run_input=firing.input, origin=firing.origin,
                         actor=actor)
        except BudgetExceeded:
            return None  # held until the team's budget lets it start (its period, a run ending)
        except (InputInvalid, Forbidden, NotAllowed) as error:
            # The workflow, or the person's place in the team, changed while it waited.
            _refuse_held(trigger, firing, error, actor=label(actor))
            return 0
        firing.state, firing.run, firing.started_at, firing.input = (
            Firing.State.STARTED, run, now(), None)
        firing.save(update_fields=["state", "run", "started_at", "input"])
    return 1


def _refuse_held(trigger: Trigger, firing: Firing, error: Exception, *, actor: str) -> None:
    problems = error.problems
    firing.state, firing.input = Firing.State.REFUSED, None
    firing.reason, firing.problems = "refused_at_admission", problems
    firing.save(update_fields=["state", "input", "reason", "problems"])
    refusal(trigger, key=firing.key, reason="refused_at_admission", actor=actor,
            origin=firing.origin, problems=problems)


def trigger_fire_api(*, trigger_id, payload: object, key: str, actor: Actor) -> FireOutcome:
    """A person (or program, with its token) fires a programmatic trigger with `payload`.

    `key` is the caller's idempotency key (a random one when the caller gave none). Raises
    Forbidden without run.start in the trigger's team, NotAllowed for another kind of trigger.
    """
    with transaction.atomic():
        trigger = trigger_lock(trigger_id)
        require(actor, Action.RUN_START, team=trigger.team)
        if trigger.kind != TriggerKind.API:
            raise NotAllowed(f"trigger '{trigger.name}' is a {trigger.kind} trigger; only an api "
                             "trigger is fired through the API")
        return fire(trigger, key=f"request:{key}", context={"payload": payload},
                    origin={"request": key, "by": label(actor)}, actor=actor)
