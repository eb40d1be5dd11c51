"""Creating a trigger at its edges: every bound of its settings, exactly; what nobody may set;
the workflow it names; what the ledger and beat are given. Written from the mutation survivors
of `triggers/services/config.py` (docs/testing.md)."""
import json

import pytest
from django.conf import settings
from django_celery_beat.models import PeriodicTask

from audit.models import AuditEntry
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Role
from tests.factories import SETUP, TeamFactory, example_definition, member
from triggers.models import Trigger
from triggers.services.config import (
    TriggerInvalid,
    trigger_create,
    trigger_problems,
    trigger_update,
)

from .conftest import DIGEST, SUPPORT_TEMPLATE, make_trigger

pytestmark = pytest.mark.django_db


def refused(team, kind: str, **values) -> list[dict]:
    """The problems `trigger_create` refuses these settings with."""
    values.setdefault("workflow", "support-reply")
    with pytest.raises(TriggerInvalid) as error:
        trigger_create(team=team, kind=kind, name=values.pop("name", "t"), actor=SETUP, **values)
    return error.value.problems


def test_every_bound_of_a_webhooks_settings_is_refused_past_it(team, support):
    problems = refused(team, "webhook", name="", max_per_minute=0, when_limited="later",
                       max_queued=100_001, max_body_bytes=1023, replay_window_s=9,
                       workflow_version=9, input_template=SUPPORT_TEMPLATE)

    assert problems == [
        {"path": "name", "message": "is required"},
        {"path": "workflow_version", "message": "workflow 'support-reply' has no version 9"},
        {"path": "max_per_minute", "message": "must be 1 to 10,000"},
        {"path": "when_limited", "message": "must be refuse or queue"},
        {"path": "max_queued", "message": "must be at most 100,000"},
        {"path": "max_body_bytes", "message": "must be 1,024 to "
         f"{settings.STEPWISE_MAX_REQUEST_BYTES:,} (STEPWISE_MAX_REQUEST_BYTES)"},
        {"path": "replay_window_s", "message": "must be 10 to 3600"}]
    assert [p["path"] for p in refused(
        team, "webhook", max_per_minute=10_001, max_body_bytes=settings.STEPWISE_MAX_REQUEST_BYTES + 1,
        replay_window_s=3601, input_template=SUPPORT_TEMPLATE)] == [
        "max_per_minute", "max_body_bytes", "replay_window_s"]


def test_a_webhook_at_every_bound_of_its_settings_is_created(team, support):
    low, _ = make_trigger(team, "webhook", name="low", max_per_minute=1, max_queued=100_000,
                          max_body_bytes=1024, replay_window_s=10, workflow_version=1)
    high, _ = make_trigger(team, "webhook", name="high", max_per_minute=10_000,
                           max_body_bytes=settings.STEPWISE_MAX_REQUEST_BYTES,
                           replay_window_s=3600)

    assert (low.max_per_minute, high.max_per_minute) == (1, 10_000)


def test_a_schedules_own_bounds(team, support):
    problems = refused(team, "schedule", interval_s=60, missed_slots="never", catch_up_max=101,
                       input_template=DIGEST)

    assert problems == [{"path": "missed_slots", "message": "must be skip or catch_up"},
                        {"path": "catch_up_max", "message": "must be at most 100"}]
    trigger, _ = make_trigger(team, "schedule", name="most", interval_s=60, catch_up_max=100,
                              input_template=DIGEST)
    assert trigger.catch_up_max == 100


def test_a_kind_that_does_not_exist_is_the_only_problem_named(team, support):
    assert refused(team, "carrier-pigeon", name="") == [
        {"path": "kind", "message": "must be one of schedule, webhook, queue, api"}]


def test_what_nobody_may_set_and_another_kinds_settings_are_refused(team, support):
    with pytest.raises(TriggerInvalid) as error:
        trigger_create(team=team, kind="webhook", name="t", actor=SETUP, workflow="support-reply",
                       secret_ciphertext="x", revision=7, cron="* * * * *", interval_s=60,
                       stream="", queue=None)

    assert str(error.value) == "unknown fields"
    assert error.value.problems == [
        {"path": "revision", "message": "cannot be set"},
        {"path": "secret_ciphertext", "message": "cannot be set"},
        {"path": "cron", "message": "is not a setting of a webhook trigger"},
        {"path": "interval_s", "message": "is not a setting of a webhook trigger"}]


def test_a_trigger_needs_a_workflow_of_its_team(team, support):
    with pytest.raises(TriggerInvalid) as error:
        trigger_create(team=team, kind="api", name="t", actor=SETUP)
    assert (str(error.value), error.value.problems) == (
        "workflow is required", [{"path": "workflow", "message": "is required"}])
    with pytest.raises(TriggerInvalid) as error:
        trigger_create(team=team, kind="api", name="t", actor=SETUP, workflow="nope")
    assert (str(error.value), error.value.problems) == (
        "no such workflow", [{"path": "workflow", "message": "team 'support' has no workflow "
                                                             "'nope'"}])
    trigger, _ = trigger_create(team=team, kind="api", name="t", actor=SETUP,
                                workflow=support.workflow, input_template=SUPPORT_TEMPLATE)
    assert trigger.workflow == support.workflow


def test_a_created_trigger_is_recorded_with_its_settings_and_never_its_secret(team, support):
    trigger, secret = make_trigger(team, "webhook", name="hook", description=None)

    # Earlier transactional tests' entries stay in PostgreSQL's append-only ledger.
    entry = AuditEntry.objects.get(action="trigger.created", subject_id=str(trigger.id))
    payload = json.loads(entry.payload)
    assert entry.outcome == "created"
    assert "secret_fingerprint" in payload  # the ledger keeps it, redacted
    assert payload["settings"]["workflow"] == "support-reply"
    assert payload["settings"]["description"] == ""  # a null text setting reads as empty
    assert payload["settings"]["name"] == "hook"
    assert set(payload["settings"]) == {
        "name", "description", "workflow", "workflow_version", "enabled", "input_template",
        "filter", "max_per_minute", "when_limited", "max_queued", "cron", "timezone",
        "interval_s", "missed_slots", "catch_up_max", "replay_window_s", "max_body_bytes",
        "source", "exchange", "binding_key", "queue", "stream", "correlate", "uncorrelated",
        "debounce_s", "debounce_key", "debounce_max_s", "capacity"}
    assert secret not in entry.payload


def test_a_schedule_is_given_to_beat_by_cron_or_interval_and_follows_its_changes(team, support):
    trigger, _ = make_trigger(team, "schedule", name="digest", cron="30 6 * * 1-5",
                              timezone="Europe/Paris", input_template=DIGEST)

    task = PeriodicTask.objects.get(name=f"stepwise-trigger-{trigger.id}")
    trigger.refresh_from_db()
    assert trigger.periodic_task == task
    assert (task.task, json.loads(task.args), task.queue, task.enabled, task.interval) == (
        "triggers.tasks.schedule_fire", [str(trigger.id)], "orchestrator", True, None)
    assert task.description == "Stepwise trigger support/digest"
    crontab = task.crontab
    assert (crontab.minute, crontab.hour, crontab.day_of_month, crontab.month_of_year,
            crontab.day_of_week, str(crontab.timezone)) == ("30", "6", "*", "*", "1-5",
                                                            "Europe/Paris")

    trigger_update(trigger_id=trigger.id, actor=SETUP,
                   changes={"cron": None, "interval_s": 90, "enabled": False})

    task.refresh_from_db()
    assert (task.crontab, task.interval.every, task.interval.period, task.enabled) == (
        None, 90, "seconds", False)
    assert PeriodicTask.objects.count() == 1


def test_only_a_schedule_is_given_to_beat(team, support):
    make_trigger(team, "webhook", name="hook")
    make_trigger(team, "api", name="prog")
    assert not PeriodicTask.objects.exists()


def test_an_interval_schedules_template_is_checked_against_its_workflows_input(team, support):
    assert refused(team, "schedule", interval_s=60) == [
        {"path": "input_template", "message": "is required for a schedule: a slot has no "
         "payload, and workflow 'support-reply' needs an input object (the template reads "
         "{{ slot }}, {{ slot_utc }} and {{ trigger.name }})"}]


def test_a_trigger_checked_before_it_names_a_workflow_has_no_input_problem(team):
    unsaved = Trigger(team=team, kind="webhook", name="t", input_template=SUPPORT_TEMPLATE)

    assert trigger_problems(unsaved) == []


def test_a_schedules_template_is_rendered_with_its_slot_and_trigger_when_it_is_saved(team, support):
    reads_all = {"ticket_id": "{{ trigger.name }}-{{ trigger.kind }}", "body": "{{ slot_utc }}",
                 "customer_email": "ops@example.com"}
    trigger, _ = make_trigger(team, "schedule", name="all", interval_s=60,
                              input_template=reads_all)
    assert trigger.input_template == reads_all

    assert refused(team, "schedule", interval_s=60,
                   input_template={**DIGEST, "body": "{{ payload.text }}"}) == [
        {"path": "input_template.body",
         "message": "there is no 'payload' here; a template may use slot, slot_utc, trigger"}]


def test_a_name_the_team_has_is_refused_and_another_team_may_use_it(team, support):
    make_trigger(team, "webhook", name="inbox")
    with pytest.raises(TriggerInvalid) as error:
        trigger_create(team=team, kind="api", name="inbox", actor=SETUP, workflow="support-reply",
                       input_template=SUPPORT_TEMPLATE)
    assert (str(error.value), error.value.problems) == ("the trigger is invalid", [
        {"path": "name", "message": "team 'support' has a trigger 'inbox' already"}])

    theirs = TeamFactory(slug="billing", name="Billing")
    workflow_save(team=theirs, definition=example_definition("support"), actor=SETUP)
    trigger, _ = make_trigger(theirs, "webhook", name="inbox")
    assert trigger.team == theirs


def test_who_created_a_trigger_is_kept_and_recorded(team, support):
    creator = member(team, "maker", role=Role.EDITOR)
    trigger, _ = make_trigger(team, "api", name="prog")
    theirs, _ = trigger_create(team=team, kind="api", name="by-hand", actor=creator,
                               workflow="support-reply", input_template=SUPPORT_TEMPLATE)

    assert (trigger.created_by, theirs.created_by) == (None, creator)
    assert AuditEntry.objects.get(action="trigger.created",
                                  subject_id=str(theirs.id)).actor == "user:maker"


def test_only_a_webhook_has_a_secret_and_only_a_schedule_an_anchor(team, support, frozen):
    hook, secret = make_trigger(team, "webhook", name="hook")
    prog, none = make_trigger(team, "api", name="prog")
    digest, _ = make_trigger(team, "schedule", name="digest", interval_s=60, input_template=DIGEST)

    assert secret and hook.secret_fingerprint and hook.schedule_anchor is None
    assert (none, prog.secret_ciphertext, prog.secret_fingerprint, prog.schedule_anchor) == (
        None, "", "", None)
    assert (digest.secret_fingerprint, digest.schedule_anchor) == ("", frozen.moment)


def test_a_schedules_input_past_the_input_limits_is_refused_before_the_schema_reads_it(
        team, support):
    too_deep = "{{ " + "[" * 65 + "]" * 65 + " }}"

    [problem] = refused(team, "schedule", interval_s=60,
                        input_template={**DIGEST, "body": too_deep})

    assert problem == {"path": "input_template.body" + "[0]" * 63,
                       "message": "gives the run input nests deeper than 64 levels (the input "
                                  "schema of workflow 'support-reply')"}


def test_every_field_of_a_cron_reaches_beat(team, support):
    trigger, _ = make_trigger(team, "schedule", name="yearly", cron="15 9 1 6 *",
                              input_template=DIGEST)

    crontab = PeriodicTask.objects.get(name=f"stepwise-trigger-{trigger.id}").crontab
    assert (crontab.minute, crontab.hour, crontab.day_of_month, crontab.month_of_year,
            crontab.day_of_week) == ("15", "9", "1", "6", "*")


def test_a_template_with_problems_of_its_own_is_not_also_checked_against_the_input(team, support):
    assert refused(team, "webhook", name="", filter="x >",
                   input_template={**SUPPORT_TEMPLATE, "body": "{{ payload. }}"}) == [
        {"path": "name", "message": "is required"},
        {"path": "input_template.body",
         "message": "template syntax error on line 1: expected name or number"},
        {"path": "filter", "message": "CEL syntax error: x >\n  ^"}]
    assert refused(team, "webhook", input_template={**SUPPORT_TEMPLATE, "body": ["ok", "\ud800"]}
                   ) == [{"path": "input_template.body[1]",
                          "message": "the text is not valid Unicode: it holds a lone surrogate "
                                     "(U+D800), which no UTF-8 text can carry"}]


def test_a_schedules_own_problems_follow_the_others(team, support):
    assert refused(team, "schedule", name="", cron="* * *", input_template=DIGEST) == [
        {"path": "name", "message": "is required"},
        {"path": "cron", "message": "a cron expression has five fields (minute hour "
                                    "day-of-month month day-of-week), not 3"}]


def test_a_queues_own_problems_follow_the_others(team, support):
    problems = refused(team, "queue", name="", source="nowhere", input_template=SUPPORT_TEMPLATE)

    assert [problem["path"] for problem in problems] == ["name", "source"]
