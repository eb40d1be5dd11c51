"""Budget alerts: telling people a budget was reached or refused a step, once per condition.

The budget gate (`orchestrator.engine.services.budget_gate`) records each such outcome as an outbox
event of kind `budget.warning` or `budget.denied` the first time it sees it — once per run and
level (or per team limit and period): `budget_outcome_first` claims a marker row
(`BudgetAlert`) under a unique constraint, in the gate's transaction, so the event exists exactly
when the reservation or the pause it reports does. Alert detection (`alerts.detection`) reads the
event and calls `budget_alert`, which raises it as an alert of the alerts app
(`alerts.services.alert_raise`: rule `budget.warning` or `budget.denied`, on by default,
configurable per team and workflow, listed in the admin with acknowledge/resolve); that e-mails
the team's owners and operators and posts to the outgoing webhook through the notification
service.
"""
from django.db import IntegrityError, transaction

from alerts.services import alert_raise
from orchestrator.models import Run

from .models import BudgetAlert

KINDS = ("budget.warning", "budget.denied")


def budget_outcome_first(*, kind: str, key: str) -> bool:
    """Whether the budget outcome `kind` for `key` (what it is told once for) is seen for the
    first time: True once, then False. Caller's transaction. Raises ValueError for another
    kind."""
    if kind not in KINDS:
        raise ValueError(f"unknown budget alert kind: {kind}")
    try:
        with transaction.atomic():
            BudgetAlert.objects.create(kind=kind, key=key)
    except IntegrityError:
        return False
    return True


def budget_alert(*, kind: str, run: Run, key: str, level: str, message: str) -> bool:
    """Tell the run's team that `level` of `run` was reached (`budget.warning`) or refused a
    dispatch (`budget.denied`); `key` says what it is sent once for. True if it went out now,
    False if it went out before (or the team turned the rule off). Raises ValueError for another
    kind."""
    if kind not in KINDS:
        raise ValueError(f"unknown budget alert kind: {kind}")
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
