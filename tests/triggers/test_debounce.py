"""Debounce and coalesce (docs/triggers.md#debounce-and-coalesce): a burst of events starts one
run, with the last event's input, once the burst's group has been quiet for `debounce_s` (or
its first event was held `debounce_max_s`); what a burst replaced is kept, coalesced into the
event that started the run; the run still goes through admission."""
import json

import pytest
from django.db.models import Max

from audit.models import AuditEntry
from orchestrator.models import Role, Run
from tests.factories import SETUP, member
from triggers.models import Firing
from triggers.services.config import TriggerInvalid, trigger_update
from triggers.services.firing import queued_firings_admit, trigger_fire_api

from .conftest import TICKET, deliver, make_trigger

pytestmark = pytest.mark.django_db


def ticket(n: int, email: str = "c@example.com") -> dict:
    return {**TICKET, "ticket": f"T-{n}", "email": email}


@pytest.fixture
def before():
    """The ledger's last entry before the test (PostgreSQL's ledger keeps earlier tests' entries)."""
    return AuditEntry.objects.aggregate(last=Max("id"))["last"] or 0


def test_a_burst_of_ten_webhook_events_starts_one_run_with_the_last_events_input(client, team, support, frozen, before):
    trigger, secret = make_trigger(team, "webhook", debounce_s=5)
    answers = []
    for n in range(10):
        answers.append(deliver(client, trigger, secret, ticket(n), delivery=f"d-{n}"))
        frozen.advance(seconds=1)
    assert {a.status_code for a in answers} == {202}
    assert {a.json()["status"] for a in answers} == {"debounced"}
    assert all(a.json()["run"] is None for a in answers)

    frozen.advance(seconds=3)  # 4 s after the last event: the burst is not over yet
    assert queued_firings_admit() == 0
    frozen.advance(seconds=1)
    assert queued_firings_admit() == 1

    [run] = Run.objects.filter(version__workflow=trigger.workflow)
    assert run.input["ticket_id"] == "T-9"
    last = Firing.objects.get(key="delivery:d-9")
    assert (last.state, last.run) == ("started", run)
    coalesced = Firing.objects.filter(trigger=trigger, state="coalesced")
    assert coalesced.count() == 9 and {f.coalesced_into_id for f in coalesced} == {last.id}
    assert not coalesced.exclude(input=None).exists()  # what they carried is not kept twice
    # A sender retrying a replaced event hears which run took care of it.
    again = deliver(client, trigger, secret, ticket(0), delivery="d-0")
    assert (again.status_code, again.json()["status"], again.json()["run"]) == (200, "duplicate", str(run.id))
    # One ledger entry for the burst, not one per event.
    [entry] = AuditEntry.objects.filter(action="trigger.debounced", id__gt=before)
    assert (entry.outcome, entry.actor) == ("released", "service:debounce")
    assert json.loads(entry.payload) | {"held_since": None} == {
        "trigger": "inbox", "kind": "webhook", "key": "delivery:d-9", "group": "", "coalesced": 9,
        "held_since": None}
    assert queued_firings_admit() == 0  # once


def test_each_group_of_the_debounce_key_starts_its_own_run(team, support, frozen):
    person = member(team, "dev", role=Role.MEMBER)
    trigger, _ = make_trigger(team, "api", debounce_s=5, debounce_key="payload.email")
    for n in range(6):
        email = "a@example.com" if n % 2 else "b@example.com"
        outcome = trigger_fire_api(trigger_id=trigger.id, key=f"k{n}", actor=person, payload=ticket(n, email))
        assert outcome.status == "debounced"

    frozen.advance(seconds=5)
    assert queued_firings_admit() == 2
    started = {run.input["customer_email"]: run.input["ticket_id"]
               for run in Run.objects.filter(version__workflow=trigger.workflow)}
    assert started == {"a@example.com": "T-5", "b@example.com": "T-4"}


def test_a_group_that_never_goes_quiet_is_let_go_at_debounce_max_s(team, support, frozen):
    person = member(team, "dev", role=Role.MEMBER)
    trigger, _ = make_trigger(team, "api", debounce_s=5, debounce_max_s=12)
    started = []
    for n in range(8):  # an event every 3 s: never 5 s of quiet
        trigger_fire_api(trigger_id=trigger.id, key=f"k{n}", actor=person, payload=ticket(n))
        started.append(queued_firings_admit())
        frozen.advance(seconds=3)
    # Held since 0 s, let go at 12 s with the event of 12 s; the next burst was held from 15 s.
    assert started == [0, 0, 0, 0, 1, 0, 0, 0]
    assert [r.input["ticket_id"] for r in Run.objects.filter(version__workflow=trigger.workflow)] == ["T-4"]


def test_without_debounce_max_s_a_group_is_held_at_most_ten_windows(team, support, frozen):
    person = member(team, "dev", role=Role.MEMBER)
    trigger, _ = make_trigger(team, "api", debounce_s=2)
    for n in range(20):  # held since 0 s; at 19 s, 2 s more would pass the bound
        trigger_fire_api(trigger_id=trigger.id, key=f"k{n}", actor=person, payload=ticket(n))
        frozen.advance(seconds=1)
    held = Firing.objects.get(trigger=trigger, state="debouncing")
    assert held.key == "request:k19"
    assert (held.due_at - held.held_since).total_seconds() == 20


def test_a_let_go_event_waits_for_admission_like_a_held_firing(team, support, frozen):
    person = member(team, "dev", role=Role.MEMBER)
    trigger, _ = make_trigger(team, "api", debounce_s=5, debounce_key="payload.email", max_per_minute=1)
    trigger_fire_api(trigger_id=trigger.id, key="a", actor=person, payload=ticket(1, "a@example.com"))
    trigger_fire_api(trigger_id=trigger.id, key="b", actor=person, payload=ticket(2, "b@example.com"))
    frozen.advance(seconds=5)

    assert queued_firings_admit() == 1  # the trigger's rate lets one run start this minute
    assert Firing.objects.filter(trigger=trigger, state="queued").count() == 1
    frozen.advance(seconds=60)
    assert queued_firings_admit() == 1


def test_an_event_that_makes_no_valid_input_does_not_take_the_held_ones_place(team, support, frozen):
    person = member(team, "dev", role=Role.MEMBER)
    trigger, _ = make_trigger(team, "api", debounce_s=5)
    trigger_fire_api(trigger_id=trigger.id, key="good", actor=person, payload=ticket(1))
    bad = trigger_fire_api(trigger_id=trigger.id, key="bad", actor=person, payload={**ticket(2), "email": "not an address"})
    assert bad.status == "invalid"

    frozen.advance(seconds=5)
    assert queued_firings_admit() == 1
    assert Run.objects.get(version__workflow=trigger.workflow).input["ticket_id"] == "T-1"


def test_a_debounce_key_that_gives_no_string_refuses_the_event_with_its_path(team, support, frozen):
    person = member(team, "dev", role=Role.MEMBER)
    trigger, _ = make_trigger(team, "api", debounce_s=5, debounce_key="size(payload.text)")
    assert trigger_fire_api(trigger_id=trigger.id, key="ok", actor=person, payload=ticket(1)).status == "debounced"
    trigger_update(trigger_id=trigger.id, actor=SETUP, changes={"debounce_key": "payload.text.startsWith('My')"})

    refused = trigger_fire_api(trigger_id=trigger.id, key="bool", actor=person, payload=ticket(2))

    assert (refused.status, refused.reason) == ("invalid", "debounce_key_failed")
    assert refused.problems == [{"path": "debounce_key", "message": "must give a string (or null), not bool"}]


@pytest.mark.parametrize(("kind", "values", "problems"), [
    ("api", {"debounce_key": "payload.email"}, [("debounce_key", "needs debounce_s")]),
    ("api", {"debounce_max_s": 30}, [("debounce_max_s", "needs debounce_s")]),
    ("api", {"debounce_s": 0}, [("debounce_s", "must be 1 to 86,400 seconds")]),
    ("api", {"debounce_s": 10, "debounce_max_s": 5}, [("debounce_max_s", "must be debounce_s (10) to 86,400 seconds")]),
    ("api", {"debounce_s": 5, "debounce_key": "payload.("}, [("debounce_key", None)]),
    ("api", {"debounce_s": 5, "correlate": "payload.ticket"}, [("debounce_s", None)]),
    ("schedule", {"debounce_s": 5, "interval_s": 60, "input_template": {"ticket_id": "x", "body": "y",
                                                                          "customer_email": "o@example.com"}},
     [("debounce_s", "is not a setting of a schedule trigger")]),
])
def test_what_debounce_settings_are_refused(team, support, kind, values, problems):
    with pytest.raises(TriggerInvalid) as refused:
        make_trigger(team, kind, **values)
    got = [(p["path"], p["message"]) for p in refused.value.problems]
    assert [path for path, _ in got] == [path for path, _ in problems]
    for (_, message), (_, expected) in zip(got, problems, strict=True):
        assert expected is None or message == expected


def test_the_triggers_page_says_what_is_held_and_what_replaced_what(client, team, support, frozen):
    from tests.triggers.test_admin import admin_for

    trigger, secret = make_trigger(team, "webhook", debounce_s=5, debounce_key="payload.email")
    deliver(client, trigger, secret, ticket(1), delivery="d-1")
    deliver(client, trigger, secret, ticket(2), delivery="d-2")
    deliver(client, trigger, secret, ticket(3, "other@example.com"), delivery="d-3")
    frozen.advance(seconds=4)
    deliver(client, trigger, secret, ticket(4, "other@example.com"), delivery="d-4")
    frozen.advance(seconds=1)
    queued_firings_admit()
    run = Run.objects.get(version__workflow=trigger.workflow)

    page = admin_for(team, Role.MEMBER).get(f"/admin/triggers/trigger/{trigger.id}/change/").content.decode()

    assert f"replaced by delivery:d-2, which started run {run.id}" in page
    assert "replaced by delivery:d-4</td>" in page
    held = Firing.objects.get(key="delivery:d-4").due_at
    assert f"held until {held:%H:%M:%S} UTC unless a newer event comes" in page
