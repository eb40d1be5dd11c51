"""Budget alerts: the one function that tells people a budget was reached or refused a step.

`budget_alert` goes out once per run and level (or per team limit and period) — a marker row
(`BudgetAlert`) under a unique constraint remembers it — as an alert of the alerts app
(`alerts.services.alert_raise`: rule `budget.warning` or `budget.denied`, on by default,
configurable per team and workflow, listed in the admin with acknowledge/resolve), which e-mails
the team's owners and operators and posts to the outgoing webhook through the notification
service, in the caller's transaction (so an alert exists exactly when the pause or the
reservation it reports does).
"""
from django.db import IntegrityError, transaction

from alerts.services import alert_raise
from orchestrator.models import Run

from .models import BudgetAlert

KINDS = ("budget.warning", "budget.denied")


def budget_alert(*, kind: str, run: Run, key: str, level: str, message: str) -> bool:
    """Tell the run's team that `level` of `run` was reached (`budget.warning`) or refused a
    dispatch (`budget.denied`); `key` says what it is sent once for. True if it went out now,
    False if it went out before (or the team turned the rule off). Raises ValueError for another
    kind."""
    if kind not in KINDS:
        raise ValueError(f"unknown budget alert kind: {kind}")
    try:
        with transaction.atomic():
            BudgetAlert.objects.create(kind=kind, key=key)
    except IntegrityError:
        return False
    workflow = run.version.workflow.name
    what = "reached its warning threshold" if kind == "budget.warning" else "stopped a step"
    subject = f"Budget {what}: {workflow} ({level})"
    body = "\n".join([
        f"Run {run.id} of {workflow} (team {run.team.slug}): the {level} budget {what}.",
        message,
        "The run is paused; an operator may raise its limit and resume it."
        if kind == "budget.denied" else "The run goes on; the next step past the limit will pause it.",
    ])
    return alert_raise(kind, team=run.team, run=run, key=f"{kind}:{key}", subject=subject,
                       body=body) is not None
