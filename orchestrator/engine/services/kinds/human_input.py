"""Human input steps: a run waits, holding no worker, until a person fills in a form.

`start` opens the step's input task (`approvals.inputs`): for its group, or its one assignee,
with the evidence rendered over the run now, a final deadline (`deadline_s`) and, when the step
declares one, a time to escalate. `input_answer` — the one service the admin, the API and the
client reach — checks who answers (`approvals.authority`: the assignee or a member of the
group, in the run's team; separation of duties when the step asks for it), that the task is
still current (open, its step still waiting in a run that waits, on the version it was asked
on: else NotAllowed, a 409), and the answer against the form's JSON Schema (InputInvalid,
each problem by path); then it records the answer and its answerer and completes the step with
{answer, answered_by, abstained}. A refused answer changes nothing and is audited
(`input.refused`). The step's deadline is the reaper's (`time_out`): escalate once to
`escalate_to`, then, at the final deadline, fail (the step times out) or abstain, per
`on_timeout`. A step that ends unanswered closes its task (`release`).

In a sandboxed run (`orchestrator.engine.sandbox`) nobody is asked and no task is opened: the
step starts (it *would have asked*) and completes at once with the sandbox's declared answer
(`responses[<step>]`, checked against the form as a person's is), answered by `SANDBOX`
("service:evaluation"), or fails (`validation`) saying why when there is none or it does not fit.
"""
from django.db import transaction
from jsonschema import Draft202012Validator

from approvals.authority import require_answerer, require_input_separation
from approvals.inputs import (
    input_refusal_record,
    input_task_answer,
    input_task_close,
    input_task_escalate,
    input_task_open,
)
from approvals.models import InputState, InputTask
from orchestrator.models import Run, StepRun
from orchestrator.store import save_row

from ...authz import REAPER, SANDBOX, Actor, label
from ...clock import now
from ...errors import InputInvalid, NotAllowed, ServiceError
from ...events import event_record
from ...sandbox import declared_answer
from ...selectors import lock_run, lock_run_of_step, spec_of
from ...states import RUN_ADVANCING, StepKind, StepState
from ..step_end import step_ended, waiting_step_time_out
from . import Record, StepKindHandler, register

MAX_NOTE = 10000


class HumanInput(StepKindHandler):
    def start(self, run: Run, step: StepRun, spec: dict, record: Record) -> None:
        # The step's deadline is the next time the reaper acts on it: the escalation, if the
        # step declares one, else the final deadline (the task keeps that one).
        escalates = spec.get("escalate_to") and spec.get("escalate_after_s")
        step.await_event(timeout_s=spec["escalate_after_s"] if escalates else spec["deadline_s"])
        record(step, "step.waiting", {"for": "input"})  # saved with the scheduler's batch
        if run.sandbox is not None:
            _answer_sandboxed(run, step, spec, record)
            return
        input_task_open(run=run, step=step, spec=spec, record=record)

    def time_out(self, *, step_id: int, reason: str) -> bool:
        """Escalate once if the step declares it and it is time; at the final deadline, abstain
        or time the step out per its `on_timeout`."""
        with transaction.atomic():
            run, step = lock_run_of_step(step_id)
            # Re-read under the lock: a sweep that listed the step before another escalated it
            # finds its deadline moved on, and does nothing.
            due = step.deadline_at is not None and step.deadline_at <= now()
            if step.state != StepState.WAITING or not due:
                return False
            task = (InputTask.objects.select_related("run__team", "run__version__workflow", "step")
                    .filter(step=step, state=InputState.OPEN).first())
            spec = spec_of(run, step.name)
            if task is not None and task.escalation_level == 0 and task.escalate_at is not None:
                input_task_escalate(run=run, task=task, group=spec["escalate_to"], actor=REAPER)
                step.deadline_at = task.deadline_at
                save_row(step)
                return True
            if task is not None and spec.get("on_timeout") == "abstain":
                input_task_close(run=run, step=step, actor=REAPER, expired=True)
                _complete(run, step, actor=REAPER, output=input_output(None, answered_by=None))
                return True
        return waiting_step_time_out(step_id=step_id, reason=reason)

    def release(self, run: Run, step: StepRun, *, actor: Actor) -> None:
        input_task_close(run=run, step=step, actor=actor,
                         expired=step.state == StepState.TIMED_OUT)


register(StepKind.HUMAN_INPUT, HumanInput())


def _answer_sandboxed(run: Run, step: StepRun, spec: dict, record: Record) -> None:
    """End a sandboxed run's input step as it starts, with its declared answer (in the
    scheduler's batch: it plans again, as after any control step that ends as it starts)."""
    answer = declared_answer(run.sandbox, step.name)
    if answer is None:
        problem = (f"sandbox.responses.{step.name}: a sandboxed run asks nobody, and its "
                   "sandbox declares no answer for this step")
    else:
        found = answer_problems(spec["form"], answer)
        problem = ("sandbox.responses." + step.name + " does not fit the form: " + "; ".join(
            f"{p['path']}: {p['message']}" for p in found)) if found else ""
    if problem:
        step.fail(error={"class": "validation", "message": problem})
        record(step, "step.failed", {**step.error, "sandboxed": True}, actor=label(SANDBOX))
        return
    step.complete(output=input_output(answer, answered_by=SANDBOX.name))
    record(step, "step.completed", {"abstained": False, "answered_by": SANDBOX.name,
                                    "sandboxed": True}, actor=label(SANDBOX))


def input_output(answer: dict | None, *, answered_by: str | None) -> dict:
    """The step's output: the answer (`{}` for an abstention), who gave it (None when the
    deadline abstained), and whether it is an abstention."""
    return {"answer": answer if answer is not None else {}, "answered_by": answered_by,
            "abstained": answer is None}


def _complete(run: Run, step: StepRun, *, actor: Actor, output: dict) -> None:
    step.complete(output=output)
    save_row(step)
    event_record(run=run, step=step, kind="step.completed", actor=label(actor),
                 payload={"abstained": output["abstained"], "answered_by": output["answered_by"]})
    step_ended(run, step, actor=actor)


def answer_problems(form: dict, answer: object) -> list[dict]:
    """Every way `answer` departs from the form's JSON Schema, each with its path
    (`answer.<field>`)."""
    if not isinstance(answer, dict):
        return [{"path": "answer", "message": "the answer is an object of the form's fields"}]
    fields = form.get("properties") or {}
    # A key the form has no field for is refused, as an unknown key of a definition is.
    problems = [{"path": f"answer.{key}", "message": "not a field of this form"}
                for key in answer if key not in fields]
    for error in sorted(Draft202012Validator(form).iter_errors(answer), key=lambda e: list(e.path)):
        path = ".".join(["answer", *(str(p) for p in error.absolute_path)])
        if error.validator == "required":
            missing = error.message.split("'")[1] if "'" in error.message else ""
            path, message = f"answer.{missing}" if missing else path, "this field is required"
        else:
            message = error.message
        problems.append({"path": path, "message": message})
    return problems


def _stale(run: Run, task: InputTask) -> str:
    """Why the task may no longer be answered, or "" while it may."""
    if task.state != InputState.OPEN:
        return f"this task is {task.state} already; nothing waits for an answer"
    if task.step.state != StepState.WAITING:
        return f"the step '{task.step.name}' is {task.step.state}, no longer waiting for this answer"
    if run.state not in RUN_ADVANCING:
        return f"the run is {run.state}; it does not wait for this answer now"
    if task.version_id != run.version_id:
        return "the run has moved to another version of its workflow since this task was asked"
    return ""


def input_answer(*, task_id: int, user, answer: dict | None = None, abstain: bool = False,
                 note: str = "") -> InputTask:
    """Answer an open input task as `user`: `answer` (an object the form's JSON Schema accepts),
    or `abstain` ("can't decide") where the step allows it. The step completes with
    {answer, answered_by, abstained} and the run moves on.

    Raises Forbidden unless `user` may answer (the assignee, or a member of the task's group in
    the run's team) and, when the step asks for separation of duties, did not set the run in
    motion; NotAllowed (409) when the task is stale (answered, expired or cancelled, its step no
    longer waiting, its run not waiting, or on another version); InputInvalid naming every
    problem of the answer by path, an abstention the step does not allow, or a note too long.
    A refusal is audited.
    """
    attempted = "abstain" if abstain else "answer"
    try:
        with transaction.atomic():
            run = lock_run(InputTask.objects.values_list("run_id", flat=True).get(id=task_id))
            task = (InputTask.objects.select_related("step", "run__team", "run__version__workflow")
                    .get(id=task_id))
            require_answerer(user, task)
            if stale := _stale(run, task):
                raise NotAllowed(stale, [{"path": "", "message": stale}])
            require_input_separation(user, task)
            text = (note or "").strip()
            if len(text) > MAX_NOTE:
                raise InputInvalid(f"the note is longer than {MAX_NOTE} characters",
                                   [{"path": "note", "message": f"at most {MAX_NOTE} characters"}])
            if abstain:
                if not task.allow_abstain:
                    raise InputInvalid("this step does not allow abstaining: answer the form",
                                       [{"path": "abstain", "message": "not allowed by this step"}])
                given = None
            else:
                problems = answer_problems(task.form, answer if answer is not None else {})
                if problems:
                    raise InputInvalid("the answer does not fit the form: " + "; ".join(
                        f"{p['path']}: {p['message']}" for p in problems), problems)
                given = answer
            input_task_answer(run=run, task=task, user=user, answer=given, note=text)
            _complete(run, task.step, actor=user,
                      output=input_output(given, answered_by=user.get_username()))
    except ServiceError as exc:
        input_refusal_record(task_id=task_id, user=user, attempted=attempted, reason=str(exc))
        raise
    return task
