"""A trigger's owner edits and saves a schedule, a webhook and a queue trigger on their admin
pages in a real browser; the schedule's next slots are previewed in its zone before saving.

Named to run before the other browser tests of a session: the session's one server process
caches content type ids, which the flush between transactional tests renumbers, and a save
through a Django admin form writes a LogEntry with the cached id (a foreign key that no longer
exists, a 500) once an earlier test's pages filled that cache."""
import re

import pytest

from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Role
from tests.factories import SETUP, example_definition
from triggers.models import Trigger
from triggers.services.config import trigger_create

from .test_roles import Walk, person, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]

TEMPLATE = {"ticket_id": "{{ payload.ticket }}", "body": "{{ payload.text }}",
            "customer_email": "{{ payload.email }}"}
DIGEST = {"ticket_id": "digest-{{ slot }}", "body": "Daily digest at {{ slot }}",
          "customer_email": "ops@example.com"}
# A slot as the page shows it: "Mon 7 Dec 09:00 CET" (CEST in summer).
MONDAY_NINE_PARIS = re.compile(r"Mon \d{1,2} \w{3} 09:00 CES?T")


def save(walk: Walk, trigger: Trigger) -> None:
    page = walk.page
    with page.expect_navigation(timeout=30000):  # a shared machine may be slow to answer
        page.click("input[name=_save]")
    page.wait_for_load_state("load")
    assert page.query_selector(".messagelist .success"), (
        page.url, page.inner_text("body")[:3000], walk.problems)
    assert re.search(r"/admin/triggers/trigger/(\?.*)?$", page.url), page.url
    assert f"{trigger.name}" in page.inner_text(".messagelist .success")


def test_an_editor_edits_and_saves_a_schedule_a_webhook_and_a_queue_trigger(
        browser_page, fresh_web_server, team):
    web_server = fresh_web_server
    editor = person(team, "tess_trigger_owner", role=Role.EDITOR)
    workflow_save(team=team, definition=example_definition("support"), actor=SETUP)
    schedule, _ = trigger_create(team=team, kind="schedule", name="support-digest",
                                 workflow="support-reply", actor=SETUP, cron="0 9 * * mon-fri",
                                 enabled=False, input_template=DIGEST)
    webhook, _ = trigger_create(team=team, kind="webhook", name="tickets",
                                workflow="support-reply", actor=SETUP, input_template=TEMPLATE)
    queue, _ = trigger_create(team=team, kind="queue", name="ticket-events",
                              workflow="support-reply", actor=SETUP, source="rabbitmq",
                              exchange="tickets", binding_key="tickets.created",
                              input_template=TEMPLATE)
    walk = Walk(browser_page, web_server, "editor")
    page = browser_page
    sign_in(walk, editor.username)

    walk.visit(f"/admin/triggers/trigger/{schedule.id}/change/")
    page.fill("#id_cron", "0 9 * * mon")
    page.fill("#id_timezone", "Europe/Paris")
    page.check("#id_enabled")  # the README's first trigger step: set a cron, enable, save
    page.wait_for_function("document.querySelector('#schedule-preview').dataset.previewed"
                           " === '0 9 * * mon|Europe/Paris|'")
    previewed = page.inner_text("#schedule-preview")
    assert previewed.startswith("If saved now:")
    assert len(MONDAY_NINE_PARIS.findall(previewed)) == 5, previewed
    save(walk, schedule)
    schedule.refresh_from_db()
    assert (schedule.cron, schedule.timezone, schedule.enabled) == ("0 9 * * mon", "Europe/Paris", True)
    walk.visit(f"/admin/triggers/trigger/{schedule.id}/change/")
    assert len(MONDAY_NINE_PARIS.findall(page.inner_text("#schedule-preview"))) == 5

    walk.visit(f"/admin/triggers/trigger/{webhook.id}/change/")
    page.fill("#id_replay_window_s", "120")
    page.fill("#id_description", "Tickets from the help desk")
    save(walk, webhook)
    webhook.refresh_from_db()
    assert (webhook.replay_window_s, webhook.description) == (120, "Tickets from the help desk")

    walk.visit(f"/admin/triggers/trigger/{queue.id}/change/")
    page.fill("#id_binding_key", "tickets.*")
    page.fill("#id_max_per_minute", "30")
    save(walk, queue)
    queue.refresh_from_db()
    assert (queue.binding_key, queue.max_per_minute) == ("tickets.*", 30)

    # A template that cannot make the workflow's input is marked on its field, and not saved.
    walk.visit(f"/admin/triggers/trigger/{schedule.id}/change/")
    page.fill("#id_input_template", '{"ticket_id": "x", "body": "y"}')
    page.click("input[name=_save]")
    page.wait_for_selector(".errornote")
    assert "customer_email" in page.inner_text(".field-input_template .errorlist")
    assert Trigger.objects.get(pk=schedule.pk).input_template == DIGEST
    assert not walk.problems, "\n".join(walk.problems)
