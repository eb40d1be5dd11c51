"""Sagas: when a run fails after side effects happened, undo them, newest first.

Each completed side-effecting step may declare `compensate: {tool, params}`; its params are
templates over the step's input and its own output (`steps.<its name>.output`). Compensation is a
new business action, not a rollback: it goes through the effect ledger under its own stable key
(run, step, "compensate"), so a crash or a redelivery never compensates twice, and each one is
recorded. One worker at a time compensates a run, under a lease its heartbeat renews, so a
duplicate message never runs a compensation beside another. A compensation whose error its
`retry` policy (by default the step's) allows is tried again later, the run still
`compensating`; one that fails for good leaves the run `compensation_failed`, visible for a
person.
"""

import kombu.exceptions
import redis.exceptions
from django.db import InterfaceError, OperationalError, transaction

from audit.services import external_call_authorize
from budgets.services import cost_of
from orchestrator.models import Effect, Run, StepRun

from ..attestation import attestation_problem, producer_of
from ..authz import System, label
from ..clock import now
from ..dispatch import compensate_on_commit
from ..events import event_record
from ..executors import ExecContext
from ..executors.tool import prepared_call
from ..keys import idempotency_key_for
from ..leases import heartbeat, lease_until
from ..retry import StepError, retry_at
from ..secret_inputs import revealed_for
from ..selectors import compensable_steps, definition_of, lock_run, runs_with_version
from ..states import RunState
from .effects import effect_perform
from .scheduling import run_ended_notify

COMPENSATION = System("compensation")

# Infrastructure failing under a compensation (a database restart, a broker or cache outage)
# says nothing about the compensation itself, which is tried again.
OUTAGES = (OperationalError, InterfaceError, kombu.exceptions.OperationalError,
           redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


def run_compensate(*, run_id) -> bool:
    """Run every pending compensation of a compensating run. False if there is nothing to do:
    the run is not compensating, or another worker is compensating it right now."""
    if not _lease_take(run_id):
        return False
    with heartbeat(lambda: _lease_renew(run_id), name=f"compensate-{run_id}"):
        return _compensate_all(run_id)


def _lease_take(run_id) -> bool:
    with transaction.atomic():
        run = lock_run(run_id)
        at = now()
        if run.state != RunState.COMPENSATING or (run.compensation_lease_until or at) > at:
            return False
        run.compensation_lease_until = lease_until(at)
        run.save(update_fields=["compensation_lease_until"])
    return True


def _lease_renew(run_id) -> bool:
    return bool(Run.objects.filter(id=run_id, state=RunState.COMPENSATING).update(
        compensation_lease_until=lease_until()))


def _compensate_all(run_id) -> bool:
    run = runs_with_version().get(id=run_id)
    _, graph = definition_of(run)
    for step in compensable_steps(run, graph):
        action = graph.steps[step.name]["compensate"]
        # Versions saved before compensations had a policy of their own retry as their step does.
        policy = action.get("retry") or graph.steps[step.name]["retry"]
        key = idempotency_key_for(run.id, step.name, "compensate")
        try:
            _compensate_one(run, step, action, key)
        except StepError as error:
            again = _retry_at(key, policy, error)
            if again:
                _retry_later(run.id, step, error, again)
            else:
                _end(run.id, failure={"step": step.name, **error.as_dict()})
            return True
        except OUTAGES:
            raise  # the database or the broker failed, not the compensation: the reaper re-sends
        except Exception as exc:  # a bug must not leave the run compensating forever
            _end(run.id, failure={"step": step.name, "class": "permanent",
                                  "message": f"{type(exc).__name__}: {exc}"})
            raise
    _end(run.id, failure=None)
    return True


def _compensate_one(run: Run, step: StepRun, action: dict, key: str) -> None:
    """Undo `step` through the effect ledger, as a tool step of its own would call its tool.
    Its params read the step's own output: nothing is undone from one whose attestation does not
    hold (the step is flagged, and the compensation fails for a person to look)."""
    problem = attestation_problem(step_id=step.id, output=step.output, attestation=step.attestation)
    if problem:
        producer, key_id = producer_of(step.attestation)
        event_record(run=run, step=step, kind="step.attestation_invalid", actor=label(COMPENSATION),
                     payload={"problem": problem, "producer": producer, "key": key_id})
        raise StepError("permanent", f"attestation: step '{step.name}': {problem}")
    secrets = revealed_for(run.id)  # in memory for this call only (secret_inputs)
    ctx = ExecContext(str(run.id), run.version.workflow.name, step.name, 1, key, step_id=step.id,
                      scrub=secrets.scrub, sandbox=run.sandbox,
                      authorize=external_call_authorize, price=cost_of)
    spec = {**action, "type": "tool", "name": step.name, "side_effect": True}
    prepared = prepared_call(spec, secrets.reveal(_context(step)), ctx, action="compensate")
    effect_perform(tool=prepared.tool, call=prepared.call, step_id=step.id, key=key,
                   action="compensate", scrub=secrets.scrub, sandboxed=prepared.sandboxed)


def _retry_at(key: str, policy: dict, error: StepError):
    """When to try this compensation again, or None: its policy, over the ledger's attempts."""
    attempts = Effect.objects.filter(key=key).values_list("attempts", flat=True).first() or 1
    return retry_at(policy, attempts=attempts, error=error, at=now())


def _retry_later(run_id, step: StepRun, error: StepError, at) -> None:
    """Keep the run compensating and send it again when due (the reaper's sweep is the backstop)."""
    with transaction.atomic():
        run = lock_run(run_id)
        if run.state != RunState.COMPENSATING:
            return
        run.progressed_at = now()
        run.compensation_lease_until = None  # whoever the retry reaches may take it
        run.save(update_fields=["progressed_at", "compensation_lease_until"])
        event_record(run=run, kind="run.compensation_retrying", actor=label(COMPENSATION),
                     payload={"step": step.name, "error": error.as_dict(), "at": at.isoformat()})
        compensate_on_commit(run.id, delay_s=max((at - now()).total_seconds(), 0),
                             capacity=run.capacity)


def _context(step: StepRun) -> dict:
    """The step's own input, plus its own output under steps.<name> (what it undoes)."""
    context = dict(step.input or {})
    context["steps"] = {**context.get("steps", {}),
                        step.name: {"state": step.state, "output": step.output}}
    return context


def _end(run_id, *, failure: dict | None) -> None:
    with transaction.atomic():
        run = lock_run(run_id)
        if run.state != RunState.COMPENSATING:
            return
        if failure:
            run.compensation_fail(error=failure)
        else:
            run.compensated()
        run.compensation_lease_until = None
        run.save()
        event_record(run=run, kind=f"run.{run.state}", actor=label(COMPENSATION),
                     payload=failure or {"compensated": True})
        run_ended_notify(run)
