"""Held firings, secret rotation and dead-letter replays at their edges: whose firing is started
under which trigger, what a refusal records, and what a refused replay or rotation says.
Written from the mutation survivors of `triggers/services/` (docs/testing.md)."""
import json

import pytest

from audit.models import AuditEntry
from orchestrator.engine.errors import NotAllowed
from orchestrator.models import Event, Role, Run, TeamMembership
from tests.factories import SETUP, member
from triggers.models import EventDeadLetter, Firing
from triggers.services.config import TriggerInvalid, webhook_secret_rotate
from triggers.services.events import event_dead_letter_replay, event_receive
from triggers.services.firing import queued_firings_admit, trigger_fire_api

from .conftest import TICKET, make_trigger

pytestmark = pytest.mark.django_db
SOURCES = {"rabbitmq": "amqp://guest:guest@127.0.0.1:5672//"}


def ledger(**lookup) -> AuditEntry:
    """The one audit entry matching `lookup`, with its payload read (`body`)."""
    entry = AuditEntry.objects.get(**lookup)
    entry.body = json.loads(entry.payload)
    return entry


def programmatic(team, name: str):
    """An api trigger that starts one run a minute and holds the rest."""
    trigger, _ = make_trigger(team, "api", name=name, max_per_minute=1, when_limited="queue")
    return trigger


def fire(trigger, person, key: str, ticket: str):
    return trigger_fire_api(trigger_id=trigger.id, key=key, actor=person,
                            payload={**TICKET, "ticket": ticket})


def test_each_held_firing_starts_under_its_own_trigger_for_the_member_who_fired_it(
        team, support, move_clock):
    """A member's held firings start once the rate allows, each as a run of its own trigger
    with its own input: one trigger's admission never takes another trigger's firing."""
    person = member(team, "dev", role=Role.MEMBER)
    first, second = programmatic(team, "first"), programmatic(team, "second")
    for trigger in (second, first):  # the second trigger's firings are the older ones
        assert fire(trigger, person, "a", f"{trigger.name}-a").status == "started"
        assert fire(trigger, person, "b", f"{trigger.name}-b").status == "queued"
        assert fire(trigger, person, "c", f"{trigger.name}-c").status == "queued"
    move_clock(61)

    assert queued_firings_admit() == 2  # one a minute for each trigger

    started = Firing.objects.filter(key="request:b", state="started").select_related("run")
    assert {(f.trigger.name, f.run.input["ticket_id"]) for f in started} == {
        ("first", "first-b"), ("second", "second-b")}
    for firing in started:  # and the run says so
        created = Event.objects.get(run=firing.run, kind="run.created").payload
        assert created["origin"]["trigger"] == str(firing.trigger_id)
    move_clock(122)
    assert queued_firings_admit() == 2
    runs = Run.objects.filter(trigger_firing__key="request:c")
    assert sorted(run.input["ticket_id"] for run in runs) == ["first-c", "second-c"]
    assert Run.objects.count() == 6  # a run per firing: none taken for another's key


def test_a_held_firing_of_a_deleted_person_is_refused_and_the_refusal_recorded(
        team, support, move_clock):
    person = member(team, "gone", role=Role.MEMBER)
    trigger = programmatic(team, "prog")
    fire(trigger, person, "a", "T-1")
    fire(trigger, person, "b", "T-2")
    person.delete()
    move_clock(61)

    assert queued_firings_admit() == 0

    firing = Firing.objects.get(key="request:b")
    assert (firing.state, firing.reason) == ("refused", "refused_at_admission")
    assert firing.problems == [{"path": "", "message": "the person who fired it no longer exists"}]
    entry = ledger(action="trigger.refused", outcome="refused_at_admission")
    assert entry.body["key"] == "request:b"
    assert entry.body["origin"] == {"request": "b", "by": "user:gone"}
    assert entry.body["problems"] == firing.problems


def test_a_removed_members_held_firing_is_refused_with_the_reason_in_the_ledger(
        team, support, move_clock):
    person = member(team, "leaver", role=Role.MEMBER)
    trigger = programmatic(team, "prog")
    fire(trigger, person, "a", "T-1")
    fire(trigger, person, "b", "T-2")
    TeamMembership.objects.filter(team=team, user=person).delete()
    move_clock(61)

    assert queued_firings_admit() == 0

    entry = ledger(action="trigger.refused", outcome="refused_at_admission")
    assert entry.actor == "user:leaver"
    assert entry.body["key"] == "request:b" and entry.body["origin"]["request"] == "b"
    assert entry.body["problems"] == [{"path": "", "message": "user:leaver may no longer start "
                                          "runs in team 'support' (docs/permissions.md)"}]


def test_only_a_webhook_has_a_secret_to_rotate(team, support):
    trigger, _ = make_trigger(team, "api", name="prog")
    with pytest.raises(TriggerInvalid) as refused:
        webhook_secret_rotate(trigger_id=trigger.id, actor=SETUP)
    assert str(refused.value) == "only a webhook has a secret"
    assert refused.value.problems == [{"path": "kind",
                                       "message": "trigger 'prog' is a api, not a webhook"}]
    assert not AuditEntry.objects.filter(action="trigger.secret_rotated").exists()


def test_a_rotation_is_recorded_with_both_fingerprints_and_the_end_of_the_grace(
        team, support, requester):
    trigger, _ = make_trigger(team, "webhook", name="hook")
    old = trigger.secret_fingerprint

    rotated, secret = webhook_secret_rotate(trigger_id=trigger.id, actor=requester)

    entry = ledger(action="trigger.secret_rotated")
    assert (entry.actor, entry.outcome) == ("user:requester", "rotated")
    assert "redacted" in entry.body["secret_fingerprint"]  # the ledger hides what names a secret
    assert entry.body["previous_fingerprint"] == old
    assert entry.body["previous_valid_until"] == rotated.previous_secret_until.isoformat()
    assert secret not in entry.payload


@pytest.fixture
def dead_letter(team, support, settings):
    settings.STEPWISE_EVENT_SOURCES = SOURCES
    trigger, _ = make_trigger(team, "queue", name="tickets", source="rabbitmq",
                              exchange="helpdesk", binding_key="tickets.*")
    event_receive(trigger_id=trigger.id, message_id="m-1", body=b"{oops",
                  meta={"exchange": "helpdesk", "routing_key": "tickets.created"})
    return EventDeadLetter.objects.get()


@pytest.fixture
def redriver(team):
    return member(team, "op", role=Role.OPERATOR)


def test_a_replay_is_recorded_with_the_letter_its_key_and_the_run(dead_letter, redriver):
    EventDeadLetter.objects.filter(id=dead_letter.id).update(body=json.dumps(TICKET))

    letter, outcome = event_dead_letter_replay(dead_letter_id=dead_letter.id, actor=redriver)

    entry = ledger(action="trigger.dead_letter_replayed")
    assert (entry.actor, entry.outcome) == ("user:op", "started")
    assert entry.body["dead_letter"] == letter.id and entry.body["key"] == "message:m-1"
    assert entry.body["run"] == str(outcome.run.id)


def test_a_replay_that_still_fails_is_recorded_without_a_run(dead_letter, redriver):
    event_dead_letter_replay(dead_letter_id=dead_letter.id, actor=redriver)
    entry = ledger(action="trigger.dead_letter_replayed")
    assert entry.outcome == "invalid" and entry.body["run"] is None


def test_a_refused_replay_says_why(dead_letter, redriver, team):
    EventDeadLetter.objects.filter(id=dead_letter.id).update(body=json.dumps(TICKET))
    event_dead_letter_replay(dead_letter_id=dead_letter.id, actor=redriver)
    with pytest.raises(NotAllowed) as again:
        event_dead_letter_replay(dead_letter_id=dead_letter.id, actor=redriver)
    assert str(again.value) == f"event dead letter {dead_letter.id} was replayed already"

    EventDeadLetter.objects.filter(id=dead_letter.id).update(status="open", body_complete=False)
    with pytest.raises(NotAllowed) as cut:
        event_dead_letter_replay(dead_letter_id=dead_letter.id, actor=redriver)
    assert str(cut.value) == (f"event dead letter {dead_letter.id} keeps only the start of a "
                              "message that was too large: it cannot be replayed")

    EventDeadLetter.objects.filter(id=dead_letter.id).update(body_complete=True)
    dead_letter.trigger.__class__.objects.filter(id=dead_letter.trigger_id).update(enabled=False)
    with pytest.raises(NotAllowed) as disabled:
        event_dead_letter_replay(dead_letter_id=dead_letter.id, actor=redriver)
    assert str(disabled.value) == "trigger 'tickets' is disabled: enable it to replay its events"


def test_only_an_api_trigger_is_fired_through_the_api(team, support, requester):
    hook, _ = make_trigger(team, "webhook", name="hook")
    with pytest.raises(NotAllowed) as refused:
        fire(hook, requester, "a", "T-1")
    assert str(refused.value) == ("trigger 'hook' is a webhook trigger; only an api trigger is "
                                  "fired through the API")
    assert not Firing.objects.exists()
