"""`fire` at its edges: a key refused before, what the filter and the template read, what a
refused firing records, and a trigger pinned to a version that is gone. Written from the
mutation survivors of `triggers/services/firing.py` (docs/testing.md)."""
import json

import pytest
from django.db.models import Max

from audit.models import AuditEntry
from orchestrator.models import Role
from tests.factories import SETUP, member
from triggers.models import Firing, Trigger
from triggers.services.firing import fire, trigger_fire_api, trigger_lock

from .conftest import SUPPORT_TEMPLATE, TICKET, make_trigger

pytestmark = pytest.mark.django_db


_LEDGER = {"last_before_the_test": 0}


@pytest.fixture(autouse=True)
def _ledger_before_the_test():
    """Entries that earlier transactional tests committed stay in PostgreSQL's append-only
    ledger: a test reads only those written after it started."""
    _LEDGER["last_before_the_test"] = AuditEntry.objects.aggregate(last=Max("id"))["last"] or 0


def written_entry(action: str) -> AuditEntry:
    """The one `action` entry this test wrote."""
    return AuditEntry.objects.get(action=action, id__gt=_LEDGER["last_before_the_test"])


def refused_entry() -> dict:
    """The payload of the one `trigger.refused` entry this test wrote."""
    return json.loads(written_entry("trigger.refused").payload)


def test_a_key_refused_when_held_is_answered_with_its_firing_and_problems_again(
        team, support, move_clock):
    person = member(team, "leaver", role=Role.MEMBER)
    trigger, _ = make_trigger(team, "api", name="prog", max_per_minute=1, when_limited="queue")
    trigger_fire_api(trigger_id=trigger.id, key="a", actor=person, payload=TICKET)
    trigger_fire_api(trigger_id=trigger.id, key="b", actor=person, payload=TICKET)
    Firing.objects.filter(key="request:b").update(
        state=Firing.State.REFUSED, reason="refused_at_admission",
        problems=[{"path": "", "message": "no longer a member"}])

    again = trigger_fire_api(trigger_id=trigger.id, key="b", actor=person, payload=TICKET)

    assert (again.status, again.reason) == ("refused", "refused_at_admission")
    assert again.firing == Firing.objects.get(key="request:b")
    assert again.problems == [{"path": "", "message": "no longer a member"}]


def test_a_key_fired_before_is_answered_with_its_run_and_firing(team, support):
    person = member(team, "dev", role=Role.MEMBER)
    trigger, _ = make_trigger(team, "api", name="prog")
    first = trigger_fire_api(trigger_id=trigger.id, key="a", actor=person, payload=TICKET)

    again = trigger_fire_api(trigger_id=trigger.id, key="a", actor=person, payload=TICKET)

    assert again.status == "duplicate"
    assert (again.run, again.firing) == (first.run, first.firing)


def test_a_template_reads_the_triggers_name_and_kind(team, support):
    person = member(team, "dev", role=Role.MEMBER)
    template = {**SUPPORT_TEMPLATE, "body": "{{ trigger.kind }}/{{ trigger.name }}"}
    trigger, _ = make_trigger(team, "api", name="prog", input_template=template)

    outcome = trigger_fire_api(trigger_id=trigger.id, key="a", actor=person, payload=TICKET)

    assert outcome.run.input["body"] == "api/prog"


def test_an_event_the_filter_turns_down_is_ignored_for_the_filter(team, support):
    person = member(team, "dev", role=Role.MEMBER)
    trigger, _ = make_trigger(team, "api", name="prog", filter="payload.ticket == 'T-9'")

    outcome = trigger_fire_api(trigger_id=trigger.id, key="a", actor=person, payload=TICKET)

    assert (outcome.status, outcome.reason, outcome.run) == ("ignored", "filter", None)


def test_an_event_the_template_cannot_map_is_refused_with_its_key_and_origin_recorded(
        team, support):
    person = member(team, "dev", role=Role.MEMBER)
    trigger, _ = make_trigger(team, "api", name="prog", input_template=None)

    outcome = trigger_fire_api(trigger_id=trigger.id, key="a", actor=person, payload=["T-7"])

    assert (outcome.status, outcome.reason) == ("invalid", "invalid_input")
    entry = refused_entry()
    assert (entry["key"], entry["reason"]) == ("request:a", "invalid_input")
    assert entry["origin"] == {"request": "a", "by": "user:dev"}
    assert entry["problems"] == outcome.problems == [{"path": "payload", "message": (
        "the payload must be a JSON object, or the trigger needs an input_template")}]


def test_an_input_past_the_limits_is_refused_before_the_schema_reads_it(team, support):
    person = member(team, "dev", role=Role.MEMBER)
    trigger, _ = make_trigger(team, "api", name="prog", input_template=None)
    deep: dict = {**TICKET}
    for _ in range(70):
        deep = {"nested": deep}

    outcome = trigger_fire_api(trigger_id=trigger.id, key="a", actor=person,
                               payload={**TICKET, "ticket_id": "T-7", "body": "b",
                                        "customer_email": "c@example.com", "extra": deep})

    assert (outcome.status, outcome.reason) == ("invalid", "invalid_input")
    assert [p["message"] for p in outcome.problems] == [
        "the run input nests deeper than 64 levels"]


def test_a_trigger_pinned_to_a_version_that_is_gone_is_refused_with_the_reason(team, support):
    trigger, _ = make_trigger(team, "webhook", name="hook")
    Trigger.objects.filter(id=trigger.id).update(workflow_version=9)

    outcome = fire(trigger_lock(trigger.id), key="k", context={"payload": TICKET},
                   origin={"delivery": "d-1"})

    assert (outcome.status, outcome.reason) == ("invalid", "invalid_input")
    assert outcome.problems == [{"path": "workflow_version",
                                 "message": "workflow 'support-reply' has no version 9"}]
    entry = refused_entry()
    assert (entry["key"], entry["origin"]) == ("k", {"delivery": "d-1"})


def test_a_trigger_on_a_workflow_with_no_published_version_is_refused_with_the_reason(
        team, support):
    trigger, _ = make_trigger(team, "webhook", name="hook")
    support.workflow.__class__.objects.filter(id=support.workflow_id).update(active_version=None)

    outcome = fire(trigger_lock(trigger.id), key="k", context={"payload": TICKET},
                   origin={"delivery": "d-1"})

    assert outcome.problems == [{"path": "workflow_version", "message": (
        "workflow 'support-reply' has no published version")}]


def test_fire_itself_refuses_a_person_who_may_not_start_runs_before_holding_anything(
        team, support):
    """Every caller checks first; `fire` checks again, so a held firing is never taken from
    someone who could not have started it."""
    from orchestrator.engine.errors import Forbidden
    from tests.factories import TeamFactory

    trigger, _ = make_trigger(team, "api", name="prog", max_per_minute=1, when_limited="queue")
    trigger_fire_api(trigger_id=trigger.id, key="a", actor=member(team, "dev", role=Role.MEMBER),
                     payload=TICKET)
    outsider = member(TeamFactory(slug="other", name="Other"), "outsider", role=Role.OWNER)

    with pytest.raises(Forbidden):
        fire(trigger_lock(trigger.id), key="request:b", context={"payload": TICKET},
             origin={"request": "b"}, actor=outsider)

    assert not Firing.objects.filter(key="request:b").exists()


def held_trigger(team, **values):
    """An api trigger that starts one run a minute and holds the rest, and who fires it."""
    trigger, _ = make_trigger(team, "api", name="prog", max_per_minute=1, when_limited="queue",
                              **values)
    person = member(team, "dev", role=Role.MEMBER)

    def fire_as(key: str):
        return trigger_fire_api(trigger_id=trigger.id, key=key, actor=person, payload=TICKET)
    return trigger, fire_as


def test_a_firing_waits_behind_held_ones_even_when_the_rate_lets_it_go(
        team, support, move_clock):
    _, fire_as = held_trigger(team)
    assert fire_as("a").status == "started"
    assert fire_as("b").status == "queued"
    move_clock(61)  # the rate would let one start now: the held one goes first

    behind = fire_as("c")

    assert (behind.status, behind.reason) == ("queued", "held")


def test_a_firing_starts_when_the_rate_allows_and_nothing_is_held(team, support, move_clock):
    _, fire_as = held_trigger(team)
    assert fire_as("a").status == "started"
    move_clock(61)

    assert fire_as("b").status == "started"  # the started firing is not a held one


def test_the_queue_is_full_at_max_queued_exactly(team, support, move_clock):
    trigger, fire_as = held_trigger(team, max_queued=2)
    assert [fire_as(key).status for key in "abc"] == ["started", "queued", "queued"]

    full = fire_as("d")

    assert (full.status, full.reason) == ("refused", "queue_full")
    assert full.problems == [{"path": "", "message": "trigger 'prog' already holds 2 firings "
                                                      "(max_queued)"}]
    assert full.retry_after_s == 60  # when the rate lets the next one start
    assert not Firing.objects.filter(key="request:d").exists()
    entry = refused_entry()
    assert (entry["trigger"], entry["key"], entry["reason"]) == ("prog", "request:d", "queue_full")
    assert entry["origin"] == {"request": "d", "by": "user:dev"}
    assert written_entry("trigger.refused").actor == "user:dev"
    move_clock(61)  # the rate is free again, and the two held ones still fill the queue

    late = fire_as("e")
    assert (late.reason, late.retry_after_s) == ("queue_full", 30)


def test_a_held_firing_keeps_its_input_origin_and_person_and_the_ledger_says_why(
        team, support, move_clock):
    trigger, fire_as = held_trigger(team)
    started = fire_as("a")
    held = fire_as("b")
    move_clock(61)
    behind = fire_as("c")

    assert (held.status, held.reason) == ("queued", "rate")
    assert held.firing == Firing.objects.get(key="request:b")
    person = started.firing.fired_by
    assert (held.firing.state, held.firing.input, held.firing.origin, held.firing.fired_by) == (
        "queued", {"ticket_id": "T-7", "body": "My invoice is wrong",
                   "customer_email": "c@example.com"}, {"request": "b", "by": "user:dev"}, person)
    entries = AuditEntry.objects.filter(action="trigger.queued").order_by("id")
    assert [(e.actor, e.outcome) for e in entries] == [("user:dev", "queued")] * 2
    payloads = [json.loads(e.payload) for e in entries]
    assert [(p["trigger"], p["key"], p["reason"]) for p in payloads] == [
        ("prog", "request:b", "trigger 'prog' started 1 runs in the last minute "
                              "(max_per_minute 1)"),
        ("prog", "request:c", "behind held firings")]
    assert behind.firing.key == "request:c"


def test_a_started_firing_records_its_run_origin_moment_and_person(team, support, move_clock):
    from orchestrator.engine import clock

    trigger, fire_as = held_trigger(team)
    outcome = fire_as("a")

    firing = Firing.objects.get(key="request:a")
    assert outcome.firing == firing and outcome.run == firing.run
    assert (firing.state, firing.origin, firing.started_at) == (
        "started", {"request": "a", "by": "user:dev"}, clock.now())
    assert firing.fired_by.username == "dev"
    assert firing.run.idempotency_key == f"trigger:{trigger.id}:request:a"


def test_a_webhook_firing_is_fired_by_no_person(team, support):
    trigger, _ = make_trigger(team, "webhook", name="hook")

    outcome = fire(trigger_lock(trigger.id), key="k", context={"payload": TICKET},
                   origin={"delivery": "d-1"})

    assert outcome.status == "started"
    assert (outcome.firing.fired_by, outcome.firing.origin) == (None, {"delivery": "d-1"})


def test_a_firing_over_the_rate_is_refused_with_when_to_retry_and_recorded(
        team, support, move_clock):
    trigger, _ = make_trigger(team, "api", name="prog", max_per_minute=1)
    person = member(team, "dev", role=Role.MEMBER)
    trigger_fire_api(trigger_id=trigger.id, key="a", actor=person, payload=TICKET)
    move_clock(20)

    over = trigger_fire_api(trigger_id=trigger.id, key="b", actor=person, payload=TICKET)

    assert (over.status, over.reason, over.retry_after_s) == ("refused", "rate", 40)
    assert over.problems == [{"path": "", "message": "trigger 'prog' started 1 runs in the "
                                                      "last minute (max_per_minute 1)"}]
    entry = refused_entry()
    assert (entry["key"], entry["reason"]) == ("request:b", "rate")
    assert entry["origin"] == {"request": "b", "by": "user:dev"}
    assert written_entry("trigger.refused").actor == "user:dev"


@pytest.mark.parametrize(("limit", "reason", "message", "retry_after_s"), [
    ({"max_concurrent_runs": 1}, "concurrent_runs",
     "team 'support' has 1 unfinished runs; its limit is 1", 30),
    ({"daily_usd": 0}, "budget", "team 'support' has committed $0.10 this day; its limit is $0.00",
     3600),
])
def test_a_firing_the_teams_cap_refuses_after_admitting_it_is_refused_for_that_cap(
        team, support, monkeypatch, limit, reason, message, retry_after_s):
    """Admitted a moment ago, refused by run_start's own admission: a race for the cap."""
    from budgets.services import budget_limit_create
    from triggers.services import firing

    trigger, _ = make_trigger(team, "api", name="prog")
    person = member(team, "dev", role=Role.MEMBER)
    trigger_fire_api(trigger_id=trigger.id, key="a", actor=person, payload=TICKET)
    budget_limit_create(team=team, actor=SETUP, **limit)
    monkeypatch.setattr(firing, "_limit", lambda trigger: None)  # as if read a moment earlier

    raced = trigger_fire_api(trigger_id=trigger.id, key="b", actor=person, payload=TICKET)

    assert (raced.status, raced.reason, raced.retry_after_s) == ("refused", reason, retry_after_s)
    assert raced.problems == [{"path": "", "message": message}]
    assert (raced.run, raced.firing) == (None, None)
    assert not Firing.objects.filter(key="request:b").exists()


def test_a_held_firing_whose_version_is_gone_when_admitted_is_refused_with_the_reason(
        team, support, move_clock):
    from triggers.services.firing import queued_firings_admit

    trigger, fire_as = held_trigger(team)
    fire_as("a")
    fire_as("b")
    Trigger.objects.filter(id=trigger.id).update(workflow_version=9)
    move_clock(61)

    assert queued_firings_admit() == 0

    firing = Firing.objects.get(key="request:b")
    assert (firing.state, firing.reason) == ("refused", "refused_at_admission")
    assert firing.problems == [{"path": "workflow_version", "message": "no such version"}]


def test_a_firing_refused_for_the_rate_in_its_last_second_may_retry_in_one(
        team, support, move_clock):
    trigger, _ = make_trigger(team, "api", name="prog", max_per_minute=1)
    person = member(team, "dev", role=Role.MEMBER)
    trigger_fire_api(trigger_id=trigger.id, key="a", actor=person, payload=TICKET)
    move_clock(59.5)

    over = trigger_fire_api(trigger_id=trigger.id, key="b", actor=person, payload=TICKET)

    assert (over.reason, over.retry_after_s) == ("rate", 1)


def test_a_firing_past_the_teams_spent_budget_is_refused_for_the_budget_until_it_renews(
        team, support):
    from budgets.services import budget_limit_create

    trigger, _ = make_trigger(team, "api", name="prog")
    person = member(team, "dev", role=Role.MEMBER)
    trigger_fire_api(trigger_id=trigger.id, key="a", actor=person, payload=TICKET)
    budget_limit_create(team=team, actor=SETUP, daily_usd=0)

    spent = trigger_fire_api(trigger_id=trigger.id, key="b", actor=person, payload=TICKET)

    assert (spent.status, spent.reason, spent.retry_after_s) == ("refused", "budget", 3600)
    assert spent.problems == [{"path": "", "message": "team 'support' has committed $0.10 this "
                                                      "day; its limit is $0.00"}]


def test_a_triggers_ledger_entries_name_it_its_team_and_workflow(team, support):
    from triggers.services.webhooks import refusal_tallies_record

    trigger, _ = make_trigger(team, "webhook", name="hook")
    trigger_lock(trigger.id)

    created = written_entry("trigger.created")

    assert (created.subject_type, created.subject_id, created.team, created.workflow) == (
        "trigger", str(trigger.id), "support", "support-reply")
    assert created.idempotency_key == ""  # only a tally's entry is keyed
    assert refusal_tallies_record() == 0
