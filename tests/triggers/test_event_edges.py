"""Queue events at their edges: which trigger a message reaches, what a message without an id is
known by, the size limit's bound, and what a run and a dead letter record of the message.
Written from the mutation survivors of `triggers/services/events.py` (docs/testing.md)."""
import hashlib
import json
import uuid

import pytest

from audit.models import AuditEntry
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Event, Run
from tests.factories import SETUP, TeamFactory, example_definition
from triggers.models import EventDeadLetter, Firing
from triggers.services.config import trigger_update
from triggers.services.events import event_receive

from .conftest import TICKET, make_trigger

pytestmark = pytest.mark.django_db
SOURCES = {"rabbitmq": "amqp://guest:guest@127.0.0.1:5672//", "redis": "redis://127.0.0.1:6379/14"}
BY_ID = {"ticket_id": "{{ message.id }}", "body": "{{ payload.text }}",
         "customer_email": "{{ payload.email }}"}


@pytest.fixture(autouse=True)
def sources(settings):
    settings.STEPWISE_EVENT_SOURCES = SOURCES


def queue(team, name: str = "tickets", **values):
    values.setdefault("input_template", BY_ID)
    trigger, _ = make_trigger(team, "queue", name=name, source="rabbitmq", exchange="helpdesk",
                              binding_key="tickets.*", **values)
    return trigger


def receive(trigger_id, body, message_id="m-1", **meta):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    meta = meta or {"exchange": "helpdesk", "routing_key": "tickets.created"}
    return event_receive(trigger_id=trigger_id, message_id=message_id, body=raw, meta=meta)


def test_a_message_reaches_only_the_trigger_it_was_received_for(team, support):
    other_team = TeamFactory(slug="billing", name="Billing")
    workflow_save(team=other_team, definition=example_definition("support"), actor=SETUP)
    theirs = queue(other_team, name="invoices")
    ours = queue(team)

    outcome = receive(ours.id, TICKET)

    assert outcome.status == "started" and outcome.run.team == team
    assert Firing.objects.get().trigger == ours
    assert not Firing.objects.filter(trigger=theirs).exists()


def test_a_message_for_an_unknown_or_another_kind_of_trigger_is_not_found(team, support):
    queue(team)  # a queue trigger exists; the message names another
    hook, _ = make_trigger(team, "webhook", name="hook")
    assert receive(hook.id, TICKET).status == "not_found"
    assert receive(uuid.uuid4(), TICKET).status == "not_found"
    assert not Firing.objects.exists()


def test_a_message_for_a_disabled_trigger_stays_in_the_queue(team, support):
    """Status `disabled` is the one the consumer does not acknowledge."""
    trigger = queue(team)
    trigger_update(trigger_id=trigger.id, actor=SETUP, changes={"enabled": False})
    outcome = receive(trigger.id, TICKET)
    assert (outcome.status, outcome.reason, outcome.accepted) == ("disabled", "disabled", False)
    assert not EventDeadLetter.objects.exists() and not Firing.objects.exists()


def test_the_message_id_is_read_whole_by_the_template_and_recorded_as_the_runs_origin(
        team, support):
    trigger = queue(team)
    outcome = receive(trigger.id, TICKET, message_id="tenant:42:m-1")

    assert outcome.run.input["ticket_id"] == "tenant:42:m-1"
    created = Event.objects.get(run=outcome.run, kind="run.created").payload
    assert created["origin"] == {"trigger": str(trigger.id), "name": "tickets", "kind": "queue",
                                 "key": "message:tenant:42:m-1", "message": "tenant:42:m-1",
                                 "routing_key": "tickets.created"}


def test_a_long_message_id_is_kept_to_180_characters(team, support):
    trigger = queue(team, input_template={"ticket_id": "T-1", "body": "{{ payload.text }}",
                                          "customer_email": "{{ payload.email }}"})
    long_id = "m" * 179 + "xyz"
    outcome = receive(trigger.id, TICKET, message_id=long_id)
    assert outcome.firing.key == "message:" + "m" * 179 + "x"
    created = Event.objects.get(run=outcome.run, kind="run.created").payload
    assert created["origin"]["message"] == "m" * 179 + "x"


def test_a_message_without_an_id_is_known_by_where_it_came_from_and_its_body(team, support):
    trigger = queue(team, input_template={"ticket_id": "T-1", "body": "{{ payload.text }}",
                                          "customer_email": "{{ payload.email }}"})
    raw = json.dumps(TICKET).encode()

    rabbit = receive(trigger.id, raw, message_id=None, exchange="helpdesk",
                     routing_key="tickets.created")
    redis = receive(trigger.id, raw, message_id=None, stream="tickets")

    digest = hashlib.sha256(b"tickets.created\n" + raw).hexdigest()
    assert rabbit.firing.key == f"digest:{digest}"
    assert redis.firing.key == "digest:" + hashlib.sha256(b"tickets\n" + raw).hexdigest()
    created = Event.objects.get(run=redis.run, kind="run.created").payload
    assert created["origin"]["stream"] == "tickets" and "routing_key" not in created["origin"]


def test_a_body_of_exactly_max_body_bytes_is_taken_and_one_byte_more_is_dead_lettered(
        team, support):
    trigger = queue(team, max_body_bytes=1024)
    raw = json.dumps(TICKET).encode()
    exact = raw + b" " * (1024 - len(raw))

    assert receive(trigger.id, exact, message_id="m-1").status == "started"
    assert receive(trigger.id, exact + b" ", message_id="m-2").status == "invalid"

    letter = EventDeadLetter.objects.get()
    assert (letter.key, letter.reason_class) == ("message:m-2", "too_large")
    assert letter.problems == [{"path": "body", "message":
                                "the message is larger than max_body_bytes (1,024)"}]


def test_a_message_that_is_not_json_is_dead_lettered_naming_the_message_body(team, support):
    trigger = queue(team)
    receive(trigger.id, b"{oops")
    letter = EventDeadLetter.objects.get()
    assert letter.reason_class == "malformed"
    assert [p["path"] for p in letter.problems] == ["body"]
    assert letter.problems[0]["message"].startswith("invalid message body: ")
    assert Run.objects.count() == 0


QUEUE_PROBLEMS = [
    (SOURCES, {"source": "kafka"}, [{"path": "source", "message": "must name a broker of "
                                     "STEPWISE_EVENT_SOURCES (rabbitmq, redis)"}]),
    ({}, {"source": "rabbitmq"}, [{"path": "source", "message": "must name a broker of "
                                   "STEPWISE_EVENT_SOURCES (none are configured)"}]),
    (SOURCES, {"source": "", "stream": "s"}, [{"path": "source", "message": "must name a broker "
                                               "of STEPWISE_EVENT_SOURCES (rabbitmq, redis)"}]),
    ({"mq": "amqps://mq.example.com//"}, {"source": "mq", "stream": "s"}, [
        {"path": "exchange", "message": "is required for a RabbitMQ source"},
        {"path": "binding_key", "message": "is required for a RabbitMQ source"},
        {"path": "stream", "message": "is for Redis sources; RabbitMQ uses exchange and binding_key"}]),
    ({"mq": "pyamqp://mq//"}, {"source": "mq", "exchange": "x", "binding_key": "k"}, []),
    ({"r": "rediss://r.example.com/0"}, {"source": "r", "exchange": "x", "binding_key": "k",
                                         "queue": "q"}, [
        {"path": "stream", "message": "is required for a Redis source"},
        {"path": "exchange", "message": "is for RabbitMQ sources; Redis uses stream"},
        {"path": "binding_key", "message": "is for RabbitMQ sources; Redis uses stream"},
        {"path": "queue", "message": "is for RabbitMQ sources; Redis uses stream"}]),
    ({"r": "redis://r/0"}, {"source": "r", "stream": "s"}, []),
    ({"k": "kafka://k:9092"}, {"source": "k", "stream": "s"}, [
        {"path": "source", "message": "STEPWISE_EVENT_SOURCES must give an amqp:// or redis:// "
                                      "URL for it"}]),
]


@pytest.mark.parametrize(("sources", "values", "problems"), QUEUE_PROBLEMS)
def test_a_queue_triggers_source_and_binding_are_checked_with_every_problem_named(
        team, support, settings, sources, values, problems):
    from triggers.services.config import TriggerInvalid

    settings.STEPWISE_EVENT_SOURCES = sources
    if not problems:
        assert queue_of(team, values).source == values["source"]
        return
    with pytest.raises(TriggerInvalid) as refused:
        queue_of(team, values)
    assert refused.value.problems == problems


def queue_of(team, values: dict):
    trigger, _ = make_trigger(team, "queue", name="q", input_template=BY_ID, **values)
    return trigger


def test_a_dead_letter_keeps_a_whole_body_whole_counts_redeliveries_and_is_recorded(
        team, support, settings):
    settings.STEPWISE_MAX_REQUEST_BYTES = 200_000
    trigger = queue(team, max_body_bytes=100_000)
    large = b"[" + b" " * 69_998 + b"x"  # not JSON, 70,000 bytes: more than a kept prefix
    exact = b"{" + b" " * 99_999  # not JSON, exactly max_body_bytes

    receive(trigger.id, large, message_id="m-1")
    receive(trigger.id, exact, message_id="m-2")
    receive(trigger.id, large, message_id="m-1")  # delivered again, still failing
    receive(trigger.id, b"[" + b" " * 100_000, message_id="m-3")  # too large: a prefix kept

    first, second, cut = EventDeadLetter.objects.order_by("id")
    assert (len(cut.body), cut.body_complete, cut.reason_class) == (64 * 1024, False, "too_large")
    assert (len(first.body), first.body_complete, first.attempts) == (70_000, True, 2)
    assert (len(second.body), second.body_complete, second.attempts) == (100_000, True, 1)
    entry = AuditEntry.objects.filter(action="trigger.dead_lettered",
                                      actor=f"trigger:{trigger.id}").order_by("id").first()
    assert (entry.actor, entry.outcome) == (f"trigger:{trigger.id}", "malformed")
    assert (entry.data["key"], entry.data["dead_letter"]) == ("message:m-1", first.id)
    assert entry.data["problems"] == first.problems
