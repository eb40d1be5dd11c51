"""Notifications, trigger firings and dead-lettered trigger events are deleted past their
team's (or their workflow's) policy; a pending notification, a queued firing and every row of a
team under a legal hold are kept; so is a finished run a running bulk re-run reads. Beat sends the sweep and the ledger's prune."""
from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from notifications.models import Notification
from orchestrator.celery import app
from orchestrator.engine import clock
from orchestrator.engine.clock import now
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Rerun, RerunItem, Role, Run
from retention.models import Kind
from retention.services import legal_hold_place, retention_policy_set
from retention.sweep import retention_sweep
from tests.audit.conftest import work
from tests.factories import SETUP, TeamFactory, example_definition, member
from tests.triggers.conftest import make_trigger
from triggers.models import EventDeadLetter, Firing

from .conftest import echo

pytestmark = pytest.mark.django_db

OLD, NEW = timedelta(days=60), timedelta(days=1)


def rows_of(team, *, workflow: str = "support-reply", name: str = "inbox", **template) -> dict:
    """An old and a new row of each kind for `team`, and old ones retention must keep."""
    trigger, _ = make_trigger(team, "api", name=name, workflow=workflow, **template)
    made = {}
    for label, age in (("old", OLD), ("new", NEW)):
        at = now() - age
        made[f"{label}_firing"] = Firing.objects.create(
            trigger=trigger, key=f"{label}", state=Firing.State.REFUSED, created_at=at)
        made[f"{label}_dead_letter"] = EventDeadLetter.objects.create(
            trigger=trigger, key=f"message:{label}", reason_class="malformed", created_at=at)
        made[f"{label}_notification"] = Notification.objects.create(
            kind="run.failed", subject=label, body="", team=team.slug,
            status=Notification.Status.SENT, created_at=at)
    made["queued_firing"] = Firing.objects.create(trigger=trigger, key="queued", state=Firing.State.QUEUED,
                                                  created_at=now() - OLD)
    made["pending_notification"] = Notification.objects.create(
        kind="run.failed", subject="pending", body="", team=team.slug, created_at=now() - OLD)
    return made


def exists(row) -> bool:
    return type(row).objects.filter(pk=row.pk).exists()


def test_each_kind_is_deleted_past_its_policy_and_a_held_team_keeps_everything(team):
    held_team = TeamFactory(slug="held")
    for t in (team, held_team):
        workflow_save(team=t, definition=example_definition("support"), actor=SETUP)
        owner = member(t, f"owner-{t.slug}", role=Role.OWNER)
        for kind in (Kind.NOTIFICATIONS, Kind.FIRINGS, Kind.DEAD_LETTERS):
            retention_policy_set(team=t, kind=kind, days=30, actor=owner)
    leads, _ = workflow_save(team=team, definition=example_definition("lead-routing"), actor=SETUP)
    retention_policy_set(team=team, workflow=leads.workflow, kind=Kind.FIRINGS, days=90,
                         actor=member(team, f"owner-{team.slug}", role=Role.OWNER))
    legal_hold_place(team=held_team, reason="inquiry", actor=member(held_team, "owner-held", role=Role.OWNER))
    rows = rows_of(team)
    lead_rows = rows_of(team, workflow="lead-routing", name="leads",
                        input_template={"company": "{{ payload.company }}", "score": 0.5})
    held = rows_of(held_team)

    result = retention_sweep(batch=1, collect_artifacts=False)

    assert not any(exists(rows[f"old_{k}"]) for k in ("firing", "dead_letter", "notification"))
    assert all(exists(rows[f"new_{k}"]) for k in ("firing", "dead_letter", "notification"))
    assert exists(rows["queued_firing"]) and exists(rows["pending_notification"])
    # The lead workflow's own policy keeps its firings 90 days; its dead letters follow the team's.
    assert exists(lead_rows["old_firing"]) and not exists(lead_rows["old_dead_letter"])
    assert all(exists(row) for row in held.values())
    assert result.deleted == {"triggers.Firing": 1, "triggers.EventDeadLetter": 2,
                              "notifications.Notification": 2}
    assert result.batches == 5 and result.complete  # one row per transaction


def test_without_a_policy_or_a_default_nothing_is_deleted_and_a_default_applies(team, settings):
    workflow_save(team=team, definition=example_definition("support"), actor=SETUP)
    rows = rows_of(team)
    assert not retention_sweep(collect_artifacts=False).deleted
    assert all(exists(row) for row in rows.values())
    settings.STEPWISE_RETENTION_DEFAULTS = {"notifications": 30}
    assert retention_sweep(collect_artifacts=False).deleted == {"notifications.Notification": 1}
    assert not exists(rows["old_notification"]) and exists(rows["old_firing"])


def test_beat_sends_the_sweep_to_the_orchestrator_queue_and_the_prune_to_the_audit_queue():
    schedule = settings.CELERY_BEAT_SCHEDULE
    assert schedule["stepwise-retention"]["task"] == "retention.tasks.sweep"
    assert schedule["stepwise-retention"]["options"]["queue"] == "orchestrator"
    assert schedule["stepwise-retention-ledger"]["task"] == "retention.tasks.prune_ledger"
    assert schedule["stepwise-retention-ledger"]["options"]["queue"] == "audit"
    app.loader.import_default_modules()
    assert {"retention.tasks.sweep", "retention.tasks.prune_ledger"} <= set(app.tasks)


def test_a_finished_run_a_running_bulk_rerun_starts_again_is_kept_until_the_rerun_is_done(team, monkeypatch):
    owner = member(team, "owner", role=Role.OWNER)
    version = echo(team)
    source, other = (work(run_start(version=version, input={"a": n}, actor=SETUP)) for n in "st")
    rerun = Rerun.objects.create(team=team, version=version, actor="user:owner", key="k-1",
                                 request_digest="d" * 64)
    RerunItem.objects.create(rerun=rerun, position=0, source_run=source)
    retention_policy_set(team=team, kind=Kind.RUNS, days=1, actor=owner)
    monkeypatch.setattr(clock, "_source", lambda: timezone.now() + timedelta(days=2))

    assert retention_sweep(collect_artifacts=False).deleted["orchestrator.Run"] == 1
    assert Run.objects.filter(pk=source.pk).exists() and not Run.objects.filter(pk=other.pk).exists()
