"""Reads of triggers that the services, the entry points and the consumer share.

Reads only: no writes, no dispatch, no permission checks (`orchestrator.engine.authz` does those).
"""
from django.conf import settings
from django.db.models import QuerySet

from orchestrator.engine.authz import System
from orchestrator.engine.selectors import version_to_start
from orchestrator.models import WorkflowVersion

from .models import Trigger, TriggerKind


def trigger_actor(trigger: Trigger) -> System:
    """Who starts a schedule's, a webhook's or a queue event's runs: the trigger itself
    ("trigger:<id>" in events and the ledger), acting for its team."""
    return System(str(trigger.id), kind="trigger")


def version_to_run(trigger: Trigger) -> WorkflowVersion | None:
    """The version a firing starts: the pinned one, or the workflow's published one."""
    if trigger.workflow_version:
        return trigger.workflow.versions.filter(number=trigger.workflow_version).first()
    return version_to_start(team=trigger.team, name=trigger.workflow.name)


def webhook_trigger(trigger_id) -> Trigger | None:
    """The webhook trigger at this URL, enabled or not (None for any other id)."""
    return Trigger.objects.select_related("team", "workflow").filter(
        id=trigger_id, kind=TriggerKind.WEBHOOK).first()


def queue_triggers() -> QuerySet[Trigger]:
    """The enabled queue-event triggers, which the consumer reads."""
    return Trigger.objects.select_related("team", "workflow").filter(
        kind=TriggerKind.QUEUE, enabled=True).order_by("id")


def source_url(name: str) -> str | None:
    return settings.STEPWISE_EVENT_SOURCES.get(name)
