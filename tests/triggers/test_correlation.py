"""Correlated events (docs/triggers.md, "Correlated events"): a trigger's `correlate` names the
key of a waiting run, and the event is delivered to that run's wait step as its signal instead
of starting a run — once however often it is delivered; an event whose key no run waits with is
refused or starts a run, as the trigger says; one whose key is null starts a run as usual.
Through the webhook, the queue consumer's service and the API trigger."""
import json

import pytest
from django.test import override_settings

from audit.models import AuditEntry
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Event, Run
from tests.factories import SETUP
from triggers.models import EventDeadLetter, Firing
from triggers.services.config import TriggerInvalid, trigger_create
from triggers.services.events import event_receive
from triggers.services.firing import trigger_fire_api

from .conftest import deliver

pytestmark = pytest.mark.django_db
SOURCES = {"rabbitmq": "amqp://guest:guest@127.0.0.1:5672//"}
PAID = {"type": "payment.succeeded", "order": "A-1", "amount": 5}


@pytest.fixture
def order(team):
    version, _ = workflow_save(team=team, actor=SETUP, definition={
        "name": "order", "input_schema": {"type": "object", "required": ["order_id"]},
        "steps": [
            {"name": "pay", "type": "wait", "signal": "paid", "correlation_key": "{{ input.order_id }}",
             "schema": {"type": "object", "required": ["amount"]}},
            {"name": "ship", "type": "tool", "tool": "core.echo", "after": ["pay"],
             "params": {"amount": "{{ steps.pay.output.amount }}"}}]})
    return version


def waiting(order, order_id="A-1") -> Run:
    return run_start(version=order, input={"order_id": order_id}, actor=SETUP)


def trigger(team, kind, **values):
    with override_settings(STEPWISE_EVENT_SOURCES=SOURCES):
        extra = {"source": "rabbitmq", "exchange": "shop", "binding_key": "payments.*"} \
            if kind == "queue" else {}
        return trigger_create(team=team, kind=kind, name=f"payments-{kind}", workflow="order",
                              actor=SETUP, correlate="payload.order", **extra, **values)


def pay_step(run):
    return run.steps.get(name="pay")


def test_a_correlated_webhook_resumes_the_run_waiting_with_its_key_once(client, team, order):
    other = waiting(order, "B-2")
    run = waiting(order)
    hook, secret = trigger(team, "webhook")

    first = deliver(client, hook, secret, PAID, delivery="evt-1")
    again = deliver(client, hook, secret, PAID, delivery="evt-1")

    assert first.status_code == 202, first.json()
    assert (first.json()["status"], first.json()["run"]) == ("signalled", str(run.id))
    assert again.status_code == 200 and again.json()["status"] == "duplicate"
    assert again.json()["run"] == str(run.id)
    assert (pay_step(run).state, pay_step(run).output) == ("completed", PAID)
    assert pay_step(other).state == "waiting"
    assert Run.objects.filter(version=order).count() == 2  # no run started
    assert Event.objects.filter(run=run, step__name="pay", kind="step.completed").count() == 1
    firing = Firing.objects.get(trigger=hook)
    assert (firing.state, firing.signalled_run_id, firing.run_id) == ("signalled", run.id, None)
    assert run.signals.get().key == f"trigger:{hook.id}:delivery:evt-1"
    assert AuditEntry.objects.filter(subject_id=str(hook.id), action="trigger.signalled").count() == 1


def test_an_event_no_run_waits_for_is_refused_by_default_and_kept_for_a_retry(client, team, order):
    hook, secret = trigger(team, "webhook")
    refused = deliver(client, hook, secret, PAID, delivery="evt-early")
    assert refused.status_code == 409
    assert refused.json()["errors"] == [{"path": "correlate", "message":
                                         "no run of workflow 'order' waits with correlation key 'A-1'"}]
    assert not Firing.objects.filter(trigger=hook).exists()

    run = waiting(order)  # the sender retries the same delivery once the run waits
    assert deliver(client, hook, secret, PAID, delivery="evt-early").status_code == 202
    assert pay_step(run).state == "completed"


def test_an_event_no_run_waits_for_starts_a_run_when_the_trigger_says_so(client, team, order):
    hook, secret = trigger(team, "webhook", uncorrelated="start",
                           input_template={"order_id": "{{ payload.order }}"})
    started = deliver(client, hook, secret, PAID, delivery="evt-new")
    assert started.status_code == 202 and started.json()["status"] == "started"
    assert Run.objects.get(id=started.json()["run"]).input == {"order_id": "A-1"}


def test_an_event_whose_correlate_gives_null_starts_a_run(client, team, order):
    hook, secret = trigger(team, "webhook", input_template={"order_id": "{{ payload.id }}"})
    hook.correlate = "has(payload.order) ? payload.order : null"
    hook.save(update_fields=["correlate"])
    started = deliver(client, hook, secret, {"id": "C-3"}, delivery="evt-start")
    assert started.status_code == 202 and started.json()["status"] == "started"


def test_a_correlated_payload_the_step_refuses_is_a_400_and_consumes_nothing(client, team, order):
    run = waiting(order)
    hook, secret = trigger(team, "webhook")
    refused = deliver(client, hook, secret, {"order": "A-1"}, delivery="evt-bad")
    assert refused.status_code == 400
    assert refused.json()["errors"][0]["path"] == "payload"
    assert pay_step(run).state == "waiting" and not run.signals.exists()


def test_a_correlated_queue_message_resumes_the_run_once_and_an_uncorrelated_one_is_dead_lettered(
        team, order):
    run = waiting(order)
    queue, _ = trigger(team, "queue")

    def receive(body, message_id):
        return event_receive(trigger_id=queue.id, message_id=message_id, body=json.dumps(body).encode(),
                             meta={"exchange": "shop", "routing_key": "payments.ok", "headers": {}})

    assert receive(PAID, "m-1").status == "signalled"
    assert receive(PAID, "m-1").status == "duplicate"
    assert Event.objects.filter(run=run, step__name="pay", kind="step.completed").count() == 1
    assert receive({**PAID, "order": "Z-9"}, "m-2").status == "refused"
    letter = EventDeadLetter.objects.get(trigger=queue)
    assert (letter.key, letter.reason_class) == ("message:m-2", "uncorrelated")


def test_a_correlated_api_trigger_resumes_the_run(team, order, requester):
    run = waiting(order)
    api_trigger, _ = trigger(team, "api")
    outcome = trigger_fire_api(trigger_id=api_trigger.id, payload=PAID, key="k-1", actor=requester)
    assert (outcome.status, outcome.run) == ("signalled", run)
    assert pay_step(run).output == PAID and run.signals.get().sent_by == "user:requester"


@pytest.mark.parametrize(("kind", "correlate", "path"), [
    ("webhook", "payload.order ==", "correlate"),
    ("schedule", "payload.order", "correlate"),
])
def test_a_correlate_that_cannot_work_is_refused_at_save(team, order, kind, correlate, path):
    extra = {"interval_s": 60} if kind == "schedule" else {}
    with pytest.raises(TriggerInvalid) as refused:
        trigger_create(team=team, kind=kind, name="bad", workflow="order", actor=SETUP,
                       correlate=correlate, **extra)
    assert path in {p["path"] for p in refused.value.problems}
