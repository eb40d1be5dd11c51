"""Executing one step on a worker: throttle, claim, guard, execute, commit.

The flow every `execute_step` message takes. Each stage re-reads persisted state, so a replayed
message does nothing; the executor's side effect runs outside any transaction, under a lease
kept alive by a heartbeat.
"""
from django.conf import settings

from .. import limits
from ..executors import ExecContext, execute
from ..leases import lease_heartbeat
from ..retry import StepError
from . import steps


def step_execute(*, step_id: int, worker: str) -> float:
    """Run a queued step to its outcome. Returns seconds to wait and retry the message when
    the step's dependency is over its shared rate limit (the step stays queued), else 0."""
    if settings.STEPWISE_RATE_LIMITS:
        wait = limits.rate_limit_wait(limits.dependency_of(steps.step_spec(step_id=step_id)))
        if wait:
            return wait
    claim = steps.step_claim(step_id=step_id, worker=worker)
    if claim is None:
        return 0
    ctx = ExecContext(str(claim.run_id), claim.workflow, claim.spec["name"], claim.attempt,
                      claim.idempotency_key, step_id=step_id)
    dependency = limits.dependency_of(claim.spec)
    try:
        if closed_for := limits.breaker_open_for(dependency):
            # A failing dependency is not called; the step retries under its policy.
            raise StepError("transient", f"circuit open for {dependency}", retry_after_s=closed_for)
        with lease_heartbeat(step_id=step_id, attempt=claim.attempt):
            try:
                result = execute(claim.spec, claim.step_input, ctx)
            except StepError as error:
                limits.breaker_record(dependency, error_class=error.error_class)
                raise
            limits.breaker_record(dependency, error_class=None)
    except StepError as error:
        # A failed attempt may still have spent tokens (model calls, repairs): charge them.
        steps.step_fail(step_id=step_id, attempt=claim.attempt, error=error,
                        usage=steps.Usage.of(getattr(error, "spent", None)), worker=worker)
        return 0
    steps.step_succeed(step_id=step_id, attempt=claim.attempt, output=result.output,
                       usage=steps.Usage.of(result), worker=worker)
    return 0
