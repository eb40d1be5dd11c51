"""How an event becomes a run input (triggers/mapping.py): filter and template."""
import pytest

from triggers.mapping import (
    MappingFailed,
    event_matches,
    filter_problems,
    input_from_event,
    template_problems,
)

EVENT = {"payload": {"id": "T-9", "count": 3, "tags": ["a", "b"], "from": {"email": "c@example.com"}},
         "message": {"routing_key": "tickets.created"}, "slot": "2026-01-01T10:00:00+01:00"}


def test_a_string_that_is_one_expression_keeps_the_type_and_others_render_as_text():
    template = {"ticket_id": "{{ payload.id }}", "count": "{{ payload.count }}",
                "tags": "{{ payload.tags }}", "email": "{{ payload.from.email }}",
                "label": "#{{ payload.count }} at {{ slot }}", "fixed": 5, "plain": "a < b"}
    assert input_from_event(template, EVENT) == {
        "ticket_id": "T-9", "count": 3, "tags": ["a", "b"], "email": "c@example.com",
        "label": "#3 at 2026-01-01T10:00:00+01:00", "fixed": 5, "plain": "a < b"}


def test_without_a_template_the_payload_is_the_input_and_must_be_an_object():
    assert input_from_event(None, EVENT) == EVENT["payload"]
    with pytest.raises(MappingFailed) as failed:
        input_from_event(None, {"payload": [1, 2]})
    assert failed.value.reason_class == "invalid_input"


def test_a_template_reading_what_the_event_lacks_fails_with_its_path_in_plain_words():
    with pytest.raises(MappingFailed) as failed:
        input_from_event({"ticket": {"id": "{{ payload.missing }}"}}, EVENT)
    assert failed.value.reason_class == "template_failed"
    assert failed.value.problems[0]["path"] == "input_template.ticket.id"
    assert failed.value.problems[0]["message"] == "the payload has no field 'missing' (at payload.missing)"


@pytest.mark.parametrize("template, says", [
    ("Ticket {{ payload.missing }}", "the payload has no field 'missing' (at payload.missing)"),
    ("{{ payload.from.name | upper }}", "payload.from has no field 'name' (at payload.from.name)"),
    ("{{ payload.tags.first }}", "payload.tags is a list, not an object: it has no field 'first'"),
    ("{{ payload.id.number }}", "payload.id is a string, not an object: it has no field 'number'"),
    ("{{ body.ticket }}", "there is no 'body' here; a template may use message, payload, slot"),
])
def test_what_a_template_misses_is_said_in_the_events_words_not_jinjas(template, says):
    with pytest.raises(MappingFailed) as failed:
        input_from_event({"value": template}, EVENT)
    [problem] = failed.value.problems
    assert problem == {"path": "input_template.value", "message": says}
    assert "dict object" not in problem["message"]


def test_templates_and_filters_are_checked_when_the_trigger_is_saved():
    assert template_problems({"a": ["{{ oops( }}"]})[0]["path"] == "input_template.a[0]"
    assert template_problems({"a": "{{ payload.x }}"}) == []
    assert filter_problems("payload.count >")[0]["path"] == "filter"


@pytest.mark.parametrize("expression, matches", [
    ("", True),
    ("message.routing_key == 'tickets.created'", True),
    ("payload.count > 5", False),
    ("'a' in payload.tags && payload.id.startsWith('T-')", True),
])
def test_the_filter_is_a_cel_condition_on_the_event(expression, matches):
    assert event_matches(expression, EVENT) is matches


@pytest.mark.parametrize("expression", ["payload.nothing == 1", "payload.count"])
def test_a_filter_that_fails_or_is_not_a_condition_is_a_problem_not_a_crash(expression):
    with pytest.raises(MappingFailed) as failed:
        event_matches(expression, EVENT)
    assert failed.value.reason_class == "filter_failed"
