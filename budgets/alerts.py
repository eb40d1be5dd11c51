"""Budget alerts: the one function that tells people a budget was reached or refused a step.

`budget_alert` goes out once per run and level (or per team limit and period) — a marker row
(`BudgetAlert`) under a unique constraint remembers it — to the team's owners and operators by
e-mail and to the outgoing webhook, through the notification service, in the caller's
transaction (so an alert exists exactly when the pause or the reservation it reports does).
Kept to this one function so a general alerts app can route it later.
"""
from django.conf import settings
from django.db import IntegrityError, transaction

from notifications.services import notification_send
from orchestrator.models import Role, Run, TeamMembership

from .models import BudgetAlert

KINDS = ("budget.warning", "budget.denied")


def budget_alert(*, kind: str, run: Run, key: str, level: str, message: str) -> bool:
    """Tell the run's team that `level` of `run` was reached (`budget.warning`) or refused a
    dispatch (`budget.denied`); `key` says what it is sent once for. True if it went out now,
    False if it went out before. Raises ValueError for another kind."""
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
    recipients = TeamMembership.objects.filter(
        team_id=run.team_id, role__in=(Role.OWNER, Role.OPERATOR)).exclude(user__email="")
    notification_send(kind=kind, subject=subject, body=body, team=run.team.slug,
                      link=f"{settings.STEPWISE_BASE_URL}/admin/orchestrator/run/{run.id}/change/",
                      recipients=[m.user.email for m in recipients.select_related("user")])
    return True
