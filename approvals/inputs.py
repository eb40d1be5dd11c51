"""Input tasks' own state changes: open, record an answer or an abstention, escalate, close —
each with its event (and so its audit entry) and its notification.

These run inside the caller's transaction (the `human_input` step's, with the run row locked);
what an answer does to the run — completing the step, moving the run on — and every check of
who may answer and whether the task is current are the step kind's
(`orchestrator.engine.services.kinds.human_input`). The exception is `input_refusal_record`,
which writes the audit entry of a refused answer in a transaction of its own, after the
attempt's was rolled back. Nothing here imports an engine service.
"""
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.urls import reverse

from notifications.services import notification_send
from orchestrator.engine.authz import Actor, label
from orchestrator.engine.clock import now
from orchestrator.engine.definitions import TemplateError, render_template
from orchestrator.engine.events import event_record
from orchestrator.models import Run, StepRun

from .authority import answerers
from .models import InputState, InputTask


def _rendered(text: str, context: dict) -> str:
    try:
        return render_template(text, context)
    except TemplateError as exc:
        return f"(could not be rendered: {exc})"


def input_task_open(*, run: Run, step: StepRun, spec: dict, record) -> InputTask:
    """Create the task of a human_input step that has just started waiting: its instructions
    and evidence rendered over the step's input now, its deadline the step's final one. Its
    event joins the scheduler's batch (`record`)."""
    context = step.input or {}
    started = step.started_at or now()
    escalate_at = (started + timedelta(seconds=spec["escalate_after_s"])
                   if spec.get("escalate_to") and spec.get("escalate_after_s") else None)
    task = InputTask.objects.create(
        step=step, run=run, version_id=run.version_id, group=spec["group"],
        assignee=spec.get("assignee") or "",
        instructions=_rendered(spec.get("instructions") or "", context),
        evidence=[{"name": name, "value": _rendered(text, context)}
                  for name, text in (spec.get("evidence") or {}).items()],
        form=spec["form"], allow_abstain=bool(spec.get("allow_abstain")),
        separation_of_duties=bool(spec.get("separation_of_duties")),
        requested_at=started, deadline_at=started + timedelta(seconds=spec["deadline_s"]),
        escalate_at=escalate_at,
    )
    record(step, "input.requested",
           {"task": task.id, "group": task.group, "assignee": task.assignee,
            "deadline_at": task.deadline_at.isoformat(),
            "escalate_at": escalate_at.isoformat() if escalate_at else None},
           actor="service:stepwise")
    input_notify(task, reason="requested")
    return task


def input_task_answer(*, run: Run, task: InputTask, user, answer: dict | None, note: str) -> None:
    """Record `user`'s answer (None: they abstained) on the open task."""
    if answer is None:
        task.abstain(user=user, note=note)
    else:
        task.give(user=user, answer=answer, note=note)
    task.save()
    event_record(run=run, step=task.step, kind=f"input.{task.state}", actor=label(user),
                 payload={"task": task.id, "answered_by": user.get_username(), "note": note,
                          "fields": sorted(answer or {})})  # names only: values stay in the row


def input_task_escalate(*, run: Run, task: InputTask, group: str, actor: Actor) -> None:
    """Unanswered when its escalation time came: `group` answers from now on, and is told."""
    previous = task.assignee or task.group
    task.escalate(group=group)
    task.save()
    event_record(run=run, step=task.step, kind="input.escalated", actor=label(actor),
                 payload={"task": task.id, "from": previous, "to": group,
                          "deadline_at": task.deadline_at.isoformat()})
    input_notify(task, reason="escalated")


def input_task_close(*, run: Run, step: StepRun, actor: Actor, expired: bool) -> InputTask | None:
    """Close the step's open task because it ended unanswered: expired at its deadline, else
    cancelled. None if it had no open task."""
    task = InputTask.objects.filter(step=step, state=InputState.OPEN).first()
    if task is None:
        return None
    if expired:
        task.expire()
    else:
        task.cancel()
    task.save()
    event_record(run=run, step=step, kind=f"input.{task.state}", actor=label(actor),
                 payload={"task": task.id})
    return task


def input_refusal_record(*, task_id: int, user: Actor, attempted: str, reason: str) -> None:
    """Audit a refused answer: who, what, why. Its own transaction: the attempt's own was rolled
    back."""
    task = InputTask.objects.select_related("run", "step").filter(id=task_id).first()
    if task is None:
        return
    with transaction.atomic():
        event_record(run=task.run, step=task.step, kind="input.refused", actor=label(user),
                     payload={"task": task.id, "attempted": attempted, "reason": reason,
                              "state": task.state})


# --- notifications ------------------------------------------------------------------------------


def input_page_url(task: InputTask) -> str:
    path = reverse("admin:approvals_inputtask_change", args=[task.id])
    return settings.STEPWISE_BASE_URL.rstrip("/") + path


def input_notify(task: InputTask, *, reason: str) -> None:
    """Tell whoever answers now (e-mail) and the webhook that a task waits for them: `reason`
    is requested or escalated."""
    run = task.run
    workflow = run.version.workflow.name
    where = f"{workflow} / {task.step.name}"
    who = task.assignee or f"the {task.group} group"
    subjects = {"requested": f"Input needed: {where}",
                "escalated": f"Escalated to {task.group}: input needed for {where}"}
    lines = [f"Run {run.id} of {workflow} (team {run.team.slug}) waits for input from {who} "
             f"at step '{task.step.name}'."]
    if reason == "escalated":
        lines.append("It was not answered before its escalation time.")
    lines.append(f"Answer by {task.deadline_at.strftime('%Y-%m-%d %H:%M UTC')}.")
    notification_send(kind=f"input.{reason}", subject=subjects[reason], body="\n".join(lines),
                      link=input_page_url(task), team=run.team.slug,
                      recipients=[u.email for u in answerers(task)])
