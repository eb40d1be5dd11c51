"""Integration tools through real worker processes: a worker killed in the middle of a write, a
publish or a send leaves one row, one message id, one e-mail; and the orders-digest example
runs end to end (SQLite rows -> agent -> file -> RabbitMQ), pausing while RabbitMQ is away.

The connections point through proxies a test can freeze or make refuse connections
(tests/support/stall_proxy.py), so the worker is killed at a known moment of the call: after the
database committed but before the worker heard it, after the broker took a message but before
its confirm arrived, while the mail relay holds the message unanswered.
"""
import json
import secrets
import time
from pathlib import Path

import amqp
import psycopg
import pytest
import redis
from django.conf import settings

from orchestrator.engine.definitions import parse_definition_text
from orchestrator.engine.services import reaper
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.integrations.tools.named import message_id
from orchestrator.management.commands.stepwise_bootstrap import seed_example_warehouse
from orchestrator.models import Effect, Role, StepRun
from tests.conftest import client_for
from tests.factories import EXAMPLES, SETUP, member
from tests.support.integrations import PG_DB, PG_URL, REDIS_URL, need, unique
from tests.support.smtp_sink import SmtpSink
from tests.support.stall_proxy import StallProxy

from .conftest import wait_for, wait_for_run

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
ENDED = ("completed", "failed", "cancelled", "timed_out", "paused")


class Rig:
    """The proxies, the SMTP sink, the names this module owns, and the connections to them."""

    def __init__(self):
        self.table = f"integrations_{secrets.token_hex(4)}"
        self.keys = f"integrations_effects_{secrets.token_hex(3)}"
        self.exchange = unique()
        self.pg = StallProxy("127.0.0.1", 5432)
        self.amqp = StallProxy("127.0.0.1", 5672)
        self.example_amqp = StallProxy("127.0.0.1", 5672)
        self.redis = StallProxy("127.0.0.1", 6379)
        self.stream = unique()  # the key: <prefix><stream>
        # Keys of this rig's own (its stream, its dedupe keys): Redis database 13 is shared by
        # every test process, and each removes only what it made.
        self.prefix = f"{unique()}:"
        self.smtp = SmtpSink().__enter__()
        self.smtp_proxy = None
        password = {"env": "STEPWISE_EXAMPLE_RABBITMQ_PASSWORD"}
        self.connections = {
            **settings.STEPWISE_CONNECTIONS,
            "examples-rabbitmq": {**settings.STEPWISE_CONNECTIONS["examples-rabbitmq"],
                                  "url": f"amqp://guest@127.0.0.1:{self.example_amqp.port}//",
                                  "timeout_s": 3},
            "ledger-db": {"kind": "sql", "writes": True, "idempotency_table": self.keys,
                          "url": f"postgresql://postgres@127.0.0.1:{self.pg.port}/{PG_DB}"},
            "bus": {"kind": "rabbitmq", "url": f"amqp://guest@127.0.0.1:{self.amqp.port}//",
                    "password": password, "exchanges": [self.exchange]},
            "events": {"kind": "redis", "url": f"redis://127.0.0.1:{self.redis.port}/13",
                       "key_prefix": self.prefix},
            "relay": {"kind": "mail", "host": "127.0.0.1", "port": self.smtp.port,
                      "from_email": "stepwise@example.com", "allowed_domains": ["example.com"]},
        }

    def close(self):
        self.smtp.__exit__(None, None, None)
        for proxy in (self.pg, self.amqp, self.example_amqp, self.redis):
            proxy.close()


@pytest.fixture(scope="module")
def rig(workers, django_db_blocker):
    for service in ("PostgreSQL", "RabbitMQ", "Redis"):
        need(service)
    rig = Rig()
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {rig.table} (id INTEGER PRIMARY KEY, note TEXT)")
    channel_conn = amqp.Connection("127.0.0.1:5672", userid="guest", password="guest")
    channel_conn.connect()
    rig.channel = channel_conn.channel()
    rig.channel.exchange_declare(rig.exchange, "topic", durable=False, auto_delete=False)
    rig.queue = unique()
    rig.channel.queue_declare(rig.queue, durable=False, auto_delete=False)
    rig.channel.queue_bind(rig.queue, rig.exchange, "#")
    rig.channel.queue_bind(rig.queue, "amq.topic", "stepwise.examples.orders-digest.*")
    before = dict(workers.env)
    workers.stop()
    workers.env.update({"STEPWISE_CONNECTIONS": json.dumps(rig.connections),
                        "STEPWISE_EXAMPLE_RABBITMQ_PASSWORD": "guest"})
    workers.start()
    saved = settings.STEPWISE_CONNECTIONS
    settings.STEPWISE_CONNECTIONS = rig.connections  # the save-time checks in this process
    yield rig
    settings.STEPWISE_CONNECTIONS = saved
    # Left stopped with the session's environment: the next test that asks for the workers
    # starts them (tests/conftest.py).
    workers.stop()
    workers.env.clear()
    workers.env.update(before)
    rig.channel.queue_delete(rig.queue)
    rig.channel.exchange_delete(rig.exchange)
    channel_conn.close()
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {rig.table}")
        conn.execute(f"DROP TABLE IF EXISTS {rig.keys}")
    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(f"{rig.prefix}*"))
    if keys:
        client.delete(*keys)
    rig.close()


def drain(rig) -> list:
    messages = []
    while (message := rig.channel.basic_get(rig.queue, no_ack=True)) is not None:
        messages.append(message)
    return messages


def kill_and_recover(workers, run, step: str):
    """SIGKILL the workers in the middle of `step`, start them again, let the reaper find the
    lost attempt; return the run once it ended."""
    workers.kill()
    try:
        def tick():
            reaper.reap()
            return StepRun.objects.filter(run=run, name=step).exclude(state="running").exists()
        wait_for(tick, timeout=30, interval=0.3)
    finally:
        workers.start()
    return wait_for_run(run.id, states=ENDED, timeout=60)


def one_step(team, name, tool, params):
    version, _ = workflow_save(team=team, definition={
        "name": name, "input_schema": {"type": "object"},
        "steps": [{"name": "act", "type": "tool", "tool": tool, "params": params}]}, actor=SETUP)
    return run_start(version=version, input={}, actor=SETUP)


def test_a_worker_killed_after_the_database_committed_leaves_one_row(rig, workers, team):
    rig.pg.stall_on(b"Q\x00\x00\x00\x0bCOMMIT\x00", deliver=True)  # the server commits; the worker never hears it
    run = one_step(team, "write-row", "sql.execute", {
        "connection": "ledger-db", "statement": f"INSERT INTO {rig.table} (id, note) VALUES (:id, :note)",
        "args": {"id": 1, "note": "once"}})
    assert rig.pg.stalled.wait(30)
    time.sleep(0.5)
    with psycopg.connect(PG_URL) as conn:  # committed before the kill
        assert conn.execute(f"SELECT count(*) FROM {rig.table}").fetchone() == (1,)
    run = kill_and_recover(workers, run, "act")
    assert run.state == "completed", run.error
    with psycopg.connect(PG_URL) as conn:
        assert conn.execute(f"SELECT id, note FROM {rig.table}").fetchall() == [(1, "once")]
    effect = Effect.objects.get(run=run)
    assert (effect.status, effect.attempts) == ("succeeded", 2)
    outcomes = list(StepRun.objects.get(run=run).attempt_records.values_list("outcome", flat=True))
    assert outcomes == ["lost", "succeeded"]


def test_a_worker_killed_before_the_broker_took_the_message_publishes_it_once(rig, workers, team):
    drain(rig)
    rig.amqp.stall_on(b"\x00\x3c\x00\x28", deliver=False)  # basic.publish never reaches it
    run = one_step(team, "publish-once", "rabbitmq.publish", {
        "connection": "bus", "exchange": rig.exchange, "routing_key": "orders", "message": {"n": 1}})
    assert rig.amqp.stalled.wait(30)
    run = kill_and_recover(workers, run, "act")
    assert run.state == "completed", run.error
    messages = drain(rig)
    assert [m.properties["message_id"] for m in messages] == [message_id(f"{run.id}:act:default")]


def test_a_worker_killed_before_the_confirm_republishes_with_the_same_message_id(rig, workers, team):
    """The broker took the message; its confirm never reached the worker. The retry publishes
    again: two deliveries, one message id, so a consumer that remembers ids handles it once."""
    drain(rig)
    rig.amqp.stall_on(b"deliver-then-stall", deliver=True)  # in the body: the last frame
    run = one_step(team, "publish-twice", "rabbitmq.publish", {
        "connection": "bus", "exchange": rig.exchange, "routing_key": "orders",
        "message": {"tag": "deliver-then-stall"}})
    assert rig.amqp.stalled.wait(30)
    time.sleep(0.5)
    run = kill_and_recover(workers, run, "act")
    assert run.state == "completed", run.error
    ids = [m.properties["message_id"] for m in drain(rig)]
    assert ids == [message_id(f"{run.id}:act:default")] * 2
    assert len(set(ids)) == 1


def test_a_worker_killed_after_redis_appended_leaves_one_stream_entry(rig, workers, team):
    rig.redis.stall_on(b"EVAL", deliver=True)  # Redis runs the script; the worker never hears
    run = one_step(team, "append-once", "redis.stream_add", {
        "connection": "events", "stream": rig.stream, "message": {"n": 1}})
    assert rig.redis.stalled.wait(30)
    client = redis.Redis.from_url(REDIS_URL)
    wait_for(lambda: client.xlen(f"{rig.prefix}{rig.stream}") == 1, timeout=10)  # appended before the kill
    run = kill_and_recover(workers, run, "act")
    assert run.state == "completed", run.error
    (entry,) = client.xrange(f"{rig.prefix}{rig.stream}")
    assert entry[1][b"message_id"].decode() == message_id(f"{run.id}:act:default")
    assert StepRun.objects.get(run=run).output["duplicate"] is True


def test_a_worker_killed_while_the_relay_holds_the_message_sends_one_email(rig, workers, team):
    rig.smtp.messages.clear()
    rig.smtp.hold()
    arrived = rig.smtp.arrived
    run = one_step(team, "send-once", "mail.send", {
        "connection": "relay", "to": ["ann@example.com"], "subject": "Order {{ 'A-1' }}",
        "body": "Shipped."})
    rig.smtp.wait_arrived(arrived + 1)
    workers.kill()
    rig.smtp.release()
    workers.start()
    run = kill_and_recover(workers, run, "act")
    assert run.state == "completed", run.error
    (message,) = rig.smtp.messages
    assert message["Message-ID"] == f"<{message_id(f'{run.id}:act:default')}@example.com>"
    assert message["Subject"] == "Order A-1"


def save_example(team):
    definition = parse_definition_text((EXAMPLES / "orders-digest.yaml").read_text())
    version, _ = workflow_save(team=team, definition=definition, actor=SETUP)
    return version


def test_the_orders_digest_example_reads_summarizes_writes_and_publishes(rig, workers, team):
    seed_example_warehouse()
    drain(rig)
    run = wait_for_run(run_start(version=save_example(team), input={"region": "EU"},
                                 actor=SETUP).id, states=ENDED, timeout=60)
    assert run.state == "completed", run.error
    digest = Path(settings.VAR_DIR) / "files" / "digests" / "orders-eu.md"
    text = digest.read_text()
    assert text.startswith("# 3 open orders in EU")
    assert "ORD-2002 (Bo Lind) is on hold." in text and "| ORD-2004 | Dee Novak |" in text
    (message,) = drain(rig)
    assert message.delivery_info["routing_key"] == "stepwise.examples.orders-digest.eu"
    sent = StepRun.objects.get(run=run, name="notify").output["message_id"]
    mails = [p.read_text() for p in (Path(settings.VAR_DIR) / "outbox" / "mail").iterdir()]
    assert [m for m in mails if sent in m and "Subject: 3 open orders in EU" in m]
    assert json.loads(message.body) == {"headline": "3 open orders in EU",
                                        "file": "digests/orders-eu.md",
                                        "sha256": StepRun.objects.get(run=run, name="save").output["sha256"]}


def test_the_example_pauses_while_rabbitmq_is_away_and_finishes_when_an_operator_retries(
        rig, workers, team):
    seed_example_warehouse()
    drain(rig)
    rig.example_amqp.refusing = True  # RabbitMQ is away
    try:
        run = wait_for_run(run_start(version=save_example(team), input={"region": "US"},
                                     actor=SETUP).id, states=ENDED, timeout=90)
        assert run.state == "paused", run.error
        announce = StepRun.objects.get(run=run, name="announce")
        assert (announce.state, announce.attempts, announce.error["class"]) == ("failed", 3, "transient")
        assert (Path(settings.VAR_DIR) / "files" / "digests" / "orders-us.md").exists()
    finally:
        rig.example_amqp.refusing = False
    operator = client_for(member(team, "operator", role=Role.OPERATOR))
    assert operator.post(f"/api/v1/runs/{run.id}/steps/announce/retry/").status_code == 202
    run = wait_for_run(run.id, states=("completed", "failed"), timeout=60)
    assert run.state == "completed", run.error
    (message,) = drain(rig)
    assert json.loads(message.body)["headline"] == "2 open orders in US"
    assert Effect.objects.filter(run=run, step__name="save").count() == 1
