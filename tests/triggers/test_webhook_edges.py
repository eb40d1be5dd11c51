"""Webhook refusals at their edges: what the ledger records of a refused authenticated post, and
of a minute of unauthenticated ones. Written from the mutation survivors of
`triggers/services/firing.py` and `webhooks.py` (docs/testing.md)."""
import json
from datetime import timedelta

import pytest

from audit.models import AuditEntry
from tests.factories import SETUP
from triggers.services.config import trigger_update
from triggers.services.webhooks import refusal_tallies_record, webhook_receive
from triggers.signatures import sign

from .conftest import TICKET, deliver, make_trigger

pytestmark = pytest.mark.django_db


@pytest.fixture
def hook(team, support):
    return make_trigger(team, "webhook")


def test_a_refused_signed_post_is_recorded_with_its_key_reason_problems_and_origin(client, hook):
    trigger, secret = hook
    trigger_update(trigger_id=trigger.id, actor=SETUP, changes={"enabled": False})

    assert deliver(client, trigger, secret, delivery="d-9").status_code == 409

    # Of this trigger: earlier transactional tests' entries stay in PostgreSQL's ledger.
    entry = AuditEntry.objects.get(action="trigger.refused", actor=f"trigger:{trigger.id}")
    assert (entry.actor, entry.outcome) == (f"trigger:{trigger.id}", "disabled")
    assert {key: entry.data[key] for key in ("key", "reason", "problems", "origin")} == {
        "key": "delivery:d-9", "reason": "disabled", "origin": {"delivery": "d-9"},
        "problems": [{"path": "", "message": "trigger 'inbox' is disabled"}]}


def test_a_minute_of_unauthenticated_posts_is_recorded_by_the_trigger_with_its_bounds(
        client, hook, frozen, team):
    trigger, secret = hook
    other, other_secret = make_trigger(team, "webhook", name="second")
    before = AuditEntry.objects.order_by("-id").values_list("id", flat=True).first() or 0
    frozen.moment = frozen.moment.replace(second=10, microsecond=500)
    minute = frozen.moment.replace(second=0, microsecond=0)
    assert deliver(client, trigger, secret, signature="").status_code == 401
    assert deliver(client, other, other_secret, signature="").status_code == 401
    frozen.advance(seconds=50)  # the next minute, 500 microseconds into it
    assert deliver(client, trigger, secret, delivery="d-2", signature="").status_code == 401

    assert refusal_tallies_record() == 2

    # Written by this test: earlier tests' entries stay in PostgreSQL's ledger.
    entries = AuditEntry.objects.filter(action="trigger.refused", id__gt=before).order_by("id")
    assert {e.subject_id for e in entries} == {str(trigger.id), str(other.id)}
    entry = entries.get(subject_id=str(trigger.id))
    assert (entry.actor, entry.data["reason"]) == (f"trigger:{trigger.id}", "unauthenticated")
    assert (entry.data["from"], entry.data["until"]) == (
        minute.isoformat(), (minute + timedelta(minutes=1)).isoformat())
    assert entry.idempotency_key == f"refusals:{trigger.id}:{minute.isoformat()}"


def test_after_a_key_rotation_the_resealed_secrets_and_the_previous_one_still_verify(
        client, hook, team, settings, frozen):
    from triggers.services.config import triggers_reseal, webhook_secret_rotate

    trigger, old = hook
    _, new = webhook_secret_rotate(trigger_id=trigger.id, actor=SETUP)
    other, other_secret = make_trigger(team, "webhook", name="second")
    make_trigger(team, "api", name="prog")  # no secret: not resealed
    key = settings.STEPWISE_TRIGGER_KEY
    settings.STEPWISE_TRIGGER_KEY, settings.STEPWISE_TRIGGER_KEY_FALLBACKS = "n" * 48, [key]

    assert triggers_reseal() == 2

    settings.STEPWISE_TRIGGER_KEY_FALLBACKS = []  # the old key is gone: the new one opens them
    assert deliver(client, trigger, new, delivery="d-1").status_code == 202
    assert deliver(client, trigger, old, delivery="d-2").status_code == 202  # within the grace
    assert deliver(client, other, other_secret, delivery="d-3").status_code == 202


def test_the_replaced_secret_stops_verifying_at_the_end_of_the_grace_exactly(
        client, hook, frozen):
    from triggers.services.config import webhook_secret_rotate
    from triggers.services.webhooks import webhook_receive

    trigger, old = hook
    rotated, _ = webhook_secret_rotate(trigger_id=trigger.id, actor=SETUP)
    frozen.moment = rotated.previous_secret_until

    assert deliver(client, trigger, old, delivery="d-1").status_code == 401
    outcome = webhook_receive(trigger_id=trigger.id, body=b"{}", headers={
        "webhook-id": "d-2", "webhook-timestamp": str(int(frozen.moment.timestamp())),
        "webhook-signature": "v1,AAAA"})
    assert (outcome.status, outcome.reason) == ("unauthorized", "bad_signature")


def test_admission_refusals_are_recorded_once_a_window_for_each_limit_and_others_each_time(
        client, hook, team):
    from budgets.services import budget_limit_create

    trigger, secret = hook
    trigger_update(trigger_id=trigger.id, actor=SETUP, changes={"max_per_minute": 2})
    assert deliver(client, trigger, secret, delivery="d-1").status_code == 202
    budget_limit_create(team=team, actor=SETUP, max_concurrent_runs=1)
    assert deliver(client, trigger, secret, delivery="d-2").status_code == 429  # the team's cap
    trigger_update(trigger_id=trigger.id, actor=SETUP, changes={"max_per_minute": 1})
    assert deliver(client, trigger, secret, delivery="d-3").status_code == 429  # the rate
    assert deliver(client, trigger, secret, delivery="d-4").status_code == 429  # the rate again
    trigger_update(trigger_id=trigger.id, actor=SETUP, changes={"enabled": False})
    assert deliver(client, trigger, secret, delivery="d-5").status_code == 409
    assert deliver(client, trigger, secret, delivery="d-6").status_code == 409

    refused = AuditEntry.objects.filter(action="trigger.refused", actor=f"trigger:{trigger.id}")
    assert [e.outcome for e in refused.order_by("id")] == [
        "concurrent_runs", "rate", "disabled", "disabled"]


def test_what_a_webhook_post_is_answered_at_its_edges(client, hook, team, frozen):
    import uuid

    from triggers.services.webhooks import webhook_receive

    trigger, secret = hook
    trigger_update(trigger_id=trigger.id, actor=SETUP, changes={"max_body_bytes": 1024})
    assert webhook_receive(trigger_id=uuid.uuid4(), headers={}, body=b"{}").status == "not_found"

    bare = webhook_receive(trigger_id=trigger.id, headers={}, body=b"{}")  # no header at all
    assert (bare.status, bare.reason) == ("unauthorized", "missing_headers")
    assert bare.problems[0]["path"] == "headers" and bare.problems[0]["message"]

    large = webhook_receive(trigger_id=trigger.id, headers={}, body=b" " * 1025)
    assert large.problems == [{"path": "", "message": "the body is larger than this trigger's "
                               "max_body_bytes (1,024)"}]
    exact = b'{"ticket": "T-1", "text": "t", "email": "c@example.com"}'
    exact += b" " * (1024 - len(exact))
    assert deliver(client, trigger, secret, exact, delivery="d-1").status_code == 202

    malformed = deliver(client, trigger, secret, b"{oops", delivery="d-2")
    assert malformed.status_code == 400
    entry = AuditEntry.objects.get(action="trigger.refused", outcome="malformed",
                                   actor=f"trigger:{trigger.id}")
    assert entry.actor == f"trigger:{trigger.id}"
    assert entry.data["problems"][0]["message"].startswith("invalid JSON body: ")


@pytest.mark.parametrize("missing", ["webhook-id", "webhook-timestamp", "webhook-signature"])
def test_a_signed_post_without_one_of_its_headers_is_refused_for_the_missing_header(
        hook, frozen, missing):
    from triggers.services.webhooks import webhook_receive
    from triggers.signatures import sign

    trigger, secret = hook
    stamp = int(frozen.moment.timestamp())
    headers = {"webhook-id": "d-1", "webhook-timestamp": str(stamp),
               "webhook-signature": sign(secret, "d-1", stamp, b"{}")}
    del headers[missing]

    outcome = webhook_receive(trigger_id=trigger.id, headers=headers, body=b"{}")

    assert (outcome.status, outcome.reason) == ("unauthorized", "missing_headers")
    assert outcome.problems == [{"path": "headers", "message": (
        "the webhook-id, webhook-timestamp and webhook-signature headers are required "
        "(Standard Webhooks)")}]


def test_an_empty_signed_body_fires_with_no_payload(client, team, support):
    constant = {"ticket_id": "T-0", "body": "ping", "customer_email": "ops@example.com"}
    trigger, secret = make_trigger(team, "webhook", name="ping", input_template=constant)

    answer = deliver(client, trigger, secret, b"", delivery="d-1")

    assert answer.status_code == 202
    firing = trigger.firings.get()
    assert firing.run.input == constant


def test_a_malformed_body_is_invalid_and_recorded_with_its_key_origin_and_path(hook, frozen):
    trigger, secret = hook
    stamp = int(frozen.moment.timestamp())

    outcome = webhook_receive(trigger_id=trigger.id, body=b"{oops", headers={
        "webhook-id": "d-5", "webhook-timestamp": str(stamp),
        "webhook-signature": sign(secret, "d-5", stamp, b"{oops")})

    assert (outcome.status, outcome.reason) == ("invalid", "malformed")
    entry = AuditEntry.objects.get(action="trigger.refused", outcome="malformed",
                                   actor=f"trigger:{trigger.id}")
    assert (entry.data["trigger"], entry.data["kind"]) == ("inbox", "webhook")
    assert (entry.data["key"], entry.data["origin"]) == ("delivery:d-5", {"delivery": "d-5"})
    assert [problem["path"] for problem in entry.data["problems"]] == ["body"]


def test_a_template_reads_the_delivery_and_the_headers_but_never_the_credentials(hook, frozen):
    trigger, secret = hook
    trigger_update(trigger_id=trigger.id, actor=SETUP, changes={"input_template": {
        "ticket_id": "{{ delivery }}", "body": "{{ headers | tojson }}",
        "customer_email": "{{ payload.email }}"}})
    body, stamp = json.dumps(TICKET).encode(), int(frozen.moment.timestamp())

    outcome = webhook_receive(trigger_id=trigger.id, body=body, headers={
        "Webhook-Id": "d-7", "Webhook-Timestamp": str(stamp),
        "Webhook-Signature": sign(secret, "d-7", stamp, body), "X-Source": "crm",
        "Authorization": "Bearer t", "Cookie": "s=1", "Proxy-Authorization": "Basic x"})

    assert outcome.status == "started"
    assert (outcome.firing.key, outcome.firing.origin) == ("delivery:d-7", {"delivery": "d-7"})
    assert outcome.run.input["ticket_id"] == "d-7"
    assert json.loads(outcome.run.input["body"]) == {
        "webhook-id": "d-7", "webhook-timestamp": str(stamp), "x-source": "crm"}
