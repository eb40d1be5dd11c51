"""A step's life on a worker: claim, then succeed or fail (and maybe retry later).

Any message may be a replay: each service re-reads the step, and does nothing when the step is
no longer in the state the message assumed. Each finishes by advancing the run in the same
transaction, so the next steps are dispatched with no extra broker hop.
"""
from dataclasses import dataclass, field
from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django_fsm import ConcurrentTransition

from ..clock import now
from ..dispatch import retry_due_on_commit, step_dispatch_on_commit
from ..events import event_record
from ..executors import ATTEMPT_META_FIELDS
from ..leases import lease_until
from ..models import Run, RunState, StepAttempt, StepRun, StepState
from ..retry import StepError, retry_at
from .advance import run_advance
from .deadletters import dead_letter_open
from .runs import run_settle_cancel
from .versions import definition_of, runs_with_version

# A retry due sooner than this waits in the broker (countdown); later ones wait in the database.
BROKER_DELAY_LIMIT_S = 30


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


def idempotency_key_for(run: Run, step_name: str, action: str = "default") -> str:
    """Stable across attempts and redeliveries: (run, step, logical action), never random."""
    return f"{run.id}:{step_name}:{action}"


def step_claim(*, step_id: int, worker: str) -> Claim | None:
    """Move a queued step to running under a lease; None if this delivery is stale."""
    try:
        with transaction.atomic():
            step = StepRun.objects.select_related("run", "run__version__workflow").defer(
                "run__version__definition", "run__version__normalized").get(id=step_id)
            run = step.run
            if step.state != StepState.QUEUED:
                return None  # a replay of work already claimed or finished
            if run.state not in (RunState.RUNNING, RunState.WAITING):
                return None  # cancelling/paused/ended: the step is cancelled or will be swept
            _, graph = definition_of(run)
            spec = graph.steps[step.name]
            step.claim(worker=worker, timeout_s=spec["timeout_s"], lease_s=settings.STEPWISE_LEASE_S)
            step.save()
            key = idempotency_key_for(run, step.name)
            StepAttempt.objects.create(step=step, number=step.attempts, worker=worker,
                                       started_at=step.started_at, idempotency_key=key)
            event_record(run=run, step=step, kind="step.running", actor=f"worker:{worker}",
                         payload={"attempt": step.attempts})
    except (StepRun.DoesNotExist, ConcurrentTransition):
        return None
    return Claim(step.id, step.attempts, run.id, run.version.workflow.name, spec,
                 step.input or {}, key)


def step_spec(*, step_id: int) -> dict:
    """The definition of a step (a read, for decisions taken before claiming it)."""
    step = StepRun.objects.select_related("run").only("name", "run__version_id").get(id=step_id)
    run = runs_with_version().get(id=step.run_id)
    return definition_of(run)[1].steps[step.name]


def _locked_step(step_id: int) -> tuple[Run, StepRun]:
    """The step and its run, with the run row locked (the order every service locks in).

    The step's input (every upstream output it reads) is left unloaded: nothing here changes
    it, and a save then leaves it out of the UPDATE instead of writing it back whole.
    """
    run = runs_with_version().select_for_update(of=("self",), no_key=True).get(steps__id=step_id)
    return run, StepRun.objects.defer("input").get(id=step_id)


def _charge(run: Run, step: StepRun, usage: Usage) -> None:
    if not (usage.tokens_in or usage.tokens_out or usage.cost_usd):
        return  # a tool step spends nothing: spare the run row an UPDATE
    step.tokens_in += usage.tokens_in
    step.tokens_out += usage.tokens_out
    step.cost_usd += usage.cost_usd
    run.tokens_in += usage.tokens_in
    run.tokens_out += usage.tokens_out
    run.cost_usd += usage.cost_usd
    run.save(update_fields=["tokens_in", "tokens_out", "cost_usd"])


def _close_attempt(step: StepRun, attempt: int, *, outcome: str, usage: Usage,
                   error: StepError | None = None) -> None:
    StepAttempt.objects.filter(step=step, number=attempt).update(
        finished_at=now(), outcome=outcome, tokens_in=usage.tokens_in, tokens_out=usage.tokens_out,
        cost_usd=usage.cost_usd, model=usage.model, provider=usage.provider,
        error_class=error.error_class if error else "", error_message=error.message if error else "",
        **{k: v for k, v in usage.meta.items() if k in ATTEMPT_META_FIELDS},
    )


def step_succeed(*, step_id: int, attempt: int, output, usage: Usage, worker: str) -> bool:
    """Commit a step's output and move the run forward. False if the attempt is stale."""
    with transaction.atomic():
        run, step = _locked_step(step_id)
        if step.state != StepState.RUNNING or step.attempts != attempt:
            _close_attempt(step, attempt, outcome="stale", usage=usage)
            return False
        step.complete(output=output)
        _charge(run, step, usage)
        step.save()
        _close_attempt(step, attempt, outcome="succeeded", usage=usage)
        event_record(run=run, step=step, kind="step.completed", actor=f"worker:{worker}",
                     payload={"attempt": attempt, "tokens_in": usage.tokens_in,
                              "tokens_out": usage.tokens_out, "cost_usd": str(usage.cost_usd)})
        _after_step_ended(run)
    return True


def step_fail(*, step_id: int, attempt: int, error: StepError, usage: Usage, worker: str) -> bool:
    """Record a failed attempt; retry under the step's policy or fail it. False if stale."""
    with transaction.atomic():
        run, step = _locked_step(step_id)
        if step.state != StepState.RUNNING or step.attempts != attempt:
            _close_attempt(step, attempt, outcome="stale", usage=usage, error=error)
            return False
        _charge(run, step, usage)
        _close_attempt(step, attempt, outcome="failed", usage=usage, error=error)
        _fail_or_retry(run, step, error, actor=f"worker:{worker}")
    return True


def _fail_or_retry(run: Run, step: StepRun, error: StepError, *, actor: str) -> None:
    _, graph = definition_of(run)
    policy = graph.steps[step.name]["retry"]
    when = retry_at(policy, attempts=step.attempts, error=error, at=now())
    if when is not None and run.state in (RunState.RUNNING, RunState.WAITING):
        step.schedule_retry(error=error.as_dict(), at=when)
        step.save()
        event_record(run=run, step=step, kind="step.retrying", actor=actor,
                     payload={**error.as_dict(), "attempt": step.attempts, "at": when.isoformat()})
        delay = (when - now()).total_seconds()
        if delay <= BROKER_DELAY_LIMIT_S:
            retry_due_on_commit(step.id, max(delay, 0))
        return
    if error.error_class == "cancelled":
        step.cancel(reason=error.message)
        step.save()
        event_record(run=run, step=step, kind="step.cancelled", actor=actor, payload=error.as_dict())
        _after_step_ended(run)
        return
    if error.error_class == "timeout":
        step.time_out(error=error.as_dict())
    else:
        step.fail(error={**error.as_dict(), "attempts": step.attempts})
    step.save()
    event_record(run=run, step=step, kind=f"step.{step.state}", actor=actor, payload=step.error)
    dead_letter_open(run=run, step=step, error=error, actor=actor)
    _after_step_ended(run)


def _after_step_ended(run: Run) -> None:
    if run.state == RunState.CANCELLING:
        run_settle_cancel(run, actor="service:scheduler")
    else:
        run_advance(run)


def step_retry_due(*, step_id: int) -> bool:
    """Queue a retrying step whose delay has elapsed. False if not (yet) due or not retrying."""
    with transaction.atomic():
        run, step = _locked_step(step_id)
        if step.state != StepState.RETRYING or (step.next_attempt_at and step.next_attempt_at > now()):
            return False
        if run.state not in (RunState.RUNNING, RunState.WAITING):
            return False
        step.enqueue(queue=step.queue)
        step.save()
        event_record(run=run, step=step, kind="step.queued", payload={"retry": True})
        step_dispatch_on_commit(step.id, step.queue)
    return True


def step_time_out(*, step_id: int, reason: str) -> bool:
    """The reaper's verdict on a step past its timeout: timed_out, or retried if allowed."""
    with transaction.atomic():
        run, step = _locked_step(step_id)
        if step.state not in (StepState.RUNNING, StepState.QUEUED, StepState.WAITING):
            return False
        if step.state == StepState.RUNNING:
            StepAttempt.objects.filter(step=step, number=step.attempts, finished_at=None).update(
                finished_at=now(), outcome="timed_out", error_class="timeout", error_message=reason)
            _fail_or_retry(run, step, StepError("timeout", reason), actor="service:reaper")
        else:
            step.time_out(error={"class": "timeout", "message": reason})
            step.save()
            if step.kind == "human_gate":
                from approvals.services import approval_expire_for_step

                approval_expire_for_step(step=step)
            event_record(run=run, step=step, kind="step.timed_out", actor="service:reaper",
                         payload=step.error)
            _after_step_ended(run)
    return True


def step_lease_expired(*, step_id: int) -> bool:
    """A running step whose worker stopped renewing its claim: the attempt is lost."""
    with transaction.atomic():
        run, step = _locked_step(step_id)
        if step.state != StepState.RUNNING or not step.lease_expires_at or step.lease_expires_at > now():
            return False
        StepAttempt.objects.filter(step=step, number=step.attempts, finished_at=None).update(
            finished_at=now(), outcome="lost", error_class="lost",
            error_message=f"lease held by {step.lease_owner} expired")
        _fail_or_retry(run, step, StepError("lost", "worker lease expired"), actor="service:reaper")
    return True


def step_redispatch(*, step_id: int) -> bool:
    """Send a queued step's message again (the first one was lost). Claims stay exclusive."""
    step = StepRun.objects.filter(id=step_id, state=StepState.QUEUED).first()
    if step is None:
        return False
    with transaction.atomic():
        step_dispatch_on_commit(step.id, step.queue)
        StepRun.objects.filter(id=step.id, state=StepState.QUEUED).update(queued_at=now())
    return True


def lease_extend(*, step_id: int, attempt: int) -> bool:
    """Heartbeat from the worker running `attempt`: push its lease forward.

    False when the step is no longer this attempt's (timed out, lost, cancelled).
    """
    return bool(StepRun.objects.filter(id=step_id, state=StepState.RUNNING, attempts=attempt)
                .update(lease_expires_at=lease_until()))
