"""Queue events through the service the consumer calls: dedupe by message id, dead letters with
their reason, and the replay of a dead letter from the admin and the API. The real brokers are
in tests/integration/test_trigger_consumer.py."""
import json

import pytest
from django.test import Client, override_settings

from audit.models import AuditEntry
from orchestrator.models import Role, Run
from tests.conftest import client_for
from tests.factories import SETUP, member
from triggers.models import EventDeadLetter
from triggers.services.config import trigger_update
from triggers.services.events import event_receive

from .conftest import TICKET, make_trigger

pytestmark = pytest.mark.django_db
SOURCES = {"rabbitmq": "amqp://guest:guest@127.0.0.1:5672//", "redis": "redis://127.0.0.1:6379/14"}


@pytest.fixture
def tickets(team, support):
    with override_settings(STEPWISE_EVENT_SOURCES=SOURCES):
        trigger, _ = make_trigger(team, "queue", name="tickets", source="rabbitmq",
                                  exchange="helpdesk", binding_key="tickets.*",
                                  filter="message.routing_key != 'tickets.ignored'")
        yield trigger


def receive(trigger, body, message_id="m-1", routing_key="tickets.created"):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return event_receive(trigger_id=trigger.id, message_id=message_id, body=raw,
                         meta={"exchange": "helpdesk", "routing_key": routing_key, "headers": {}})


def test_a_message_starts_a_run_and_its_redelivery_returns_the_same_run(tickets):
    first = receive(tickets, TICKET)
    again = receive(tickets, TICKET)
    assert first.status == "started" and again.status == "duplicate" and again.run == first.run
    assert first.run.trigger == "queue" and first.run.trigger_firing.key == "message:m-1"
    assert Run.objects.count() == 1


def test_a_message_without_an_id_is_recognized_by_its_content(tickets):
    first = receive(tickets, TICKET, message_id=None)
    again = receive(tickets, TICKET, message_id=None)
    assert again.status == "duplicate" and again.run == first.run


def test_a_message_the_filter_rejects_is_ignored_not_dead_lettered(tickets):
    assert receive(tickets, TICKET, routing_key="tickets.ignored").status == "ignored"
    assert not Run.objects.exists() and not EventDeadLetter.objects.exists()


@pytest.mark.parametrize("body, reason, path", [
    (b"{not json", "malformed", "body"),
    (b"\xff\xfe", "malformed", "body"),
    ({"ticket": "T-1"}, "template_failed", "input_template.body"),
    ({"ticket": "T-1", "text": "", "email": "c@example.com"}, "invalid_input", "input.body"),
    ({"ticket": "T-1", "text": "x" * 300_000, "email": "c@example.com"}, "too_large", "body"),
])
def test_a_malformed_or_invalid_message_lands_in_the_dead_letters_with_its_reason(
        tickets, body, reason, path):
    outcome = receive(tickets, body)
    letter = EventDeadLetter.objects.get()
    assert outcome.status == "invalid" and not Run.objects.exists()
    assert (letter.reason_class, letter.key, letter.status) == (reason, "message:m-1", "open")
    assert letter.problems[0]["path"] == path
    assert letter.body_complete is (reason != "too_large")
    assert AuditEntry.objects.filter(action="trigger.dead_lettered", outcome=reason).exists()
    receive(tickets, body)  # delivered again: the same letter, one more attempt
    assert EventDeadLetter.objects.get().attempts == 2


def test_a_firing_refused_by_admission_control_is_dead_lettered_too(tickets):
    trigger_update(trigger_id=tickets.id, actor=SETUP, changes={"max_per_minute": 1})
    receive(tickets, TICKET, message_id="m-1")
    receive(tickets, TICKET, message_id="m-2")
    assert EventDeadLetter.objects.get().reason_class == "rate"


def test_an_operator_replays_a_dead_letter_from_the_admin_once_the_cause_is_fixed(tickets, team):
    receive(tickets, {"ticket": "T-1", "body": "wrong field names", "email": "c@example.com"})
    letter = EventDeadLetter.objects.get()
    operator = member(team, "op", role=Role.OPERATOR, staff=True)
    admin = Client()
    admin.force_login(operator)
    replay = {"action": "replay", "_selected_action": [str(letter.id)]}

    admin.post("/admin/triggers/eventdeadletter/", replay)  # still failing: stays open
    letter.refresh_from_db()
    assert (letter.status, letter.attempts) == ("open", 2)
    trigger_update(trigger_id=tickets.id, actor=SETUP, changes={"input_template": {
        "ticket_id": "{{ payload.ticket }}", "body": "{{ payload.body }}",
        "customer_email": "{{ payload.email }}"}})
    admin.post("/admin/triggers/eventdeadletter/", replay)
    letter.refresh_from_db()
    assert letter.status == "replayed" and letter.replayed_by == operator
    assert letter.run.input["body"] == "wrong field names"
    assert AuditEntry.objects.filter(action="trigger.dead_letter_replayed",
                                     actor="user:op").exists()
    # the same message delivered again now is the run's duplicate, not a second run
    assert receive(tickets, {"ticket": "T-1"}).status == "duplicate"
    assert Run.objects.count() == 1


def test_replaying_needs_the_redrive_permission_and_happens_once(tickets, team, api):
    receive(tickets, b"{oops")
    letter = EventDeadLetter.objects.get()
    assert api.post(f"/api/v1/event-dead-letters/{letter.id}/replay/").status_code == 403  # an editor
    operator = client_for(member(team, "op", role=Role.OPERATOR))
    EventDeadLetter.objects.filter(id=letter.id).update(body=json.dumps(TICKET))
    answer = operator.post(f"/api/v1/event-dead-letters/{letter.id}/replay/")
    assert answer.status_code == 200 and answer.json()["status"] == "replayed"
    assert operator.post(f"/api/v1/event-dead-letters/{letter.id}/replay/").status_code == 409


def test_a_queue_trigger_must_name_a_configured_source_and_its_binding(team, support):
    from triggers.services.config import TriggerInvalid

    with override_settings(STEPWISE_EVENT_SOURCES=SOURCES), pytest.raises(TriggerInvalid) as bad:
        make_trigger(team, "queue", name="q", source="rabbitmq")
    assert {p["path"] for p in bad.value.problems} == {"exchange", "binding_key"}
    with override_settings(STEPWISE_EVENT_SOURCES=SOURCES), pytest.raises(TriggerInvalid) as bad:
        make_trigger(team, "queue", name="q", source="kafka")
    assert bad.value.problems[0]["path"] == "source"
    with override_settings(STEPWISE_EVENT_SOURCES=SOURCES), pytest.raises(TriggerInvalid) as bad:
        make_trigger(team, "queue", name="q", source="redis", exchange="x")
    assert {p["path"] for p in bad.value.problems} == {"stream", "exchange"}
