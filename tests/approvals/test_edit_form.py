"""The admin's parameter edit form refuses text that is not valid Unicode (a lone surrogate,
written as a JSON escape in a parameter given as JSON) on its field, before any service sees it."""
from approvals.forms import EditForm


def form(raw: str) -> EditForm:
    edit = EditForm(data={"param_tags": raw, "note": ""}, current={"tags": ["a"]},
                    editable=["tags"])
    assert edit.is_valid(), edit.errors
    return edit


def test_a_json_parameter_with_a_lone_surrogate_is_refused_on_its_field():
    edit = form('["\\ud800"]')

    assert edit.changes() == {}
    assert "Unicode" in str(edit.errors["param_tags"])


def test_a_valid_json_parameter_is_a_change():
    assert form('["a", "b"]').changes() == {"tags": ["a", "b"]}


def test_a_parameter_that_is_not_json_is_refused_on_its_field():
    edit = form("[not json")

    assert edit.changes() == {}
    assert "Not valid JSON" in str(edit.errors["param_tags"])
