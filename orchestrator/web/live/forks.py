"""What the run page's Fork dialog offers (templates/admin/orchestrator/run/fork_dialog.html,
static/stepwise/run_fork.js): the steps to fork from, the versions, the side-effecting steps
whose effects may be repeated, and the links to the run's source and forks.

A hint for the page only: the dialog posts to `POST /api/v1/runs/<id>/fork/`, whose service
(`services.forks.run_fork`) decides and checks everything.
"""
import json

from django.urls import reverse

from orchestrator.engine.authz import Action, may
from orchestrator.engine.selectors import definition_of
from orchestrator.models import Run


def fork_context(user, run: Run) -> dict:
    """{"links": {"source", "forks"}, "dialog": {...} or None when the person may not fork}."""
    live = "admin:orchestrator_run_live"
    links = {
        "source": ({"id": str(run.forked_from_id), "step": run.fork_step,
                    "url": reverse(live, args=[run.forked_from_id])}
                   if run.forked_from_id else None),
        "forks": [{"id": str(f.id), "step": f.fork_step, "state": f.state,
                   "url": reverse(live, args=[f.id])}
                  for f in run.forks.order_by("created_at").only("id", "fork_step", "state")],
    }
    if not may(user, Action.RUN_START, team=run.team):
        return {"links": links, "dialog": None}
    definition, graph = definition_of(run)
    steps = list(graph.order)
    versions = list(run.version.workflow.versions.order_by("-number").values_list("number", flat=True))
    effects = [s["name"] for s in definition["steps"]
               if s.get("side_effect") or (isinstance(s.get("item"), dict) and s["item"].get("side_effect"))]
    return {"links": links, "dialog": {
        "url": reverse("api:run-fork", args=[run.id]),
        "steps": steps, "versions": versions, "version": run.version.number,
        "effects": effects,
        "input": json.dumps(run.input, indent=2, sort_keys=True),
    }}
