"""A run's callback: given at start (checked against the egress policy), owed once per event
that says the run waits or ended (in that event's transaction), POSTed signed with HMAC-SHA256,
at least once: retried until the receiver says 2xx, then never again."""
import json

import pytest

from notifications.callbacks import callback_deliver, verify_signature
from notifications.models import CallbackDelivery
from notifications.services import CALLBACK_MAX_ATTEMPTS, callbacks_resend
from orchestrator.engine.errors import InputInvalid
from orchestrator.engine.services.runs import run_cancel, run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Event
from tests.api.driving import drive_to_gate
from tests.factories import SETUP, example_definition
from tests.support.http_sink import HttpSink

pytestmark = pytest.mark.django_db

SECRET = "a-client-secret-of-32-characters"
TICKET = {"ticket_id": "T-1", "customer_email": "a@example.com", "body": "Where is my parcel?"}


@pytest.fixture
def support(team):
    return workflow_save(team=team, definition=example_definition("support"), actor=SETUP)[0]


def start(support, requester, url, secret=SECRET):
    return run_start(version=support, input=TICKET, actor=requester, callback_url=url,
                     callback_secret=secret)


@pytest.mark.parametrize(("url", "secret", "path"), [
    ("http://169.254.169.254/latest/meta-data/", SECRET, "callback_url"),  # cloud metadata
    ("ftp://example.com/hook", SECRET, "callback_url"),
    ("https://hooks.example.com/stepwise", "short", "callback_secret"),
])
def test_a_callback_the_policy_refuses_or_without_a_secret_is_rejected_before_the_run_exists(
        support, requester, url, secret, path):
    with pytest.raises(InputInvalid) as refused:
        start(support, requester, url, secret)
    assert path in [problem["path"] for problem in refused.value.problems]
    assert not support.runs.exists()


def test_a_waiting_run_and_a_cancelled_run_each_owe_one_delivery(support, requester):
    run = start(support, requester, "https://hooks.example.com/stepwise")
    assert not CallbackDelivery.objects.exists()  # running: nothing to report yet
    drive_to_gate(run)
    run_cancel(run_id=run.id, actor=SETUP)
    owed = list(CallbackDelivery.objects.values_list("kind", "event__kind"))
    assert owed == [("run.waiting", "run.waiting"), ("run.cancelled", "run.cancelled")]


def test_a_run_without_a_callback_owes_nothing(support, requester):
    run = run_start(version=support, input=TICKET, actor=requester)
    run_cancel(run_id=run.id, actor=SETUP)
    assert Event.objects.filter(run=run, kind="run.cancelled").exists()
    assert not CallbackDelivery.objects.exists()


def test_the_callback_is_signed_with_the_runs_secret_over_timestamp_and_body(support, requester):
    with HttpSink() as sink:
        run = start(support, requester, f"{sink.url}/hooks/runs")
        run_cancel(run_id=run.id, actor=SETUP)
        delivery = CallbackDelivery.objects.get()
        assert callback_deliver(delivery_id=delivery.id)
    [posted] = sink.requests
    headers = posted["headers"]
    body = json.loads(posted["body"])
    assert (body["event"], body["run"]["id"], body["run"]["state"]) == ("run.cancelled", str(run.id), "cancelled")
    assert headers["X-Stepwise-Delivery"] == str(delivery.id)
    assert verify_signature(SECRET, timestamp=headers["X-Stepwise-Timestamp"], body=posted["body"].encode(),
                            signature=headers["X-Stepwise-Signature"])
    assert not verify_signature("another-secret-of-32-characters!", timestamp=headers["X-Stepwise-Timestamp"],
                                body=posted["body"].encode(), signature=headers["X-Stepwise-Signature"])
    delivery.refresh_from_db()
    assert delivery.status == "delivered" and delivery.response_status == 200


def test_a_failed_delivery_is_retried_until_the_receiver_accepts_it_then_never_again(support, requester, move_clock):
    with HttpSink() as sink:
        sink.fail_next(2, 503)
        run = start(support, requester, f"{sink.url}/hooks/runs")
        run_cancel(run_id=run.id, actor=SETUP)
        delivery = CallbackDelivery.objects.get()
        assert not callback_deliver(delivery_id=delivery.id)
        assert callbacks_resend() == 0  # not due yet
        move_clock(3600)
        assert callbacks_resend() == 1  # the backstop sends it again (its message may be lost)
        assert not callback_deliver(delivery_id=delivery.id)
        assert callback_deliver(delivery_id=delivery.id)
        assert callback_deliver(delivery_id=delivery.id)  # a repeated message: nothing is sent
        move_clock(7200)
        assert callbacks_resend() == 0
    assert [r["status"] for r in sink.requests] == [503, 503, 200]
    assert len({r["headers"]["X-Stepwise-Delivery"] for r in sink.requests}) == 1


def test_a_receiver_that_never_accepts_ends_the_delivery_failed(support, requester):
    with HttpSink() as sink:
        sink.refuse("/hooks/runs", 500)
        run = start(support, requester, f"{sink.url}/hooks/runs")
        run_cancel(run_id=run.id, actor=SETUP)
        delivery = CallbackDelivery.objects.get()
        for _ in range(CALLBACK_MAX_ATTEMPTS):
            callback_deliver(delivery_id=delivery.id)
    delivery.refresh_from_db()
    assert delivery.status == "failed" and delivery.attempts == CALLBACK_MAX_ATTEMPTS
    assert "500" in delivery.error


def _stored_row(table: str, run_id) -> dict:
    from django.db import connection  # noqa: PLC0415

    with connection.cursor() as cursor:
        cursor.execute(f"SELECT * FROM {table} WHERE run_id = %s", [run_id.hex if
                                                                     connection.vendor == "sqlite"
                                                                     else run_id])
        columns = [c[0] for c in cursor.description]
        return dict(zip(columns, cursor.fetchone(), strict=True))


def test_a_callback_secret_is_stored_sealed_and_still_signs(support, requester):
    from notifications.models import RunCallback  # noqa: PLC0415
    from orchestrator.engine.sealing import CALLBACK_SECRETS  # noqa: PLC0415

    run = start(support, requester, "https://hooks.example.com/stepwise")
    stored = _stored_row(RunCallback._meta.db_table, run.id)
    assert SECRET not in json.dumps(stored, default=str)
    assert CALLBACK_SECRETS.unseal(stored["sealed_secret"]) == SECRET


@pytest.mark.django_db(transaction=True)
def test_the_migration_seals_the_callback_secrets_stored_in_plain_text(team, requester):
    from django.db import connection  # noqa: PLC0415
    from django.db.migrations.executor import MigrationExecutor  # noqa: PLC0415

    from notifications.models import RunCallback  # noqa: PLC0415
    from orchestrator.engine.sealing import CALLBACK_SECRETS  # noqa: PLC0415

    version = workflow_save(team=team, definition=example_definition("support"), actor=SETUP)[0]
    run = start(version, requester, "https://hooks.example.com/stepwise")
    table = RunCallback._meta.db_table
    before, after = ("notifications", "0002_run_callbacks"), (
        "notifications", "0003_h41b_callback_secrets_sealed")
    MigrationExecutor(connection).migrate([before])  # back to the plain column
    assert _stored_row(table, run.id)["secret"] == SECRET
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate([after])
    stored = _stored_row(table, run.id)
    assert "secret" not in stored and SECRET not in json.dumps(stored, default=str)
    assert CALLBACK_SECRETS.unseal(stored["sealed_secret"]) == SECRET
