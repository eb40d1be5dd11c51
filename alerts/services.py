"""Raising, acknowledging and resolving alerts: the one place an alert row is written.

`alert_raise` is the service any code calls to raise an alert (the outbox reader in
`alerts.detection`, the budget checks): it applies the team's and workflow's rule, writes the
alert under its unique key and, in the same transaction, the notification that tells the
team's owners and operators (e-mail) and the outgoing webhook. A key raised before raises
nothing: one alert per condition per run, however often the condition is seen.

Nothing here makes a network call; delivery happens after commit (`notifications`).
"""
import logging

from django.conf import settings
from django.db import IntegrityError, transaction

from notifications.services import notification_send
from orchestrator.engine.authz import Action, Actor, person, require
from orchestrator.engine.clock import now
from orchestrator.engine.errors import NotAllowed
from orchestrator.models import Role, Run, Team, TeamMembership
from orchestrator.operations.metrics import ALERTS

from .models import Alert, AlertRule, AlertState
from .rules import DEFAULTS, Rule, RuleKind

log = logging.getLogger(__name__)


def rule_for(kind: RuleKind | str, *, team: Team, workflow_id: int | None = None) -> Rule:
    """The rule in force for `team` (and one of its workflows): the workflow's row, else the
    team's row, else the default. A row's empty threshold keeps the default's."""
    kind = RuleKind(kind)
    rule = DEFAULTS[kind]
    rows = _rows(kind, team, workflow_id)
    row = rows.get(workflow_id) if workflow_id is not None else None
    row = row or rows.get(None)
    if row is None:
        return rule
    threshold = row.threshold if row.threshold is not None else rule.threshold
    return Rule(kind, row.enabled, threshold, rule.severity, rule.unit, rule.description)


def _rows(kind: RuleKind, team: Team, workflow_id: int | None) -> dict:
    rows = AlertRule.objects.filter(kind=kind, team=team)
    return {row.workflow_id: row for row in rows
            if row.workflow_id is None or row.workflow_id == workflow_id}


def alert_recipients(team: Team) -> list[str]:
    """The e-mail addresses of the team's owners and operators."""
    return sorted({address for address in TeamMembership.objects.filter(
        team=team, role__in=[Role.OWNER, Role.OPERATOR], user__is_active=True)
        .values_list("user__email", flat=True) if address})


def alert_raise(rule: RuleKind | str, *, team: Team, run: Run | None = None, key: str,
                subject: str, body: str, workflow_id: int | None = None) -> Alert | None:
    """Raise the alert `key` once: write it and its notification, unless the rule is off for
    the team (or the run's workflow) or an alert with that key exists.

    A sandboxed run (an evaluation's, a shadow's: `Run.sandbox`) raises none: what it does is
    measured, not an incident anyone is told of.

    Returns the new alert, or None when nothing was raised. Raises ValueError for an empty
    subject or body (an alert says something real).
    """
    kind = RuleKind(rule)
    if not subject.strip() or not body.strip():
        raise ValueError("an alert needs a subject and a body")
    if run is not None and run.sandbox is not None:
        return None
    if workflow_id is None and run is not None:
        workflow_id = run.version.workflow_id
    in_force = rule_for(kind, team=team, workflow_id=workflow_id)
    if not in_force.enabled or Alert.objects.filter(key=key).exists():
        return None
    # The run's live page: its failing step, with the error, is one click from the e-mail.
    link = (f"{settings.STEPWISE_BASE_URL.rstrip('/')}/admin/orchestrator/run/{run.pk}/live/"
            if run is not None else "")
    try:
        with transaction.atomic():
            alert = Alert.objects.create(key=key[:255], rule=kind, severity=in_force.severity,
                                         team=team, run=run, subject=subject[:200], body=body)
            alert.notification = notification_send(
                kind=f"alert.{kind}", subject=f"[Stepwise {in_force.severity}] {subject}",
                body=body, link=link, recipients=alert_recipients(team), team=team.slug)
            if alert.notification is not None:
                alert.save(update_fields=["notification"])
    except IntegrityError:  # raised at the same moment elsewhere: that one stands
        return None
    transaction.on_commit(lambda: ALERTS.labels(str(kind), str(in_force.severity)).inc(),
                          robust=True)
    log.warning("alert raised: %s", subject, extra={"alert_rule": str(kind), "alert_key": key})
    return alert


def _handle(alert_id: int, *, actor: Actor, target: AlertState) -> Alert:
    with transaction.atomic():
        alert = Alert.objects.select_for_update().select_related("team").get(pk=alert_id)
        require(actor, Action.ALERT_HANDLE, team=alert.team, run=None)
        if alert.state == AlertState.RESOLVED:
            raise NotAllowed(f"alert {alert_id} is resolved already")
        if target == AlertState.ACKNOWLEDGED:
            if alert.state == AlertState.ACKNOWLEDGED:
                return alert
            alert.acknowledged_at, alert.acknowledged_by = now(), person(actor)
        else:
            alert.resolved_at, alert.resolved_by = now(), person(actor)
        alert.state = target
        alert.save()
    log.info("alert %s %s", alert_id, target, extra={"alert_key": alert.key})
    return alert


def alert_acknowledge(*, alert_id: int, actor: Actor) -> Alert:
    """Someone is on it. Raises Forbidden without `alert.handle` in the alert's team,
    NotAllowed for a resolved alert."""
    return _handle(alert_id, actor=actor, target=AlertState.ACKNOWLEDGED)


def alert_resolve(*, alert_id: int, actor: Actor) -> Alert:
    """The condition is dealt with. Raises Forbidden without `alert.handle` in the alert's
    team, NotAllowed for a resolved alert."""
    return _handle(alert_id, actor=actor, target=AlertState.RESOLVED)
