"""Webhooks: signature, replay window, size, idempotency and admission, through the real URL.

No worker runs here: a started run is a committed row whose first steps are queued.
"""
import json
import logging
import time

import pytest

from audit.models import AuditEntry
from budgets.services import budget_limit_create
from orchestrator.models import Event, Run
from tests.factories import SETUP
from triggers.models import Firing
from triggers.services.config import trigger_update
from triggers.services.webhooks import refusal_tallies_record
from triggers.signatures import sign

from .conftest import TICKET, deliver, make_trigger

pytestmark = pytest.mark.django_db


@pytest.fixture
def hook(team, support):
    return make_trigger(team, "webhook")


def refusals(trigger) -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(action="trigger.refused", subject_id=str(trigger.id)))


def unauthenticated(trigger, frozen) -> list[AuditEntry]:
    """The ledger's entries for posts refused before they were authenticated: none per post,
    one per minute once that minute has passed (beat's `record_refusals`)."""
    assert refusals(trigger) == []
    refusal_tallies_record()
    assert refusals(trigger) == []  # the minute is still open
    frozen.advance(seconds=61)
    refusal_tallies_record()
    return refusals(trigger)


def test_a_signed_delivery_starts_a_run_and_answers_202_with_its_url(client, hook):
    trigger, secret = hook
    response = deliver(client, trigger, secret)

    assert response.status_code == 202, response.json()
    answer = response.json()
    run = Run.objects.get(id=answer["run"])
    assert answer["status"] == "started" and answer["run_url"].endswith(f"/api/v1/runs/{run.id}/")
    assert run.input == {"ticket_id": "T-7", "body": "My invoice is wrong",
                         "customer_email": "c@example.com"}
    assert run.trigger == "webhook" and run.state == "running"
    assert run.trigger_firing.trigger == trigger and run.trigger_firing.key == "delivery:d-1"
    created = Event.objects.get(run=run, kind="run.created")
    assert created.actor == f"trigger:{trigger.id}"
    assert created.payload["origin"]["name"] == "inbox"


def test_the_same_delivery_again_returns_the_same_run_and_starts_nothing(client, hook):
    trigger, secret = hook
    first = deliver(client, trigger, secret, delivery="d-1").json()
    again = deliver(client, trigger, secret, delivery="d-1")  # the sender retried
    other = deliver(client, trigger, secret, delivery="d-2")

    assert again.status_code == 200 and again.json()["run"] == first["run"]
    assert again.json()["status"] == "duplicate"
    assert other.status_code == 202 and other.json()["run"] != first["run"]
    assert Run.objects.count() == 2 and Firing.objects.count() == 2


# Each spoiled header from the test's clock: parameters are made at collection, which may be
# minutes before the test runs (a timestamp 600 s ahead then would be in the window by now).
@pytest.mark.parametrize("spoil, reason", [
    (lambda now: dict(signature="v1,AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="), "bad_signature"),
    (lambda now: dict(signature=""), "missing_headers"),
    (lambda now: dict(timestamp=now - 400), "stale_timestamp"),
    (lambda now: dict(timestamp=now + 600), "stale_timestamp"),
    (lambda now: dict(timestamp="yesterday"), "bad_timestamp"),
])
def test_a_bad_signature_or_a_stale_timestamp_is_refused_with_401_and_audited(client, hook, spoil,
                                                                             reason, frozen):
    trigger, secret = hook
    response = deliver(client, trigger, secret, **spoil(int(frozen().timestamp())))

    assert response.status_code == 401
    assert response.json()["errors"][0]["path"] == "headers"
    assert not Run.objects.exists()
    [entry] = unauthenticated(trigger, frozen)
    assert entry.outcome == "unauthenticated"
    assert (entry.data["count"], entry.data["reasons"]) == (1, {reason: 1})


def test_500_badly_signed_posts_write_one_ledger_entry_per_minute_with_the_count(
        client, hook, frozen):
    trigger, secret = hook
    before = AuditEntry.objects.count()
    for index in range(500):
        spoil = {"signature": ""} if index % 5 == 0 else {
            "signature": "v1,AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="}
        assert deliver(client, trigger, secret, delivery=f"d-{index}", **spoil).status_code == 401
    assert AuditEntry.objects.count() == before  # nothing per post
    frozen.advance(seconds=61)
    assert deliver(client, trigger, secret, delivery="late", signature="").status_code == 401

    assert refusal_tallies_record() == 1  # the minute that has passed, not the one still open
    [entry] = refusals(trigger)
    assert entry.outcome == "unauthenticated" and entry.data["count"] == 500
    assert entry.data["reasons"] == {"bad_signature": 400, "missing_headers": 100}
    assert entry.data["first_problem"]
    assert refusal_tallies_record() == 0  # each minute is written once
    frozen.advance(seconds=60)
    assert refusal_tallies_record() == 1
    assert [e.data["count"] for e in refusals(trigger)] == [500, 1]


def test_a_body_signed_with_another_secret_or_changed_on_the_way_is_refused(client, hook, team):
    trigger, secret = hook
    _, other_secret = make_trigger(team, "webhook", name="other")
    raw = json.dumps(TICKET).encode()
    stamp = int(time.time())
    forged = deliver(client, trigger, other_secret, raw, timestamp=stamp)
    tampered = deliver(client, trigger, secret, raw.replace(b"T-7", b"T-8"), timestamp=stamp,
                       signature=sign(secret, "d-1", stamp, raw))
    assert forged.status_code == tampered.status_code == 401
    assert not Run.objects.exists()


def test_an_oversized_body_is_refused_with_413_before_it_is_read(client, hook, frozen):
    trigger, secret = hook
    trigger_update(trigger_id=trigger.id, actor=SETUP, changes={"max_body_bytes": 1024})
    large = {**TICKET, "text": "x" * 2000}
    response = deliver(client, trigger, secret, large)

    assert response.status_code == 413
    assert "max_body_bytes" in response.json()["errors"][0]["message"]
    assert not Run.objects.exists()
    [entry] = unauthenticated(trigger, frozen)
    assert entry.data["reasons"] == {"too_large": 1}


def test_a_payload_that_is_not_json_or_not_a_valid_input_is_a_400_listing_the_problems(client, hook):
    trigger, secret = hook
    not_json = deliver(client, trigger, secret, b"{not json", delivery="d-1")
    invalid = deliver(client, trigger, secret, {"ticket": "T-1", "text": "", "email": "c@x.io"},
                      delivery="d-2")
    unmappable = deliver(client, trigger, secret, {"ticket": "T-1"}, delivery="d-3")

    assert not_json.status_code == 400 and not_json.json()["errors"][0]["path"] == "body"
    assert invalid.status_code == 400
    assert [e["path"] for e in invalid.json()["errors"]] == ["input.body"]
    assert unmappable.status_code == 400
    assert unmappable.json()["errors"][0] == {
        "path": "input_template.body", "message": "the payload has no field 'text' (at payload.text)"}
    assert not Run.objects.exists()
    assert [e.outcome for e in refusals(trigger)] == ["malformed", "invalid_input", "template_failed"]


def test_a_disabled_trigger_refuses_with_409_and_an_unknown_one_is_a_404(client, hook, team):
    trigger, secret = hook
    trigger_update(trigger_id=trigger.id, actor=SETUP, changes={"enabled": False})
    assert deliver(client, trigger, secret).status_code == 409
    schedule, _ = make_trigger(team, "schedule", name="nightly", cron="0 3 * * *", input_template={
        "ticket_id": "n-{{ slot }}", "body": "nightly", "customer_email": "ops@example.com"})
    assert client.post(f"/api/v1/hooks/{schedule.id}/", data=b"{}",
                       content_type="application/json").status_code == 404
    assert not Run.objects.exists()


def test_past_its_rate_a_trigger_refuses_with_429_and_retry_after(client, hook, frozen):
    trigger, secret = hook
    trigger_update(trigger_id=trigger.id, actor=SETUP, changes={"max_per_minute": 2})
    codes = [deliver(client, trigger, secret, delivery=f"d-{i}").status_code for i in range(3)]
    refused = deliver(client, trigger, secret, delivery="d-9")

    assert codes == [202, 202, 429]
    assert int(refused["Retry-After"]) == 60
    frozen.advance(seconds=61)
    assert deliver(client, trigger, secret, delivery="d-9").status_code == 202
    assert Run.objects.count() == 3
    assert {e.outcome for e in refusals(trigger)} == {"rate"}


def test_past_its_rate_a_queueing_trigger_holds_the_firing_and_starts_it_when_it_may(
        client, hook, frozen):
    from triggers.services.firing import queued_firings_admit

    trigger, secret = hook
    trigger_update(trigger_id=trigger.id, actor=SETUP,
                   changes={"max_per_minute": 1, "when_limited": "queue"})
    first = deliver(client, trigger, secret, delivery="d-1")
    held = deliver(client, trigger, secret, delivery="d-2")
    again = deliver(client, trigger, secret, delivery="d-2")

    assert first.status_code == 202 and held.status_code == 202
    assert held.json()["status"] == "queued" and held.json()["run"] is None
    assert again.status_code == 200 and again.json()["run"] is None  # still held, not doubled
    assert queued_firings_admit() == 0  # the rate still holds it
    assert Run.objects.count() == 1
    frozen.advance(seconds=61)
    assert queued_firings_admit() == 1
    firing = Firing.objects.get(key="delivery:d-2")
    assert firing.state == "started" and firing.run.input["ticket_id"] == "T-7"
    assert Run.objects.count() == 2


def test_a_team_at_its_cap_of_unfinished_runs_gets_no_new_run(client, hook, team):
    """The cap is the team's budget limit (budgets' `max_concurrent_runs`), the same one the
    API's start meets."""
    trigger, secret = hook
    budget_limit_create(team=team, actor=SETUP, max_concurrent_runs=1)
    assert deliver(client, trigger, secret, delivery="d-1").status_code == 202
    refused = deliver(client, trigger, secret, delivery="d-2")
    assert refused.status_code == 429 and refused["Retry-After"] == "30"
    assert refused.json()["errors"][0]["message"] == "team 'support' has 1 unfinished runs; its limit is 1"
    assert Run.objects.count() == 1


def test_the_team_cap_without_a_limit_is_the_setting(client, hook, settings):
    trigger, secret = hook
    settings.STEPWISE_TEAM_MAX_LIVE_RUNS = 1
    assert deliver(client, trigger, secret, delivery="d-1").status_code == 202
    refused = deliver(client, trigger, secret, delivery="d-2")
    assert refused.status_code == 429 and "its limit is 1" in refused.json()["errors"][0]["message"]


def test_a_rotated_secret_works_at_once_and_the_old_one_only_for_the_grace_period(
        client, hook, api, frozen):
    trigger, old = hook
    rotated = api.post(f"/api/v1/triggers/{trigger.id}/rotate-secret/")
    assert rotated.status_code == 200, rotated.json()
    new = rotated.json()["secret"]
    assert new != old and rotated.json()["webhook_url"].endswith(f"/api/v1/hooks/{trigger.id}/")

    assert deliver(client, trigger, new, delivery="d-1").status_code == 202
    assert deliver(client, trigger, old, delivery="d-2").status_code == 202
    frozen.advance(hours=24, seconds=1)
    assert deliver(client, trigger, old, delivery="d-3").status_code == 401
    assert deliver(client, trigger, new, delivery="d-4").status_code == 202


def test_the_secret_is_shown_once_and_never_stored_in_the_clear_logged_or_audited(
        client, team, support, api, caplog):
    caplog.set_level(logging.DEBUG)
    created = api.post("/api/v1/triggers/", {
        "kind": "webhook", "name": "inbox", "workflow": "support-reply",
        "input_template": {"ticket_id": "{{ payload.ticket }}", "body": "{{ payload.text }}",
                           "customer_email": "{{ payload.email }}"}}, format="json")
    assert created.status_code == 201, created.json()
    secret = created.json()["secret"]
    trigger_id = created.json()["id"]
    from triggers.models import Trigger

    trigger = Trigger.objects.get(id=trigger_id)
    deliver(client, trigger, secret, delivery="d-1")
    deliver(client, trigger, secret, delivery="d-2", signature="v1,wrong")

    shown_again = json.dumps(api.get(f"/api/v1/triggers/{trigger_id}/").json())
    stored = json.dumps([list(row) for row in Trigger.objects.values_list()], default=str)
    ledger = json.dumps([e.payload for e in AuditEntry.objects.all()])
    for place in (shown_again, stored, ledger, caplog.text):
        assert secret not in place and secret.removeprefix("whsec_") not in place
    assert created.json()["secret_fingerprint"] in shown_again


def test_twenty_deliveries_each_start_their_own_run(client, hook):
    """(How fast a webhook answers is a benchmark figure, bench/, not a timed test.)"""
    trigger, secret = hook
    answers = [deliver(client, trigger, secret, delivery=f"t-{i}") for i in range(20)]
    assert [a.status_code for a in answers] == [202] * 20
    assert len({a.json()["run"]["id"] if isinstance(a.json().get("run"), dict) else a.json()["run"]
                for a in answers}) == 20


def test_the_person_managing_triggers_needs_trigger_manage(client, team, support, approver_api):
    response = approver_api.post("/api/v1/triggers/", {"kind": "webhook", "name": "inbox",
                                                       "workflow": "support-reply"}, format="json")
    assert response.status_code == 403
    assert "trigger.manage" in response.json()["errors"][0]["message"]


def test_a_member_sees_the_triggers_of_the_team_and_outsiders_do_not(hook, approver_api, outsider_api):
    trigger, _ = hook
    assert approver_api.get(f"/api/v1/triggers/{trigger.id}/").status_code == 200
    assert outsider_api.get(f"/api/v1/triggers/{trigger.id}/").status_code == 404


def test_the_run_page_and_the_api_say_which_trigger_started_the_run(client, hook, api, admin_user):
    trigger, secret = hook
    run_id = deliver(client, trigger, secret).json()["run"]

    detail = api.get(f"/api/v1/runs/{run_id}/").json()
    assert detail["trigger"] == "webhook"
    assert detail["started_by"]["name"] == "inbox" and detail["started_by"]["key"] == "delivery:d-1"

    client.force_login(admin_user)
    html = client.get(f"/admin/orchestrator/run/{run_id}/change/").content.decode()
    assert "Started by trigger" in html and f"/admin/triggers/trigger/{trigger.id}/change/" in html
    timeline = client.get(f"/admin/audit/auditentry/run/{run_id}/").content.decode()
    assert "via webhook trigger &#x27;inbox&#x27; (delivery:d-1)" in timeline

