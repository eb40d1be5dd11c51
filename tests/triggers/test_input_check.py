"""What a trigger gives its workflow is checked when it is saved, and a slot that starts no run
shows where its owner looks: a refused firing with the reason, and one alert."""
import copy

import pytest

from alerts.models import Alert
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Role
from tests.conftest import client_for
from tests.factories import SETUP, example_definition, member
from triggers.models import Firing, Trigger
from triggers.services.schedules import schedule_tick

from .conftest import SUPPORT_TEMPLATE, make_trigger
from .test_admin import FORM, admin_for
from .test_schedules import DIGEST

pytestmark = pytest.mark.django_db


@pytest.fixture
def editor_api(team):
    return client_for(member(team, "trigger_owner", role=Role.EDITOR))


def create(api, **body):
    return api.post("/api/v1/triggers/", {"kind": "schedule", "name": "every-minute",
                                          "workflow": "support-reply", "cron": "* * * * *",
                                          **body}, format="json")


def test_a_schedule_without_an_input_template_is_refused_when_it_is_saved(editor_api, support):
    response = create(editor_api)

    assert response.status_code == 400, response.json()
    [problem] = response.json()["errors"]
    assert problem["path"] == "input_template"
    assert "support-reply" in problem["message"] and "{{ slot }}" in problem["message"]
    assert not Trigger.objects.exists()


@pytest.mark.parametrize("template, path, words", [
    ({"ticket_id": "d-{{ slot }}", "body": "digest"}, "input_template",
     "'customer_email' is a required property"),
    ({**DIGEST, "customer_email": "ops at example"}, "input_template.customer_email",
     "is not a 'email'"),
    ({**DIGEST, "ticket_id": "{{ slot | length }}"}, "input_template.ticket_id",
     "is not of type 'string'"),
])
def test_a_schedule_whose_template_does_not_make_a_valid_input_is_refused_with_the_path(
        editor_api, support, template, path, words):
    response = create(editor_api, input_template=template)

    assert response.status_code == 400
    problems = response.json()["errors"]
    assert [p["path"] for p in problems] == [path]
    assert words in problems[0]["message"]
    assert create(editor_api, input_template=DIGEST).status_code == 201


@pytest.mark.parametrize("template, problem", [
    ({"ticket_id": "{{ payload.id }}", "body": "{{ payload.text }}"},
     {"path": "input_template", "message": "gives 'customer_email' is a required property "
      "(the input schema of workflow 'support-reply')"}),
    ({**SUPPORT_TEMPLATE, "priority": "{{ payload.priority }}"},
     {"path": "input_template", "message": "gives Additional properties are not allowed "
      "('priority' was unexpected) (the input schema of workflow 'support-reply')"}),
    ({**SUPPORT_TEMPLATE, "ticket_id": 42},
     {"path": "input_template.ticket_id", "message": "gives 42 is not of type 'string' "
      "(the input schema of workflow 'support-reply')"}),
])
def test_an_event_template_is_refused_for_what_it_gets_wrong_whatever_the_payload(
        editor_api, support, template, problem):
    response = editor_api.post("/api/v1/triggers/", {
        "kind": "webhook", "name": "tickets", "workflow": "support-reply",
        "input_template": template}, format="json")

    assert response.status_code == 400
    assert response.json()["errors"] == [problem]
    # Templated values are the payload's to give: the support template itself is accepted.
    assert editor_api.post("/api/v1/triggers/", {
        "kind": "webhook", "name": "tickets", "workflow": "support-reply",
        "input_template": SUPPORT_TEMPLATE}, format="json").status_code == 201


def test_the_admin_marks_the_template_of_a_schedule_that_would_fire_into_nothing(team, support):
    page = admin_for(team, Role.EDITOR).post("/admin/triggers/trigger/add/", {
        **FORM, "team": team.id, "kind": "schedule", "workflow": support.workflow_id,
        "cron": "* * * * *"})

    assert page.status_code == 200
    assert list(page.context["adminform"].form.errors) == ["input_template"]
    assert not Trigger.objects.exists()


def test_a_refused_slot_is_a_firing_with_its_reason_and_one_alert(team, support, frozen, editor_api):
    frozen.moment = frozen.moment.replace(second=30)
    trigger, _ = make_trigger(team, "schedule", name="digest", cron="* * * * *",
                              input_template=DIGEST)
    stricter = copy.deepcopy(example_definition("support"))
    stricter["input_schema"]["required"].append("priority")
    stricter["input_schema"]["properties"]["priority"] = {"type": "integer"}
    workflow_save(team=team, definition=stricter, actor=SETUP)  # the workflow changed since
    for _ in range(2):
        frozen.advance(minutes=1)
        [outcome] = schedule_tick(trigger_id=trigger.id)
        assert outcome.status == "invalid"

    firings = editor_api.get(f"/api/v1/triggers/{trigger.id}/firings/").json()["results"]
    assert [(f["state"], f["reason"], f["run"]) for f in firings] == [
        ("refused", "invalid_input", None)] * 2
    assert firings[0]["problems"] == [{"path": "input",
                                       "message": "'priority' is a required property"}]
    [alert] = Alert.objects.all()  # once, not once a minute
    assert (alert.rule, alert.severity, alert.team) == ("trigger.refused", "warning", team)
    assert "digest" in alert.subject and "'priority' is a required property" in alert.body
    page = admin_for(team, Role.MEMBER).get(f"/admin/triggers/trigger/{trigger.id}/change/")
    assert "invalid_input: input: &#x27;priority&#x27; is a required property" in page.content.decode()
    assert Firing.objects.filter(state="refused").count() == 2


def test_the_api_gives_a_schedules_next_slots_in_its_zone(editor_api, support, frozen):
    created = create(editor_api, cron="0 9 * * mon", timezone="Europe/Paris",
                     input_template=DIGEST).json()
    detail = editor_api.get(f"/api/v1/triggers/{created['id']}/").json()

    slots = detail["next_slots"]
    assert len(slots) == 5 and all(s["label"].startswith("Mon ") and " 09:00 CE" in s["label"]
                                   for s in slots)
    assert [s["at"] for s in slots] == sorted(s["at"] for s in slots)
    assert slots[0]["at"] > frozen.moment.isoformat()
    hook = editor_api.post("/api/v1/triggers/", {"kind": "api", "name": "by-hand",
                                                 "workflow": "support-reply"}, format="json")
    assert hook.json()["next_slots"] is None
