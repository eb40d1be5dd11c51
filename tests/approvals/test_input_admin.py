"""An input task in the admin: its form drawn from the step's JSON Schema as Django fields (each
kind of field, required or not, its bounds), the answer the form gives the service, an
abstention, and an assignee who is in no group signing in to answer."""
import pytest
from django import forms
from django.test import Client

from approvals.forms import AnswerForm
from approvals.models import InputTask
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from tests.factories import SETUP, member

from .conftest import INBOX, signed_in

pytestmark = pytest.mark.django_db

SCHEMA = {"type": "object", "required": ["iban", "ok"],
          "properties": {"iban": {"type": "string", "title": "IBAN", "maxLength": 34},
                         "ok": {"type": "boolean"},
                         "urgent": {"type": "boolean"},
                         "copies": {"type": "integer", "minimum": 1, "maximum": 3, "default": 1},
                         "amount": {"type": "number"},
                         "source": {"enum": ["records", "phone"]},
                         "level": {"type": "integer", "enum": [1, 2]},
                         "why": {"type": "string", "format": "textarea",
                                 "description": "Say where you found it."}}}


def test_each_field_of_the_schema_is_a_django_field_of_its_kind():
    form = AnswerForm(schema=SCHEMA)
    fields = form.fields
    assert list(fields) == [f"field_{n}" for n in SCHEMA["properties"]] + ["note"]
    assert isinstance(fields["field_iban"], forms.CharField) and fields["field_iban"].required
    assert fields["field_iban"].label == "IBAN" and fields["field_iban"].max_length == 34
    assert isinstance(fields["field_ok"].widget, forms.RadioSelect)  # a required yes/no
    assert isinstance(fields["field_urgent"], forms.BooleanField)  # an optional box
    assert isinstance(fields["field_copies"], forms.IntegerField)
    assert (fields["field_copies"].min_value, fields["field_copies"].max_value) == (1, 3)
    assert fields["field_copies"].initial == 1
    assert isinstance(fields["field_amount"], forms.FloatField)
    assert [c[0] for c in fields["field_source"].choices] == ["", "records", "phone"]
    assert isinstance(fields["field_why"].widget, forms.Textarea)
    assert fields["field_why"].help_text == "Say where you found it."


def test_the_answer_is_typed_as_the_schema_says_and_leaves_out_what_was_not_filled_in():
    form = AnswerForm({"field_iban": "DE0012345", "field_ok": "false", "field_copies": "2",
                       "field_amount": "", "field_source": "", "field_level": "2"}, schema=SCHEMA)
    assert form.is_valid(), form.errors
    assert form.answer() == {"iban": "DE0012345", "ok": False, "urgent": False, "copies": 2,
                             "level": 2}
    missing = AnswerForm({"field_ok": "true"}, schema=SCHEMA)
    assert not missing.is_valid() and "field_iban" in missing.errors


def asked(team, **ask) -> InputTask:
    version, _ = workflow_save(team=team, definition={
        "name": "asking", "input_schema": {"type": "object"},
        "steps": [{"name": "ask", "type": "human_input", "group": "clerks", "form": SCHEMA,
                   **ask}]}, actor=SETUP)
    return InputTask.objects.get(run=run_start(version=version, input={}, actor=SETUP))


def test_a_clerk_abstains_in_the_admin_where_the_step_allows_it(team):
    clerk = member(team, "clerk", groups=("clerks",))
    task = asked(team, allow_abstain=True)
    page = f"/admin/approvals/inputtask/{task.id}/change/"
    assert "Can't decide (abstain)" in signed_in(clerk).get(page).content.decode()
    response = signed_in(clerk).post(page, {"decision": "abstain", "note": "not in the records"})
    assert response.status_code == 302 and response["Location"] == INBOX
    task.refresh_from_db()
    assert task.state == "abstained" and task.note == "not in the records"

    strict = asked(team)
    page = f"/admin/approvals/inputtask/{strict.id}/change/"
    assert "abstain-button" not in signed_in(clerk).get(page).content.decode()
    refused = signed_in(clerk).post(page, {"decision": "abstain"})
    assert refused.status_code == 400
    assert "not allowed by this step" in refused.content.decode()


def test_an_assignee_in_no_group_signs_in_and_finds_the_task_in_the_inbox(team):
    sam = member(team, "sam", role="member")
    sam.set_password("sam-pass-1")
    sam.save()
    client = Client()
    assert client.post("/admin/login/?next=/admin/",
                       {"username": "sam", "password": "sam-pass-1"}).status_code == 200  # nothing waits
    task = asked(team, assignee="sam")
    response = client.post("/admin/login/?next=/admin/", {"username": "sam", "password": "sam-pass-1"})
    assert response.status_code == 302
    assert "1 input task</a>" in client.get("/admin/").content.decode()
    assert f"/admin/approvals/inputtask/{task.id}/change/" in client.get(INBOX).content.decode()
