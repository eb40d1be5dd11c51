"""What the kinds a worker runs share: agent, tool and router steps (each kind registers its
`WorkerStep` in a module of its own: `agent`, `tool`, `router`).

A step's life: queued by the scheduler (`start`), claimed by a worker under a lease
(`step_claim`, or at once by the worker whose step started it: `Carry`), executed outside any
transaction under a heartbeat (`step_execute`), then
succeeded or failed (`step_succeed`, `step_fail`) — a failure retried under the step's policy
(`step_retry_due`) or ending it, dead-lettered. The reaper times out a running step
(`time_out`), recovers one whose lease expired (`step_lease_expired`) and re-sends one whose
message was lost (`step_redispatch`); an operator puts a failed one back on its queue
(`step_requeue`).

Any message may be a replay: each service re-reads the step, and does nothing when the step is
no longer in the state the message assumed. Each finishes through `step_ended` in the same
transaction, so the next steps are dispatched with no extra broker hop.
"""
import json
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django_fsm import ConcurrentTransition

from approvals.binding import guarded_step_clearance
from budgets.services import budget_release, budget_settle, cost_of
from orchestrator.models import Event, Run, StepAttempt, StepRun
from orchestrator.operations import metrics, tracing
from orchestrator.operations.logcontext import bound
from orchestrator.store import build_row, held_writes, insert_rows, save_row, update_rows

from ... import limits
from ...attestation import attestation_digest
from ...authz import REAPER, Actor, label, worker_actor
from ...clock import now
from ...dispatch import (
    BROKER_DELAY_LIMIT_S,
    queue_for,
    retry_due_on_commit,
    step_dispatch_on_commit,
)
from ...errors import BudgetExceeded, NotAllowed
from ...events import event_record
from ...executors import ATTEMPT_META_FIELDS, ExecContext, execute
from ...keys import idempotency_key_for
from ...leases import heartbeat, lease_until
from ...quotas import Reservation, quota_of
from ...retry import StepError, retry_at
from ...secret_inputs import revealed_from, sealed_of
from ...selectors import (
    definition_of,
    effect_key_of,
    lock_run_of_step,
    lock_run_with_steps,
    runs_with_version,
    spec_of,
    step_to_claim,
)
from ...states import (
    RUN_ADVANCING,
    STEP_RECOVERABLE,
    STOPPED_BY_RUN_END,
    RunState,
    StepKind,
    StepState,
)
from ..attestations import Trace, key_registered
from ..budget_gate import dispatch_reserve, run_pause_for_budget
from ..deadletters import dead_letter_open
from ..quotas import quota_dependency_of, step_quota_release, step_quota_reserve
from ..results_cache import Reuse, result_keep, result_lookup
from ..step_concurrency import step_concurrency_admit, step_concurrency_of
from ..step_end import may_hold_reservations, step_ended
from . import Eager, Record, StepKindHandler, handler_for


@dataclass(frozen=True)
class Usage:
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: Decimal = Decimal("0")
    model: str = ""
    provider: str = ""
    # What produced the output (executors.ATTEMPT_META_FIELDS), persisted on the attempt.
    meta: dict = field(default_factory=dict)

    @classmethod
    def of(cls, result) -> "Usage":
        """The usage of an executor Result (None: nothing was spent)."""
        if result is None:
            return cls()
        return cls(result.tokens_in, result.tokens_out, result.cost_usd, result.model,
                   result.provider, result.meta)


@dataclass(frozen=True)
class Claim:
    step_id: int
    attempt: int
    run_id: object
    workflow: str
    spec: dict
    step_input: dict
    idempotency_key: str
    # Parameters reviewers changed at the step's approval gate (approvals.binding).
    params_override: dict = field(default_factory=dict)
    team: str = ""
    queue: str = ""
    # The run's secret inputs, still sealed (read with the claim; None: it has none).
    sealed_secrets: str | None = None
    # The run's sandbox (None: a live run): what answers its side-effecting calls.
    sandbox: dict | None = None


class WorkerStep(StepKindHandler):
    def start(self, run: Run, step: StepRun, spec: dict, record: Record) -> None:
        self.start_offered(run, step, spec, record, None)

    def start_offered(self, run: Run, step: StepRun, spec: dict, record: Record,
                      eager: Eager | None) -> "Claim | None":
        """Queue the step; claim it for the worker offering to take it (`Carry`), which runs it
        next with no message, or send its message after commit."""
        queue = queue_for(spec, capacity=run.capacity)
        step.enqueue(queue=queue)
        record(step, "step.queued", {"queue": queue})
        carried = _carried(run, step, spec, record, eager) if isinstance(eager, Carry) else None
        if carried is None:
            step_dispatch_on_commit(step.id, queue, run_id=step.run_id, step_name=step.name)
        return carried

    def time_out(self, *, step_id: int, reason: str) -> bool:
        """A running step past its timeout: timed_out, or retried if its policy allows."""
        with transaction.atomic():
            run, step = lock_run_of_step(step_id)
            if step.state != StepState.RUNNING:
                return False
            StepAttempt.objects.filter(step=step, number=step.attempts, finished_at=None).update(
                finished_at=now(), outcome="timed_out", error_class="timeout", error_message=reason)
            _fail_or_retry(run, step, StepError("timeout", reason), actor=REAPER)
        return True

    def stop(self, run: Run, step: StepRun, *, reason: str, hold: bool, actor: Actor) -> bool:
        return step_stop(run, step, reason=reason, hold=hold, actor=actor)

    # release: nothing to do; a running attempt stops at its next safe point (the effect
    # ledger refuses to start an effect for a run that is no longer live).

    def call_hooks(self, claim: "Claim", *, scrub: Callable[[object], object]) -> dict:
        """What this kind's executor is handed in its `ExecContext` beyond what every worker
        kind gets: the services it calls back during its call (`tool.ToolStep`: the effect
        ledger; `agent.AgentStep`: a repair turn's reservation and each call's settlement)."""
        return {}


# --- on a worker ----------------------------------------------------------------------------


def step_execute(*, step_id: int, worker: str, carry: "Carry | None" = None) -> float:
    """Run a queued step to its outcome: throttle, claim, guard, execute, commit.

    Returns seconds to wait and retry the message when the step's dependency is over its
    shared rate limit (the step stays queued), else 0. The executor's side effect runs outside
    any transaction, under a lease kept alive by a heartbeat. With a `carry`, the next step the
    success starts may be claimed in the same transaction and run here, and so on, within the
    carry's bounds.
    """
    if settings.STEPWISE_RATE_LIMITS:
        wait = limits.rate_limit_wait(limits.dependency_of(step_spec(step_id=step_id)))
        if wait:
            return wait
    reservation = None
    if settings.STEPWISE_QUOTAS:
        # Its share of a provider quota first: a step that would overrun it stays queued.
        reserved = step_quota_reserve(step_id=step_id)
        if isinstance(reserved, float):
            return reserved
        reservation = reserved
    claim = step_claim(step_id=step_id, worker=worker)
    if claim is None:
        step_quota_release(reservation, tokens_used=0)
    if carry:
        carry.worker = worker
    if carry and claim:
        carry.secrets = (claim.run_id, claim.sealed_secrets)
    while claim is not None:
        # The step's log lines name the attempt too (orchestrator.operations.logcontext).
        with bound(run_id=claim.run_id, step=claim.spec["name"], attempt=claim.attempt,
                   workflow=claim.workflow, team=claim.team), \
                tracing.span("step.execute", run=claim.run_id, step=claim.spec["name"],
                             attempt=claim.attempt, workflow=claim.workflow):
            claim = _execute_claimed(claim.step_id, claim, worker, carry, reservation)
        reservation = None  # a carried step calls nothing under a quota (`_carried`)
    return 0


@dataclass
class Carry:
    """Eager dispatch: what a worker may keep for itself of the steps its successes start.

    A step the success of one of this message's steps starts is claimed in that success's own
    transaction and run next by this worker, with no message and no claim transaction, when
    it is on the queue the message came from (so this worker serves it), no shared rate limit
    applies to it, its gates' approvals hold, fewer than `steps` steps were carried so far and
    the message has run for less than its time (until `until`, monotonic). Only one step per
    success is carried: the scheduler offers the carry each step it starts until one is taken
    and returns that one (`run_advance`), which `step_succeed` hands to the carry. The others
    are dispatched as usual, for the other workers. Beyond the bounds steps go through the
    broker again, behind the other runs' work: a worker never holds a run for long, and a warm
    shutdown waits for at most one more step.
    """
    queue: str
    steps: int
    until: float
    # The worker this message runs on (`step_execute`): a carried step is claimed for it.
    worker: str = ""
    taken: Claim | None = None
    # The sealed secrets of the run whose claim began this message ((run id, sealed)): a step
    # carried for the same run is handed them without reading them again.
    secrets: tuple | None = None
    # Dependencies whose breaker this message found closed with nothing counted, and whose
    # call then succeeded: its next carried steps that call them do not read the breaker
    # again (at most `until` after the reading; a failure ends the carry).
    clean: set[str] = field(default_factory=set)

    @classmethod
    def for_message(cls, queue: str | None) -> "Carry | None":
        """The carry of a message delivered from `queue` (None: it carries nothing)."""
        if not queue or settings.STEPWISE_CARRY_STEPS <= 0:
            return None
        return cls(queue, settings.STEPWISE_CARRY_STEPS,
                   time.monotonic() + settings.STEPWISE_CARRY_S)

    def takes(self, queue: str) -> bool:
        return (self.taken is None and self.steps > 0 and queue == self.queue
                and time.monotonic() < self.until)

    def sealed_for(self, run: Run) -> str | None:
        if self.secrets is not None and self.secrets[0] == run.id:
            return self.secrets[1]
        return sealed_of(run)  # another run's step (a child run started by this one)

    def take(self) -> Claim | None:
        """The step carried by the success that just committed, if any."""
        claim, self.taken = self.taken, None
        if claim is not None:
            self.steps -= 1
        return claim


def _carried(run: Run, step: StepRun, spec: dict, record: Record, carry: Carry) -> Claim | None:
    """Claim `step` (just queued) for the worker whose success started it, if its carry takes
    it (`Carry`): in this transaction, recorded with the run's other transitions. None if not."""
    if not carry.takes(step.queue):
        return None
    if settings.STEPWISE_RATE_LIMITS.get(limits.dependency_of(spec)):
        return None  # throttled across workers: its message takes a slot first
    if settings.STEPWISE_QUOTAS and quota_of(quota_dependency_of(spec)) is not None:
        return None  # under a quota: its message reserves its share first
    if step_concurrency_of(spec):
        return None  # its message takes its turn under its key (step_claim)
    clearance = guarded_step_clearance(run=run, step=step)
    if clearance.refusal:
        return None  # its message claims it, and refuses it (step_claim)
    claim = _claim_attempt(run, step, spec, worker=carry.worker,
                           params_override=clearance.params_override,
                           sealed=carry.sealed_for(run))
    record(step, "step.running", {"attempt": step.attempts})
    return claim


def _execute_claimed(step_id: int, claim: Claim, worker: str, carry: Carry | None = None,
                     reservation: Reservation | None = None) -> Claim | None:
    """Execute a claimed step and commit its outcome; the step its success carried, if any.
    `reservation` (its quota's, `step_quota_reserve`) is settled to what the call used."""
    spent = [0]
    try:
        return _execute_call(step_id, claim, worker, carry, spent)
    finally:
        step_quota_release(reservation, tokens_used=spent[0])


def _execute_call(step_id: int, claim: Claim, worker: str, carry: Carry | None,
                  spent: list[int]) -> Claim | None:
    # The run's secret inputs, in memory for this call only; whatever comes back is scrubbed
    # of them before it is stored (secret_inputs).
    secrets = revealed_from(claim.sealed_secrets)
    trace = Trace(claim)
    ctx = ExecContext(str(claim.run_id), claim.workflow, claim.spec["name"], claim.attempt,
                      claim.idempotency_key, step_id=step_id,
                      params_override=claim.params_override, scrub=secrets.scrub,
                      fencing_token=claim.attempt, sandbox=claim.sandbox,
                      authorize=trace.authorize, responded=trace.responded, price=cost_of,
                      team=claim.team,
                      **handler_for(claim.spec["type"]).call_hooks(claim, scrub=secrets.scrub))
    dependency = limits.dependency_of(claim.spec)
    try:
        # Looked up here, once the step is claimed, not at dispatch: the scheduler plans from
        # the run's rows alone, and a hit ends the attempt like a call would (its budget
        # reservation settled at zero, its output committed by step_succeed).
        reuse = result_lookup(claim.spec, claim.step_input, team=claim.team,
                              sandbox=claim.sandbox, sealed=claim.sealed_secrets)
        if reuse is not None and reuse.hit is not None:
            step_succeed(step_id=step_id, attempt=claim.attempt, output=reuse.hit.output,
                         usage=Usage(meta={"reused_from": reuse.source}), worker=worker,
                         carry=carry, reuse=reuse, trace=trace)
            return carry.take() if carry else None
        breaker = (limits.BreakerReading() if carry and dependency in carry.clean
                   else limits.breaker_read(dependency))
        if breaker.open_for:
            # A failing dependency is not called; the step retries under its policy.
            raise StepError("transient", f"circuit open for {dependency}",
                            retry_after_s=breaker.open_for)
        with (_lease_kept(step_id=step_id, attempt=claim.attempt),
              metrics.EXECUTING.labels(claim.spec["type"], claim.queue).track_inprogress()):
            started = time.monotonic()
            try:
                with tracing.span(f"{claim.spec['type']}.call", target=_target(claim.spec)):
                    result = execute(claim.spec, secrets.reveal(claim.step_input), ctx)
            except StepError as error:
                used = getattr(error, "spent", None)
                spent[0] = (used.tokens_in + used.tokens_out) if used is not None else 0
                _observe_duration(claim, started, outcome="failed")
                limits.breaker_record(dependency, error_class=error.error_class)
                raise
            spent[0] = result.tokens_in + result.tokens_out
            _observe_duration(claim, started, outcome="succeeded")
            limits.breaker_record(dependency, error_class=None, reading=breaker)
            if carry and breaker.clean:
                carry.clean.add(dependency)
    except StepError as error:
        # A failed attempt may still have spent tokens (model calls, repairs): charge them.
        error.message = secrets.scrub(error.message)
        step_fail(step_id=step_id, attempt=claim.attempt, error=error,
                  usage=Usage.of(getattr(error, "spent", None)), worker=worker)
        return None
    step_succeed(step_id=step_id, attempt=claim.attempt, output=secrets.scrub(result.output),
                 usage=Usage.of(result), worker=worker, carry=carry, reuse=reuse, trace=trace)
    return carry.take() if carry else None


def _observe_duration(claim: Claim, started: float, *, outcome: str) -> None:
    metrics.STEP_DURATION.labels(claim.spec["type"], claim.queue, outcome).observe(
        time.monotonic() - started)


def _target(spec: dict) -> str:
    """What a step calls: its model or its tool."""
    return spec.get("model") or spec.get("tool") or spec["type"]


@contextmanager
def _lease_kept(*, step_id: int, attempt: int):
    with heartbeat(lambda: lease_extend(step_id=step_id, attempt=attempt), name=f"lease-{step_id}"):
        yield


def step_claim(*, step_id: int, worker: str) -> Claim | None:
    """Move a queued step to running under a lease; None if this delivery is stale, or if the
    step's approval no longer holds (then the step has been failed, its action not run)."""
    try:
        with transaction.atomic():
            step = step_to_claim(step_id)
            run = step.run
            if step.state != StepState.QUEUED:
                return None  # a replay of work already claimed or finished
            if run.state not in RUN_ADVANCING:
                return None  # cancelling/paused/ended: the step is cancelled or will be swept
            spec = spec_of(run, step.name)
            # Right before a gated action runs: its approval, hash and approvers, again.
            clearance = guarded_step_clearance(run=run, step=step)
            if clearance.refusal:
                refusal = clearance.refusal
                raise _Refused
            if step_concurrency_of(spec) and step_concurrency_admit(run, step, spec):
                return None  # it waits its turn; a step of its key ending sends it again
            with held_writes("step_claim"):  # the step and the attempt go with the event's INSERT
                claim = _claim_attempt(run, step, spec, worker=worker,
                                       params_override=clearance.params_override,
                                       sealed=sealed_of(run), save=True)
                event_record(run=run, step=step, kind="step.running", actor=f"worker:{worker}",
                             payload={"attempt": step.attempts})
    except (StepRun.DoesNotExist, ConcurrentTransition):
        return None
    except _Refused:
        step_refuse(step_id=step_id, error=StepError("policy", refusal), worker=worker)
        return None
    return claim


def _claim_attempt(run: Run, step: StepRun, spec: dict, *, worker: str, params_override: dict,
                   sealed: str | None, save: bool = False) -> Claim:
    """Claim queued `step` (its input loaded) for `worker` under a lease and open its attempt
    (the caller records `step.running`, and saves the step unless `save`): what the worker
    needs to run it."""
    step.claim(worker=worker, timeout_s=spec["timeout_s"], lease_s=settings.STEPWISE_LEASE_S)
    waited = bool(step.waiting_for)
    step.waiting_for = ""  # it waits no longer
    if save:
        # Before the attempt's INSERT: a claim of the same step from another delivery waits on
        # this row and then finds it no longer queued (ConcurrentTransition, a stale delivery),
        # instead of colliding with this attempt's number. What the claim changed only: the
        # input (every upstream output) is not written back.
        save_row(step, CLAIMED_FIELDS + (("waiting_for",) if waited else ())
                 + (("concurrency_key",) if step.concurrency_key else ()))
    key = idempotency_key_for(run.id, step.name) if run.forked_from_id is None \
        else effect_key_of(run, step.name)
    insert_rows([build_row(StepAttempt, step=step, number=step.attempts, worker=worker,
                           started_at=step.started_at, idempotency_key=key)], keys=False)
    if step.queued_at:
        latency = (step.started_at - step.queued_at).total_seconds()
        metrics.SCHEDULING_LATENCY.labels(step.queue).observe(max(latency, 0))
    return Claim(step.id, step.attempts, run.id, run.version.workflow.name, spec,
                 step.input or {}, key, params_override, run.team.slug, step.queue, sealed,
                 run.sandbox)


# The columns `StepRun.claim` sets.
CLAIMED_FIELDS = ("state", "attempts", "lease_owner", "started_at", "deadline_at", "lease_expires_at")


class _Refused(Exception):
    """Leaves the claim's transaction, unchanged, when the step may not run."""


def step_refuse(*, step_id: int, error: StepError, worker: str) -> bool:
    """Fail a queued step that may not run (its approval no longer holds): dead-lettered, and
    the run goes on under its on_error policy. False if the step is no longer queued."""
    with transaction.atomic():
        run, step = lock_run_of_step(step_id)
        if step.state != StepState.QUEUED:
            return False
        _fail_or_retry(run, step, error, actor=worker_actor(worker))
    return True


def step_spec(*, step_id: int) -> dict:
    """The definition of a step (a read, for decisions taken before claiming it)."""
    # `state` too: django-fsm's ConcurrentTransitionMixin reads it as the row loads, and a
    # deferred field would cost a SELECT of its own.
    step = StepRun.objects.only("name", "run_id", "state").get(id=step_id)
    return spec_of(runs_with_version().get(id=step.run_id), step.name)


def fenced(step: StepRun, attempt: int) -> bool:
    """Fencing: whether `attempt` (its token) still holds `step`'s claim. Every write that
    finishes an attempt (result, failure, retry, cost, advancing the run) asks this under the
    run's lock; a worker resumed after its lease expired and another attempt claimed the step
    holds an old token and writes nothing."""
    return step.state == StepState.RUNNING and step.attempts == attempt


def claim_holds(*, step_id: int, attempt: int) -> bool:
    """`fenced`, for the effect ledger: read under a row lock inside its transaction."""
    step = StepRun.objects.select_for_update().only("state", "attempts").filter(id=step_id).first()
    return step is not None and fenced(step, attempt)


def _charge(run: Run, step: StepRun, usage: Usage) -> None:
    if not (usage.tokens_in or usage.tokens_out or usage.cost_usd):
        return  # a tool step spends nothing: spare the run row an UPDATE
    metrics.observe_usage(model=usage.model, tokens_in=usage.tokens_in,
                          tokens_out=usage.tokens_out, cost_usd=usage.cost_usd)
    step.tokens_in += usage.tokens_in
    step.tokens_out += usage.tokens_out
    step.cost_usd += usage.cost_usd
    run.tokens_in += usage.tokens_in
    run.tokens_out += usage.tokens_out
    run.cost_usd += usage.cost_usd
    save_row(run, ["tokens_in", "tokens_out", "cost_usd"])


def _close_attempt(run: Run, step: StepRun, attempt: int, *, outcome: str, usage: Usage,
                   error: StepError | None = None, attestation: dict | None = None) -> None:
    update_rows(StepAttempt, count=False, where={"step": step, "number": attempt}, values={
        **({"attestation": attestation} if attestation is not None else {}),
        "finished_at": now(), "outcome": outcome, "tokens_in": usage.tokens_in,
        "tokens_out": usage.tokens_out, "cost_usd": usage.cost_usd, "model": usage.model,
        "provider": usage.provider, "error_class": error.error_class if error else "",
        "error_message": error.message if error else "",
        **{k: v for k, v in usage.meta.items() if k in ATTEMPT_META_FIELDS},
    })
    if may_hold_reservations(run, step):
        budget_settle(step_id=step.id, attempt=attempt, actual=usage.cost_usd)


def _routes_tried(attempt: int, usage: Usage) -> dict | None:
    """The payload of `step.routes`, recorded when a model call of the attempt went past a
    route (failed or skipped): every route tried, in order. None when each call's first route
    answered: the attempt row says that much."""
    routes = usage.meta.get("routes") or []
    if all(entry["outcome"] == "answered" for entry in routes):
        return None
    return {"attempt": attempt, "routes": routes}


def step_succeed(*, step_id: int, attempt: int, output, usage: Usage, worker: str,
                 carry: Carry | None = None, reuse: Reuse | None = None,
                 trace: Trace | None = None) -> bool:
    """Commit a step's output and move the run forward. False if the attempt is stale.

    With a `carry`, a next step it takes is claimed in this transaction and handed to it
    (`Carry.taken`) once committed. With a `reuse` (results_cache), the output is a hit's,
    recorded as `step.cache_hit`, or a miss's, kept for reuse. The output is stored with the
    attestation this process signs of the attempt, of what its `trace` saw it do
    (engine/attestation.py).
    """
    # As a read of the saved row would give it (JSON: lists, string keys), since the plan reads
    # it from the step's instance; signed here, before the run's lock is taken.
    output = json.loads(json.dumps(output))
    attestation = (trace or Trace(None)).record(step_id=step_id, attempt=attempt, worker=worker,
                                                output=output, usage=usage)
    with transaction.atomic():
        # The key that signed it is registered with the output, in this transaction: a
        # process's first step opens no transaction of its own for it.
        key_registered()
        # The run's steps are read once, here: the scheduler plans from them (step_ended).
        run, step, steps = lock_run_with_steps(step_id)
        if not fenced(step, attempt):
            _close_attempt(run, step, attempt, outcome="stale", usage=usage)
            return False
        routes = _routes_tried(attempt, usage)
        pending = [build_row(Event, run=run, step=step, kind="step.routes", actor=f"worker:{worker}",
                             payload=routes)] if routes else []
        if reuse is not None and reuse.hit is None:
            result_keep(run=run, step=step, reuse=reuse, output=output)
        elif reuse is not None:
            pending.append(build_row(Event, run=run, step=step, kind="step.cache_hit",
                                     actor=f"worker:{worker}",
                                     payload={"attempt": attempt, "fingerprint": reuse.fingerprint,
                                              "from_run": reuse.source["run"],
                                              "from_step": reuse.source["step"]}))
        # Its writes up to the events' INSERT (the step, its attempt, the next step's claim)
        # go to the database in one round trip; the ledger's entries at the block's end.
        with held_writes("step_succeed"):
            step.complete(output=output)
            step.attestation = attestation
            _charge(run, step, usage)
            save_row(step, COMPLETED_FIELDS)
            _close_attempt(run, step, attempt, outcome="succeeded", usage=usage,
                           attestation=attestation)
            # Written with the run's next transitions, in one INSERT (step_ended, run_advance);
            # its ledger entry chains the attestation's hash.
            completed = build_row(Event, run=run, step=step, kind="step.completed",
                                  actor=f"worker:{worker}",
                                  payload={"attempt": attempt, "tokens_in": usage.tokens_in,
                                           "tokens_out": usage.tokens_out, "cost_usd": str(usage.cost_usd),
                                           "attestation": attestation_digest(attestation)})
            carried = step_ended(run, step, actor=worker_actor(worker), pending=[*pending, completed],
                                 steps=steps, eager=carry)
    if carried is not None:
        carry.taken = carried
    return True


# The columns `StepRun.complete` and `_charge` set: the input (every upstream output) is not
# written back.
COMPLETED_FIELDS = ("state", "output", "error", "finished_at", "lease_owner", "lease_expires_at",
                    "tokens_in", "tokens_out", "cost_usd", "attestation")


def step_fail(*, step_id: int, attempt: int, error: StepError, usage: Usage, worker: str) -> bool:
    """Record a failed attempt; retry under the step's policy or fail it. False if stale."""
    with transaction.atomic():
        run, step = lock_run_of_step(step_id)
        if not fenced(step, attempt):
            _close_attempt(run, step, attempt, outcome="stale", usage=usage, error=error)
            return False
        _charge(run, step, usage)
        _close_attempt(run, step, attempt, outcome="failed", usage=usage, error=error)
        routes = _routes_tried(attempt, usage)
        if routes:
            event_record(run=run, step=step, kind="step.routes", actor=f"worker:{worker}",
                         payload=routes)
        _fail_or_retry(run, step, error, actor=worker_actor(worker))
    return True


def _fail_or_retry(run: Run, step: StepRun, error: StepError, *, actor: Actor) -> None:
    who = label(actor)
    budget_release(step_id=step.id)  # an attempt lost, timed out or refused: its cost is unknown
    if error.error_class == "budget":
        _hold(run, step, error, actor=actor)
        return
    policy = spec_of(run, step.name)["retry"]
    when = retry_at(policy, attempts=step.attempts, error=error, at=now())
    if when is not None and run.state in RUN_ADVANCING:
        step.schedule_retry(error=error.as_dict(), at=when)
        step.save()
        event_record(run=run, step=step, kind="step.retrying", actor=who,
                     payload={**error.as_dict(), "attempt": step.attempts, "at": when.isoformat()})
        delay = (when - now()).total_seconds()
        if delay <= BROKER_DELAY_LIMIT_S:
            retry_due_on_commit(step.id, max(delay, 0), run_id=step.run_id,
                                    step_name=step.name)
        return
    if error.error_class == "cancelled":
        # A running step stopped because its run had ended is recorded like the steps that end
        # cancelled, so a retry of the run reopens it with them (its message is in the event).
        step.cancel(reason=STOPPED_BY_RUN_END.get(run.state, error.message))
        step.save()
        event_record(run=run, step=step, kind="step.cancelled", actor=who, payload=error.as_dict())
        step_ended(run, step, actor=actor)
        return
    if error.error_class == "timeout":
        step.time_out(error=error.as_dict())
    else:
        step.fail(error={**error.as_dict(), "attempts": step.attempts})
    step.save()
    event_record(run=run, step=step, kind=f"step.{step.state}", actor=who, payload=step.error)
    dead_letter_open(run=run, step=step, error=error, actor=actor)
    step_ended(run, step, actor=actor)


def _hold(run: Run, step: StepRun, error: StepError, *, actor: Actor) -> None:
    """The attempt was stopped for the run's budget (a repair turn refused, the run past its
    duration): not a failure of the step, so no retry is spent on it. The step waits as
    `retrying`, due at once: the run is paused, and once resumed the reaper queues a new
    attempt, which reserves again (`step_retry_due`)."""
    step.schedule_retry(error=error.as_dict(), at=now())
    step.save()
    event_record(run=run, step=step, kind="step.retrying", actor=label(actor),
                 payload={**error.as_dict(), "attempt": step.attempts, "held": True})


def step_stop(run: Run, step: StepRun, *, reason: str, hold: bool, actor: Actor) -> bool:
    """Stop a running agent, tool or router step from outside its worker (the run is past its
    duration): its attempt ends `stopped`, what it reserved is released, and the step is held
    to run again once the run resumes (`hold`) or cancelled. Caller's transaction, run locked.
    The worker's late result is then stale (fencing) and its effects are refused. False if the
    step is not running."""
    if step.state != StepState.RUNNING or step.kind not in (StepKind.AGENT, StepKind.TOOL, StepKind.ROUTER):
        return False
    error = StepError("budget", reason)
    StepAttempt.objects.filter(step=step, number=step.attempts, finished_at=None).update(
        finished_at=now(), outcome="stopped", error_class=error.error_class, error_message=reason)
    budget_release(step_id=step.id)
    if hold:
        _hold(run, step, error, actor=actor)
        return True
    step.cancel(reason=reason)
    step.save()
    event_record(run=run, step=step, kind="step.cancelled", actor=label(actor), payload=error.as_dict())
    return True


def step_retry_due(*, step_id: int) -> bool:
    """Queue a retrying step whose delay has elapsed. False if not (yet) due or not retrying."""
    with transaction.atomic():
        run, step = lock_run_of_step(step_id)
        if step.state != StepState.RETRYING or (step.next_attempt_at and step.next_attempt_at > now()):
            return False
        if run.state not in RUN_ADVANCING:
            return False
        definition, graph = definition_of(run)
        denial = dispatch_reserve(run, step, graph.steps[step.name], definition, attempt=step.attempts + 1)
        if denial:  # it stays retrying; once the run resumes, the reaper finds it due again
            run_pause_for_budget(run, denial)
            return False
        step.enqueue(queue=step.queue)
        step.save()
        event_record(run=run, step=step, kind="step.queued", payload={"retry": True})
        step_dispatch_on_commit(step.id, step.queue, run_id=step.run_id, step_name=step.name)
    return True


def step_lease_expired(*, step_id: int) -> bool:
    """A running step whose worker stopped renewing its claim: the attempt is lost."""
    with transaction.atomic():
        run, step = lock_run_of_step(step_id)
        if step.state != StepState.RUNNING or not step.lease_expires_at or step.lease_expires_at > now():
            return False
        StepAttempt.objects.filter(step=step, number=step.attempts, finished_at=None).update(
            finished_at=now(), outcome="lost", error_class="lost",
            error_message=f"lease held by {step.lease_owner} expired")
        _fail_or_retry(run, step, StepError("lost", "worker lease expired"), actor=REAPER)
    return True


def step_redispatch(*, step_id: int) -> bool:
    """Send a queued step's message again (the first one was lost). Claims stay exclusive."""
    step = StepRun.objects.filter(id=step_id, state=StepState.QUEUED).first()
    if step is None:
        return False
    with transaction.atomic():
        step_dispatch_on_commit(step.id, step.queue, run_id=step.run_id, step_name=step.name)
        StepRun.objects.filter(id=step.id, state=StepState.QUEUED).update(queued_at=now())
    return True


def lease_extend(*, step_id: int, attempt: int) -> bool:
    """Heartbeat from the worker running `attempt`: push its lease forward.

    False when the step is no longer this attempt's (timed out, lost, cancelled).
    """
    return bool(StepRun.objects.filter(id=step_id, state=StepState.RUNNING, attempts=attempt)
                .update(lease_expires_at=lease_until()))


# --- an operator's second chance --------------------------------------------------------------


def step_requeue(run: Run, step: StepRun, *, actor: Actor, reason: str) -> None:
    """Put a failed step back on its queue and bring its run back to life (caller's txn, run
    locked). Raises NotAllowed for a step or run that cannot be run again."""
    who = label(actor)
    if step.kind not in (StepKind.AGENT, StepKind.TOOL, StepKind.ROUTER) or not step.queue:
        raise NotAllowed(f"a {step.kind} step cannot be run again; its run must be restarted")
    if step.state not in STEP_RECOVERABLE:
        raise NotAllowed(f"step '{step.name}' is {step.state}, not failed")
    if run.state in (RunState.FAILED, RunState.TIMED_OUT):
        run.reopen()
        for cancelled in run.steps.filter(state=StepState.CANCELLED,
                                          skip_reason__in=STOPPED_BY_RUN_END.values()):
            cancelled.reopen()
            cancelled.save()
            event_record(run=run, step=cancelled, kind="step.blocked", actor=who)
    elif run.state == RunState.PAUSED:
        run.resume()
    elif run.state not in RUN_ADVANCING:
        raise NotAllowed(f"run {run.id} is {run.state}; its steps cannot be redriven")
    definition, graph = definition_of(run)
    denial = dispatch_reserve(run, step, graph.steps[step.name], definition, attempt=step.attempts + 1)
    if denial:  # nothing changed: the operator raises the run's limit first
        raise BudgetExceeded(denial["message"], detail=denial)
    run.save()
    event_record(run=run, kind=f"run.{run.state}", actor=who, payload={"reason": reason})
    step.redrive(queue=step.queue)
    step.save()
    event_record(run=run, step=step, kind="step.queued", actor=who, payload={"reason": reason})
    step_dispatch_on_commit(step.id, step.queue, run_id=step.run_id, step_name=step.name)

