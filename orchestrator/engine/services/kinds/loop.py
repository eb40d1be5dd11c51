"""Loop steps: a small body of steps run once per iteration until a condition holds, at most
`max_iterations` times.

Each iteration's body steps are step runs of their own, named with the iteration (`draft[2]`),
so leases, retries, idempotency keys (the step run's name is part of the key), the reaper, the
audit ledger and the run page treat them as any other step. The scheduler plans the current
iteration from persisted state and decides, once it ended, whether the loop goes on
(`Plan.loops`); this module only applies that verdict (`progress`): create the next
iteration's step runs — after the budget check every iteration passes —, or end the loop. A
loop that ends other than completed stops its current iteration's steps (`release`).
"""
from django.db.models import Sum

from budgets.services import budget_denial
from orchestrator.models import Run, StepRun

from ...authz import Actor, label
from ...definitions import TemplateError
from ...events import event_record
from ...scheduler import StepView, current_iteration, iteration_context, iteration_name
from ...selectors import definition_of
from ...states import STEP_CANCELLABLE_NOW, StepKind
from ..attestations import output_attest
from ..step_end import waiting_step_time_out
from . import Record, StepKindHandler, handler_for, register


class Loop(StepKindHandler):
    def start(self, run: Run, step: StepRun, spec: dict, record: Record) -> None:
        step.await_event(timeout_s=spec["timeout_s"])
        _, graph = definition_of(run)
        views = {s.name: StepView(s.state, s.output) for s in run.steps.all()}
        try:  # the loop's input is rendered again at each plan; a bad one fails the step now
            iteration_context(graph, step.name, run.input, views, 1)
        except TemplateError as exc:
            step.fail(error={"class": "validation", "message": f"loop input: {exc}"})
            record(step, "step.failed", step.error)
            return
        step.save()
        # A loop started again (its run reopened by an operator's retry) goes on with the
        # iteration it was in: its step runs exist already, reopened or finished.
        number = current_iteration(graph.bodies[step.name], views)
        if number == 0:
            number = 1
            _iteration_create(run, step, spec, number)
        record(step, "step.waiting", {"for": "loop", "iteration": number})

    def time_out(self, *, step_id: int, reason: str) -> bool:
        return waiting_step_time_out(step_id=step_id, reason=reason)

    def release(self, run: Run, step: StepRun, *, actor: Actor) -> None:
        """The current iteration's steps not yet running are cancelled (and release what they
        own); one running right now stops at its next safe point, and the scheduler no longer
        plans an iteration of a loop that is not waiting."""
        _, graph = definition_of(run)
        names = _iteration_names(graph, step.name)
        reason = f"loop step '{step.name}' ended {step.state}"
        for owned in run.steps.filter(name__in=names, state__in=STEP_CANCELLABLE_NOW):
            owned.cancel(reason=reason)
            owned.save()
            event_record(run=run, step=owned, kind="step.cancelled", actor=label(actor),
                         payload={"reason": reason})
            handler_for(owned.kind).release(run, owned, actor=actor)

    def progress(self, run: Run, step: StepRun, verdict: str, detail: dict, *, actor: Actor) -> None:
        definition, graph = definition_of(run)
        spec = graph.steps[step.name]
        if verdict == "next":
            number = detail["iteration"]
            denial = next(filter(None, (budget_denial(run=run, definition=definition, spec=graph.steps[b])
                                        for b in graph.bodies[step.name].order)), None)
            if denial is None:
                _iteration_create(run, step, spec, number)
                event_record(run=run, step=step, kind="step.iteration_started", actor=label(actor),
                             payload={"iteration": number})
                return
            verdict, detail = "fail", {**denial, "step": step.name, "iteration": number,
                                       "message": f"iteration {number} not started: {denial['message']}"}
        # What its iterations spent, shown on the loop (each step run charged the run already).
        spent = run.steps.filter(name__in=_iteration_names(graph, step.name)).aggregate(
            tokens_in=Sum("tokens_in"), tokens_out=Sum("tokens_out"), cost_usd=Sum("cost_usd"))
        for key, value in spent.items():
            setattr(step, key, value or 0)
        if verdict == "complete":
            step.complete(output=detail)
            output_attest(run, step, producer=label(actor))  # saved with the step
        else:
            step.fail(error=detail)
        step.save()
        event_record(run=run, step=step, kind=f"step.{step.state}", actor=label(actor),
                     payload={"iterations": detail.get("iterations", detail.get("iteration"))}
                     if verdict == "complete" else detail)
        if verdict != "complete":
            self.release(run, step, actor=actor)


register(StepKind.LOOP, Loop())


def _iteration_names(graph, loop: str) -> list[str]:
    """Every step run name the loop's iterations may have."""
    return [iteration_name(b, n) for b in graph.bodies[loop].order
            for n in range(1, graph.steps[loop]["max_iterations"] + 1)]


def _iteration_create(run: Run, step: StepRun, spec: dict, number: int) -> None:
    """The step runs of iteration `number`, blocked, listed with their loop."""
    StepRun.objects.bulk_create(
        StepRun(run=run, name=iteration_name(b["name"], number), kind=b["type"], position=step.position)
        for b in spec["body"]
    )
