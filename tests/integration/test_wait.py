"""Wait steps on the whole stack: real worker processes, the real broker and database, a live
HTTP server, and for the queue case RabbitMQ (127.0.0.1:5672) read by a real
`manage.py stepwise_consume` process. A run waits for its payment signal holding no worker, and
resumes once — on a signal from the Python client, on a correlated webhook delivery, on a
correlated RabbitMQ message — however often each is delivered; it times out and routes to its
timeout step; a signal sent before the wait starts is buffered and consumed when it does."""
import json
import uuid

import pytest
from kombu import Exchange, Queue
from rest_framework.authtoken.models import Token

from orchestrator.engine.services import reaper
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Event, Run, Signal, StepRun
from stepwise_client import Stepwise
from tests.factories import SETUP, member
from tests.triggers.conftest import deliver
from triggers.models import Firing
from triggers.services.config import trigger_create

from .conftest import wait_for, wait_for_run
from .test_trigger_consumer import RABBIT, SOURCES, Consumer, _reachable, publish, ready_in

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

PAID = {"order": "A-1", "amount": 5}


def order(team, *, nap_s: int = 0, timeout_s: int = 600):
    """place (a worker's tool) -> [nap] -> pay (waits for `paid`) -> ship, or cancel on its
    timeout."""
    nap = [{"name": "nap", "type": "sleep", "for_s": nap_s, "after": ["place"]}] if nap_s else []
    version, _ = workflow_save(team=team, actor=SETUP, definition={
        "name": "order", "input_schema": {"type": "object", "required": ["order_id"]},
        "steps": [
            {"name": "place", "type": "tool", "tool": "core.echo",
             "params": {"order": "{{ input.order_id }}"}},
            *nap,
            {"name": "pay", "type": "wait", "signal": "paid", "after": ["nap" if nap_s else "place"],
             "correlation_key": "{{ input.order_id }}", "timeout_s": timeout_s,
             "on_timeout": "cancel",
             "schema": {"type": "object", "required": ["amount"],
                        "properties": {"amount": {"type": "number"}}}},
            {"name": "ship", "type": "tool", "tool": "core.echo", "after": ["pay"],
             "params": {"amount": "{{ steps.pay.output.amount }}"}},
            {"name": "cancel", "type": "tool", "tool": "core.echo", "after": ["pay"],
             "params": {"order": "{{ input.order_id }}"}}]})
    return version


def waiting(version, order_id="A-1") -> Run:
    run = run_start(version=version, input={"order_id": order_id}, actor=SETUP)
    wait_for(lambda: StepRun.objects.filter(run=run, name="pay", state="waiting").exists(), timeout=60)
    return run


def paid_once(run: Run) -> Run:
    """The run completed by its signal: shipped with the payload, not cancelled, once."""
    run = wait_for_run(run.id, states=("completed", "failed", "cancelled", "timed_out"), timeout=60)
    steps = {s.name: s for s in run.steps.all()}
    assert run.state == "completed", (run.error, {n: (s.state, s.error) for n, s in steps.items()})
    assert (steps["pay"].state, steps["ship"].state, steps["cancel"].state) == (
        "completed", "completed", "skipped")
    assert steps["ship"].output == {"amount": "5"}  # rendered by its params template
    assert Event.objects.filter(run=run, step=steps["pay"], kind="step.completed").count() == 1
    assert Signal.objects.filter(run=run, state="consumed").count() == 1
    return run


def test_a_wait_resumes_on_a_signal_from_the_python_client_once(workers, live_server, team):
    run = waiting(order(team))
    assert Run.objects.get(id=run.id).state == "waiting"
    user = member(team, "payments", role="member")
    with Stepwise(live_server.url, token=Token.objects.create(user=user).key) as client:
        first = client.signal(str(run.id), "paid", PAID, idempotency_key="pay-A-1")
        again = client.signal(str(run.id), "paid", PAID, idempotency_key="pay-A-1")
    assert (first.state, first.step, first.duplicate) == ("consumed", "pay", False)
    assert again.duplicate
    paid_once(run)


def test_a_wait_resumes_on_a_correlated_webhook_delivered_twice_once(workers, client, team):
    version = order(team)
    other = waiting(version, "B-2")
    run = waiting(version)
    hook, secret = trigger_create(team=team, kind="webhook", name="payments", workflow="order",
                                  actor=SETUP, correlate="payload.order")
    answers = [deliver(client, hook, secret, PAID, delivery="evt-1") for _ in range(2)]
    assert [a.status_code for a in answers] == [202, 200]
    assert {a.json()["run"] for a in answers} == {str(run.id)}
    paid_once(run)
    assert StepRun.objects.get(run=other, name="pay").state == "waiting"
    assert Run.objects.filter(version=version).count() == 2


def test_a_wait_resumes_on_a_correlated_rabbitmq_message_delivered_twice_once(
        workers, team, settings):
    if not _reachable(RABBIT):
        pytest.skip("RabbitMQ is not running at 127.0.0.1:5672")
    settings.STEPWISE_EVENT_SOURCES = SOURCES
    names = f"wait-{uuid.uuid4().hex[:10]}"
    exchange = Exchange(f"{names}.x", type="topic", durable=True)
    queue = Queue(f"{names}.q", exchange, routing_key="payments.*", durable=True)
    consumer = Consumer(names)
    from kombu import Connection

    with Connection(RABBIT) as connection:
        try:
            run = waiting(order(team))
            trigger, _ = trigger_create(team=team, kind="queue", name="payments", workflow="order",
                                        actor=SETUP, source="rabbitmq", exchange=exchange.name,
                                        binding_key="payments.*", queue=queue.name,
                                        correlate="payload.order")
            consumer.start()
            consumer.wait_for_log(f"consuming RabbitMQ queue {queue.name}")
            for _ in range(2):  # the same message delivered twice
                publish(connection, exchange, json.dumps(PAID).encode(), message_id="pay-1",
                        routing_key="payments.succeeded")
            consumer.wait_for_log("message pay-1 duplicate")
            wait_for(lambda: ready_in(connection, queue) == 0)
            paid_once(run)
            firing = Firing.objects.get(trigger=trigger)
            assert (firing.state, firing.signalled_run_id) == ("signalled", run.id)
        finally:
            consumer.stop()
            channel = connection.default_channel
            queue.bind(channel).delete()
            exchange.bind(channel).delete()


def test_a_consumer_killed_between_the_resume_and_the_ack_resumes_the_run_once(workers, team, settings):
    """The consumer commits the signal, is SIGKILLed before it acknowledges the message, and
    the broker delivers it again to the restarted consumer: a duplicate, the run resumed once."""
    if not _reachable(RABBIT):
        pytest.skip("RabbitMQ is not running at 127.0.0.1:5672")
    from kombu import Connection

    settings.STEPWISE_EVENT_SOURCES = SOURCES
    names = f"wait-{uuid.uuid4().hex[:10]}"
    exchange = Exchange(f"{names}.x", type="topic", durable=True)
    queue = Queue(f"{names}.q", exchange, routing_key="payments.*", durable=True)
    consumer = Consumer(names)
    with Connection(RABBIT) as connection:
        try:
            run = waiting(order(team))
            trigger_create(team=team, kind="queue", name="payments", workflow="order", actor=SETUP,
                           source="rabbitmq", exchange=exchange.name, binding_key="payments.*",
                           queue=queue.name, correlate="payload.order")
            consumer.start(ack_delay_s=30)
            consumer.wait_for_log(f"consuming RabbitMQ queue {queue.name}")
            publish(connection, exchange, json.dumps(PAID).encode(), message_id="pay-9",
                    routing_key="payments.succeeded")
            consumer.wait_for_log("acknowledging in")  # the signal committed, the ack held open
            assert StepRun.objects.get(run=run, name="pay").state == "completed"
            consumer.kill()
            wait_for(lambda: ready_in(connection, queue) == 1)  # the broker still holds it

            consumer.start()
            consumer.wait_for_log("message pay-9 duplicate")
            wait_for(lambda: ready_in(connection, queue) == 0)
            paid_once(run)
        finally:
            consumer.stop()
            channel = connection.default_channel
            queue.bind(channel).delete()
            exchange.bind(channel).delete()


def test_a_wait_times_out_and_routes_to_its_timeout_step(workers, team):
    run = waiting(order(team, timeout_s=2))

    def swept_and_done():
        reaper.reap()
        return Run.objects.filter(id=run.id, state__in=("completed", "failed")).first()

    run = wait_for(swept_and_done, timeout=60, interval=0.3)
    steps = {s.name: s for s in run.steps.all()}
    assert run.state == "completed"
    assert (steps["pay"].state, steps["pay"].error["class"]) == ("timed_out", "timeout")
    assert (steps["ship"].state, steps["cancel"].state) == ("skipped", "completed")
    assert steps["ship"].skip_reason == "'pay' timed out: routed to 'cancel'"
    assert steps["cancel"].input["steps"]["pay"] == {"state": "completed", "output": {"timed_out": True}}


def test_a_signal_sent_before_the_wait_is_buffered_and_consumed_when_it_starts(workers, team, requester):
    from orchestrator.engine.services.signals import signal_send

    run = run_start(version=order(team, nap_s=2), input={"order_id": "A-1"}, actor=SETUP)
    sent = signal_send(run_id=run.id, name="paid", payload=PAID, key="early", actor=requester)
    assert sent.status == "buffered"

    def swept_and_done():
        reaper.reap()  # wakes the nap; the wait then starts and takes the buffered signal
        return Run.objects.filter(id=run.id, state__in=("completed", "failed")).first()

    wait_for(swept_and_done, timeout=60, interval=0.3)
    paid_once(run)
    assert Signal.objects.get(run=run).key == "early"
