"""The run page and the operations page (in the admin), their JSON state, and the operator
controls with their confirmation.

Thin entry points: what a page shows is read by `orchestrator.web.progress` / `orchestrator.
operations` and scoped with `authz.visible`; what an operator does is one service
(`services.operators`, `services.runs`), which checks the permission itself and is audited.
The pages draw themselves from the JSON (static/stepwise/run_live.js, operations_live.js) and
re-read it on every websocket nudge.
"""
from dataclasses import asdict

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.core.serializers.json import DjangoJSONEncoder
from django.http import Http404, HttpResponseNotAllowed, JsonResponse
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import reverse

from orchestrator.engine.authz import Action, may, visible
from orchestrator.engine.errors import Forbidden, NotAllowed
from orchestrator.engine.limits import breaker_states, known_dependencies, saturation_of
from orchestrator.engine.provenance import describe
from orchestrator.engine.quotas import quota_usage
from orchestrator.engine.retry import NEVER_RETRIED
from orchestrator.engine.selectors import runs_with_version
from orchestrator.engine.services.operators import run_resume, step_retry, step_skip
from orchestrator.engine.services.runs import run_cancel
from orchestrator.engine.states import RUN_CANCELLABLE, STEP_RECOVERABLE, RunState
from orchestrator.integrations.providers import route_dependencies
from orchestrator.models import Run, StepRun
from orchestrator.operations.overview import operations_snapshot

from ..progress import run_snapshot
from .forks import fork_context


def _visible_run(request, run_id) -> Run:
    run = visible(runs_with_version(), request.user).filter(id=run_id).first()
    if run is None:
        raise Http404("no such run, or not one of your teams'")
    return run


def run_state(request, run_id) -> JsonResponse:
    """The run page's data (progress.run_snapshot), with the links and the controls the
    person may use."""
    run = _visible_run(request, run_id)
    snapshot = run_snapshot(run)
    for approval in snapshot["approvals"]:
        approval["url"] = reverse("admin:approvals_approvalrequest_change", args=[approval["id"]])
    for task in snapshot["inputs"]:
        task["url"] = reverse("admin:approvals_inputtask_change", args=[task["id"]])
    snapshot["controls"] = _controls(request.user, run, snapshot)
    for step in snapshot["steps"]:
        step["url"] = reverse("admin:orchestrator_steprun_change", args=[step["id"]])
        if step["reused_from"]:  # the run it came from is the same team's: visible too
            step["reused_from"]["url"] = reverse("admin:orchestrator_run_live",
                                                 args=[step["reused_from"]["run"]])
    return JsonResponse(snapshot, encoder=DjangoJSONEncoder)


def _controls(user, run: Run, snapshot: dict) -> dict:
    """Which controls to offer: a hint for the page; the service decides when one is used."""
    team = run.team
    base = reverse("admin:orchestrator_run_live", args=[run.id])
    controls = {}
    if run.state in RUN_CANCELLABLE and may(user, Action.RUN_CANCEL, team=team, run=run):
        controls["cancel"] = f"{base}operate/cancel/"
    if run.state == RunState.PAUSED:
        if may(user, Action.RUN_RESUME, team=team):
            controls["resume"] = f"{base}operate/resume/"
        failed = [s for s in snapshot["steps"] if s["state"] in STEP_RECOVERABLE]
        if failed and may(user, Action.STEP_RETRY, team=team):
            controls["retry"] = {s["name"]: f"{base}operate/retry/?step={s['id']}" for s in failed}
        if failed and may(user, Action.STEP_SKIP, team=team):
            controls["skip"] = {s["name"]: f"{base}operate/skip/?step={s['id']}" for s in failed}
    return controls


def run_page(request, run_id, *, admin_context: dict) -> TemplateResponse:
    run = _visible_run(request, run_id)
    context = {
        **admin_context,
        "title": f"Run {run.id}",
        "subtitle": f"{run.version.workflow.name} v{run.version.number}",
        "run": run,
        "started_by": describe(run.provenance),
        "opts": Run._meta,
        "state_url": reverse("admin:orchestrator_run_state", args=[run.id]),
        "socket_path": f"/ws/runs/{run.id}/",
        "details_url": reverse("admin:orchestrator_run_change", args=[run.id]),
        "timeline_url": reverse("admin:audit_run_timeline", args=[run.id]),
        "fork": fork_context(request.user, run),
    }
    return TemplateResponse(request, "admin/orchestrator/run/live.html", context)


_OPERATIONS = {
    "cancel": ("Cancel this run", "Nothing new starts; running steps finish, then the run is "
               "cancelled. Open approvals are withdrawn and child runs are cancelled."),
    "resume": ("Resume this run", "The paused run goes on from where it stopped."),
    "retry": ("Retry step", "The failed step runs again; a side effect it already made is not "
              "repeated (the effect ledger answers with the first result)."),
    "skip": ("Skip step", "The run goes on without this failed step; steps that need its output "
             "see it as skipped."),
}


def retry_warning(step: StepRun) -> str:
    """What to know before retrying a step whose error the retry table never retries: the same
    attempt will most likely fail the same way ("" for an error worth simply trying again)."""
    error = step.error or {}
    kind = error.get("class")
    if kind not in NEVER_RETRIED:
        return ""
    message = str(error.get("message") or "")[:300]
    return (f"This step failed with a {kind} error{f' ({message})' if message else ''}, which "
            "is never retried automatically: run again unchanged it will most likely fail the "
            "same way. Retry once its cause is fixed (the data, a credential, a policy, the "
            "service it calls); otherwise skip the step or cancel the run.")


def run_operate(request, run_id, operation: str, *, admin_context: dict) -> TemplateResponse:
    """GET: the confirmation page; POST: perform the operation through its service."""
    if operation not in _OPERATIONS:
        raise Http404(operation)
    run = _visible_run(request, run_id)
    step = None
    if operation in ("retry", "skip"):
        step_id = request.GET.get("step", "")
        # Only a step of this run: the page shows the step's name and error before asking. An
        # id that is no number is not found either (Django finds none for one out of range).
        step = (StepRun.objects.filter(run=run, id=step_id).first()
                if step_id.isascii() and step_id.isdigit() else None)
        if step is None:
            raise Http404("no such step in this run")
    page = reverse("admin:orchestrator_run_live", args=[run.id])
    if request.method == "POST":
        try:
            if operation == "cancel":
                run_cancel(run_id=run.id, actor=request.user, reason="cancelled from the run page")
            elif operation == "resume":
                run_resume(run_id=run.id, actor=request.user)
            elif operation == "retry":
                step_retry(step_id=step.id, actor=request.user)
            else:
                step_skip(step_id=step.id, actor=request.user)
        except Forbidden as exc:
            raise PermissionDenied(str(exc)) from exc
        except NotAllowed as exc:
            messages.error(request, str(exc))
            return redirect(page)
        done = {"cancel": "Cancel requested", "resume": "Resumed",
                "retry": f"Step {step.name if step else ''} queued again",
                "skip": f"Step {step.name if step else ''} skipped"}[operation]
        messages.success(request, f"{done}.")
        return redirect(page)
    if request.method != "GET":
        return HttpResponseNotAllowed(["GET", "POST"])
    title, explanation = _OPERATIONS[operation]
    context = {**admin_context, "title": f"{title}{f' {step.name}' if step else ''}?",
               "run": run, "step": step, "explanation": explanation, "opts": Run._meta,
               "page_url": page, "operation": operation,
               "warning": retry_warning(step) if operation == "retry" else ""}
    return TemplateResponse(request, "admin/orchestrator/run/operate_confirm.html", context)


def operations_state(request) -> JsonResponse:
    snapshot = operations_snapshot(user=request.user)
    # The dependencies every team's work shares, as /metrics gives them: for operators.
    snapshot["dependencies"] = [asdict(reading) for reading in saturation_of(known_dependencies())] \
        if snapshot["queues"] is not None else None
    snapshot["routes"] = _route_health() if snapshot["queues"] is not None else None
    snapshot["quotas"] = [asdict(reading) for reading in quota_usage()] \
        if snapshot["queues"] is not None else None
    return JsonResponse(snapshot, encoder=DjangoJSONEncoder)


def _route_health() -> list[dict]:
    """Each route of a routed model and its shared breaker: closed, open or half-open."""
    routes = route_dependencies(settings.STEPWISE_MODELS)
    states = breaker_states([route["dependency"] for route in routes])
    return [{**route, **asdict(state)} for route, state in zip(routes, states, strict=True)]


def operations_page(request, *, admin_context: dict) -> TemplateResponse:
    context = {**admin_context, "title": "Operations",
               "state_url": reverse("admin:orchestrator_operations_state"),
               "socket_path": "/ws/runs/"}
    return TemplateResponse(request, "admin/orchestrator/operations.html", context)
