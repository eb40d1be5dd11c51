"""What the operations page shows: runs by state, the steps waiting by kind, queues, workers,
paused runs, dead letters, and each team's failure rate and spend today.

Reads only (the selectors layer). Everything about runs is scoped to the teams the person may
see (`authz.visible`); the deployment's queues and workers are shown to operators only, as for
the API's health details (docs/permissions.md).
"""
from datetime import timedelta
from decimal import Decimal

from django.db.models import Count, Min, Q, Sum

from orchestrator.engine.authz import operates_somewhere, visible
from orchestrator.engine.clock import now
from orchestrator.engine.states import RunState, StepState
from orchestrator.models import DeadLetter, Run, StepRun, WorkerHeartbeat

from .queues import queue_depths

WORKER_SEEN_WITHIN = timedelta(seconds=30)  # as the health details (operations/health.py)
FAILED = (RunState.FAILED, RunState.TIMED_OUT, RunState.COMPENSATION_FAILED)
LISTED = 50  # paused runs and dead letters shown; the admin's lists have the rest


def _start_of_today():
    return now().replace(hour=0, minute=0, second=0, microsecond=0)


def waiting_steps_counted(user):
    """The steps waiting now (for a person, a time, a child run, map items...) that `user` may
    see, grouped by kind: `kind`, `n` and `since` (when the kind's longest wait began), in kind
    order. One query over the index of waiting steps (`step_waiting_kind`)."""
    steps = visible(StepRun.objects.filter(state=StepState.WAITING), user, team_field="run__team")
    return steps.values("kind").annotate(n=Count("id"), since=Min("started_at")).order_by("kind")


def waiting_steps(*, user, at) -> list[dict]:
    """`waiting_steps_counted`, each kind with how long its longest wait has lasted at `at`."""
    return [{"kind": row["kind"], "waiting": row["n"], "oldest_since": row["since"],
             "oldest_age_s": round((at - row["since"]).total_seconds()) if row["since"] else None}
            for row in waiting_steps_counted(user)]


def operations_snapshot(*, user) -> dict:
    at = now()
    runs = visible(Run.objects.all(), user)
    by_state = dict(runs.values_list("state").annotate(n=Count("id")).values_list("state", "n"))
    today = _start_of_today()
    teams = (runs.filter(created_at__gte=today).values("team__slug").annotate(
        started=Count("id"),
        ended=Count("id", filter=Q(finished_at__isnull=False)),
        failed=Count("id", filter=Q(state__in=FAILED)),
    ).order_by("team__slug"))
    spend = dict(visible(StepRun.objects.filter(finished_at__gte=today), user, team_field="run__team")
                 .values_list("run__team__slug").annotate(s=Sum("cost_usd")).values_list("run__team__slug", "s"))
    per_team = []
    for row in teams:
        per_team.append({"team": row["team__slug"], "started": row["started"], "ended": row["ended"],
                         "failed": row["failed"],
                         "failure_rate": round(row["failed"] / row["ended"], 4) if row["ended"] else None,
                         "spend_usd": spend.pop(row["team__slug"], None) or Decimal("0")})
    for slug, amount in sorted(spend.items()):  # spend today on runs started earlier
        per_team.append({"team": slug, "started": 0, "ended": 0, "failed": 0,
                         "failure_rate": None, "spend_usd": amount or Decimal("0")})
    paused = (runs.filter(state=RunState.PAUSED).select_related("version__workflow", "team")
              .defer("version__definition", "version__normalized", "input", "output")
              .order_by("progressed_at")[:LISTED])
    letters = (visible(DeadLetter.objects.filter(status=DeadLetter.Status.OPEN), user, team_field="run__team")
               .select_related("step").order_by("-created_at"))
    operator = operates_somewhere(user)
    return {
        "generated_at": at,
        "runs_by_state": by_state,
        "waiting_steps": waiting_steps(user=user, at=at),
        "teams_today": per_team,
        "paused": [{"id": str(r.id), "workflow": r.version.workflow.name, "team": r.team.slug,
                    "since": r.progressed_at, "reason": (r.error or {}).get("message") or (r.error or {}).get("class") or ""}
                   for r in paused],
        "dead_letters": {"open": letters.count(), "latest": [
            {"id": d.id, "run": str(d.run_id), "step": d.step.name, "error_class": d.error_class,
             "error": d.error_message[:200], "at": d.created_at} for d in letters[:LISTED]]},
        "queues": [q.__dict__ for q in queue_depths()] if operator else None,
        "workers": list(WorkerHeartbeat.objects.filter(last_seen__gte=now() - WORKER_SEEN_WITHIN)
                        .order_by("hostname").values("hostname", "queues", "pid", "last_seen"))
        if operator else None,
    }
