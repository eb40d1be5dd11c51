"""Triggers in the admin: created and changed through the services, the secret shown once."""
import json
import re

import pytest
from django.test import Client

from audit.models import AuditEntry
from orchestrator.models import Role
from tests.factories import member
from triggers.models import Trigger

pytestmark = pytest.mark.django_db

FORM = {"name": "inbox", "description": "", "enabled": "on", "input_template": "null",
        "filter": "", "max_per_minute": "60", "when_limited": "refuse", "max_queued": "100",
        "cron": "", "timezone": "UTC", "interval_s": "", "missed_slots": "skip",
        "catch_up_max": "3", "replay_window_s": "300", "max_body_bytes": "262144",
        "source": "", "exchange": "", "binding_key": "", "queue": "", "stream": "", "correlate": "",
        "uncorrelated": "refuse", "capacity": ""}


def admin_for(team, role: str) -> Client:
    client = Client()
    client.force_login(member(team, role, role=role, staff=True))
    return client


def test_an_editor_creates_a_webhook_and_sees_its_secret_once(team, support):
    editor = admin_for(team, Role.EDITOR)
    page = editor.post("/admin/triggers/trigger/add/", {
        **FORM, "team": team.id, "kind": "webhook", "workflow": support.workflow_id})

    assert page.status_code == 200, page.content[:3000]
    html = page.content.decode()
    secret = re.search(r'id="webhook-secret">(whsec_[^<]+)<', html).group(1)
    assert "no-store" in page["Cache-Control"]
    trigger = Trigger.objects.get(name="inbox")
    assert trigger.secret_fingerprint in html and secret not in trigger.secret_ciphertext
    assert AuditEntry.objects.filter(action="trigger.created", actor="user:editor").exists()
    again = editor.get(f"/admin/triggers/trigger/{trigger.id}/change/").content.decode()
    assert secret not in again and trigger.secret_fingerprint in again


def test_the_form_shows_the_services_problems_next_to_the_fields(team, support):
    editor = admin_for(team, Role.EDITOR)
    page = editor.post("/admin/triggers/trigger/add/", {
        **FORM, "team": team.id, "kind": "schedule", "workflow": support.workflow_id,
        "cron": "0 25 * * *", "timezone": "Mars/Olympus"})
    assert page.status_code == 200
    errors = page.context["adminform"].form.errors
    assert "cron" in errors and "timezone" in errors
    assert not Trigger.objects.exists()


def test_a_member_may_not_manage_triggers_and_staff_without_a_team_sees_none(team, support):
    member_admin = admin_for(team, Role.MEMBER)
    assert member_admin.get("/admin/triggers/trigger/add/").status_code == 403
    assert member_admin.get("/admin/triggers/trigger/").status_code == 200  # may look


def test_the_rotate_action_shows_the_new_secret_once(team, support):
    from .conftest import make_trigger

    trigger, old = make_trigger(team, "webhook")
    editor = admin_for(team, Role.EDITOR)
    page = editor.post("/admin/triggers/trigger/", {"action": "rotate_secret",
                                                    "_selected_action": [str(trigger.id)]})
    new = re.search(r'id="webhook-secret">(whsec_[^<]+)<', page.content.decode()).group(1)
    assert new != old
    trigger.refresh_from_db()
    assert trigger.previous_secret_until is not None


SCHEDULE_PAGE = ["name", "description", "workflow", "workflow_version", "enabled", "input_template",
                 "filter", "max_per_minute", "when_limited", "max_queued", "cron", "timezone",
                 "interval_s", "missed_slots", "catch_up_max", "capacity"]


def test_a_schedule_is_changed_on_its_page_with_the_fields_the_page_shows(team, support, frozen):
    from .conftest import make_trigger
    from .test_schedules import DIGEST

    trigger, _ = make_trigger(team, "schedule", name="support-digest", cron="0 3 * * *",
                              timezone="UTC", input_template=DIGEST)
    editor = admin_for(team, Role.EDITOR)
    url = f"/admin/triggers/trigger/{trigger.id}/change/"
    form = editor.get(url).context["adminform"].form
    # Neither the team, the kind nor a webhook's or a queue's settings: the page does not show them.
    assert sorted(form.fields) == sorted(SCHEDULE_PAGE)
    posted = {**{name: FORM[name] for name in SCHEDULE_PAGE if name in FORM},
              "name": "support-digest", "workflow": support.workflow_id,
              "input_template": json.dumps(DIGEST), "cron": "0 9 * * mon",
              "timezone": "Europe/Paris"}
    page = editor.post(url, posted)

    assert page.status_code == 302, page.context["adminform"].form.errors
    trigger.refresh_from_db()
    assert (trigger.cron, trigger.timezone) == ("0 9 * * mon", "Europe/Paris")
    html = editor.get(url).content.decode()
    assert re.search(r"<time datetime=\"[^\"]+\">Mon \d+ \w{3} 09:00 CE[S]?T</time>", html), html


def test_a_member_may_look_at_a_trigger_page_without_an_error(team, support):
    from .conftest import make_trigger

    trigger, _ = make_trigger(team, "webhook")
    page = admin_for(team, Role.MEMBER).get(f"/admin/triggers/trigger/{trigger.id}/change/")
    assert page.status_code == 200
    assert 'name="_save"' not in page.content.decode()  # may look, may not change


def test_the_preview_shows_the_next_slots_of_an_unsaved_schedule_in_its_zone(team, support):
    editor = admin_for(team, Role.EDITOR)
    answer = editor.get("/admin/triggers/trigger/preview-slots/",
                        {"cron": "0 9 * * mon", "timezone": "Europe/Paris", "interval_s": ""}).json()
    assert answer["errors"] == [] and len(answer["slots"]) == 5
    assert all(re.fullmatch(r"Mon \d+ \w{3} 09:00 CES?T", s["label"]) for s in answer["slots"])
    bad = editor.get("/admin/triggers/trigger/preview-slots/",
                     {"cron": "0 25 * * *", "timezone": "UTC"}).json()
    assert bad["slots"] == [] and [p["path"] for p in bad["errors"]] == ["cron"]
