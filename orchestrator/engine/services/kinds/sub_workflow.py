"""Sub-workflows: a step that starts a child run of another workflow and waits for it.

The child is a run of its own (its own steps, retries, budget and timeout); the parent tracks it
as one step. `start` only sets the step waiting and sends `child_start` to the orchestrator
queue: the child is created by a worker (`child_run_start`), never inside the request or
transaction that started the parent, so workflows that call each other grow one level per
message instead of recursing in one request. A child more than `STEPWISE_MAX_CHILD_DEPTH` levels
below its top-level run is refused: the step fails `permanent`. `child_finished` carries the
child's outcome into the parent step when the child ends; the parent step's own timeout is the
reaper's (`time_out`); a parent step that ends any other way than completed cancels its child
(`release`), which cascades to the child's own children and approvals.
"""
from django.conf import settings
from django.db import transaction

from orchestrator.models import Run, StepRun

from ...authz import System, label
from ...definitions import render_value
from ...dispatch import child_start_on_commit
from ...errors import InputInvalid, NotAllowed
from ...events import event_record
from ...secret_inputs import NONE, revealed_for
from ...selectors import lock_run_of_step, spec_of, step_input_of, version_to_start
from ...states import RunState, StepKind, StepState
from ..runs import run_cancel, run_start
from ..step_end import step_ended, waiting_step_time_out
from . import Record, StepKindHandler, register

SUB_WORKFLOW = System("sub_workflow")


class SubWorkflow(StepKindHandler):
    def start(self, run: Run, step: StepRun, spec: dict, record: Record) -> None:
        step.await_event(timeout_s=spec["timeout_s"])
        record(step, "step.waiting", {"for": "sub_workflow"})
        step.save()
        child_start_on_commit(step.id, run_id=run.id, step_name=step.name)

    def start_child(self, run: Run, step: StepRun, spec: dict, record: Record) -> None:
        """Create the child run of a waiting step (`child_run_start`), or fail the step with
        the reason (a bad child input, a workflow with no published version)."""
        version = version_to_start(team=run.team, name=spec["workflow"])
        secrets = NONE
        try:
            # The parent's secrets reach the child's input and are sealed again there.
            secrets = revealed_for(run.id)
            child_input = render_value(spec["input"], secrets.reveal(step_input_of(step)))
            if version is None:
                raise InputInvalid(
                    f"workflow '{spec['workflow']}' does not exist or has no published version")
            # The parent's start was the permission; the child runs on the parent's behalf.
            child = run_start(version=version, input=child_input, actor=SUB_WORKFLOW,
                              created_by=run.created_by, parent_step=step, trigger="sub_workflow",
                              known_secrets=secrets.known())
        except Exception as exc:  # a bad child input is this step's classified failure
            step.fail(error={"class": "validation", "message": secrets.scrub(str(exc))})
            record(step, "step.failed", step.error)
            return
        record(step, "step.child_started", {"child_run": str(child.id)})

    def time_out(self, *, step_id: int, reason: str) -> bool:
        return waiting_step_time_out(step_id=step_id, reason=reason)

    def release(self, run: Run, step: StepRun, *, actor) -> None:
        child = Run.objects.filter(parent_step=step).only("id", "state").first()
        if child is None or child.is_terminal:
            return  # a child that already finished stays finished
        try:
            run_cancel(run_id=child.id, actor=actor,
                       reason=f"parent step '{step.name}' of run {run.id} ended {step.state}")
        except NotAllowed:
            pass  # compensating: it is undoing its effects, and ends by itself


HANDLER = SubWorkflow()
register(StepKind.SUB_WORKFLOW, HANDLER)


def child_run_start(*, parent_step_id: int) -> bool:
    """Create the child run a waiting sub-workflow step asked for: the `child_start` task on
    the orchestrator queue, or the reaper when that message was lost. False, and nothing done,
    when the step no longer waits or has its child already (a replayed message).

    A child deeper than `STEPWISE_MAX_CHILD_DEPTH` levels below its top-level run is not
    created: the step fails `permanent`, and its run goes on per its `on_error`."""
    with transaction.atomic():
        run, step = lock_run_of_step(parent_step_id)
        if (step.kind != StepKind.SUB_WORKFLOW or step.state != StepState.WAITING
                or Run.objects.filter(parent_step=step).exists()):
            return False
        spec = spec_of(run, step.name)

        def record(step: StepRun, kind: str, payload: dict | None = None, actor: str | None = None):
            event_record(run=run, step=step, kind=kind, actor=actor or label(SUB_WORKFLOW),
                         payload=payload or {})

        limit = settings.STEPWISE_MAX_CHILD_DEPTH
        if _depth(run, limit) >= limit:
            step.fail(error={"class": "permanent", "message": (
                f"a run of '{spec['workflow']}' here would be {limit + 1} child runs deep; "
                f"child runs nest at most {limit} deep (STEPWISE_MAX_CHILD_DEPTH): do these "
                "workflows call each other in a cycle?")})
            record(step, "step.failed", step.error)
        else:
            HANDLER.start_child(run, step, spec, record)
        if step.state == StepState.WAITING:
            return True
        step.save()
        step_ended(run, step, actor=SUB_WORKFLOW)
    return True


def _depth(run: Run, limit: int) -> int:
    """How many parent runs `run` has (0 for a top-level run), counted up to `limit`."""
    depth, parent_step_id = 0, run.parent_step_id
    while parent_step_id is not None and depth < limit:
        depth += 1
        parent_step_id = (Run.objects.filter(steps__id=parent_step_id)
                          .values_list("parent_step_id", flat=True).first())
    return depth


def child_finished(*, parent_step_id: int) -> bool:
    """Carry a finished child run's outcome into the parent step that waits for it."""
    with transaction.atomic():
        run, step = lock_run_of_step(parent_step_id)
        child = Run.objects.filter(parent_step=step).first()
        if step.state != StepState.WAITING or child is None or not child.is_terminal:
            return False
        if child.state == RunState.COMPLETED:
            step.complete(output=child.output)
        else:
            step.fail(error={"class": "child_" + child.state,
                             "message": f"child run {child.id} ended {child.state}",
                             "child_run": str(child.id)})
        step.tokens_in, step.tokens_out, step.cost_usd = child.tokens_in, child.tokens_out, child.cost_usd
        step.save()
        for key in ("tokens_in", "tokens_out", "cost_usd"):
            setattr(run, key, getattr(run, key) + getattr(child, key))
        run.save(update_fields=["tokens_in", "tokens_out", "cost_usd"])
        event_record(run=run, step=step, kind=f"step.{step.state}", actor=label(SUB_WORKFLOW),
                     payload={"child_run": str(child.id), "child_state": child.state})
        step_ended(run, step, actor=SUB_WORKFLOW)
    return True
