"""The decision page's forms: what a reviewer submits, checked for shape only.

Every rule about the decision itself (authority, the hash, the request's state, the action's
schema) is the services'; these forms only read the request: the hash the reviewer saw (a hidden
field), the note, the confirmation a high or critical tier asks for, and edited values.
"""
import json

from django import forms

from orchestrator.engine.services.kinds.human_gate import MAX_NOTE
from orchestrator.engine.text import text_problem


class DecisionForm(forms.Form):
    proposal_hash = forms.CharField(widget=forms.HiddenInput, required=False, max_length=64)
    note = forms.CharField(widget=forms.Textarea(attrs={"rows": 3, "cols": 70}), required=False,
                           max_length=MAX_NOTE)
    confirm = forms.BooleanField(required=False)
    decision = forms.ChoiceField(choices=[("approve", "Approve"), ("reject", "Reject")])

    def __init__(self, *args, needs_confirmation: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.needs_confirmation = needs_confirmation

    def clean(self) -> dict:
        data = super().clean()
        if (data.get("decision") == "approve" and self.needs_confirmation
                and not data.get("confirm")):
            self.add_error("confirm", "This action is high risk or more: confirm you have read "
                           "it and its risk reasons.")
        return data


class RevokeForm(forms.Form):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, auto_id="revoke_%s", **kwargs)

    note = forms.CharField(widget=forms.Textarea(attrs={"rows": 2, "cols": 70}),
                           max_length=MAX_NOTE, help_text="Say why the approval is withdrawn.")


class EditForm(forms.Form):
    """One field per editable parameter, holding its current value: a string as it is,
    anything else as JSON."""

    proposal_hash = forms.CharField(widget=forms.HiddenInput, required=False, max_length=64)
    note = forms.CharField(widget=forms.Textarea(attrs={"rows": 2, "cols": 70}), required=False,
                           max_length=MAX_NOTE)

    def __init__(self, *args, current: dict, editable: list[str], **kwargs):
        super().__init__(*args, auto_id="edit_%s", **kwargs)
        self.current = current
        for name in editable:
            value = current.get(name)
            text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            widget = (forms.Textarea(attrs={"rows": 6, "cols": 70})
                      if isinstance(value, str) and (len(value) > 60 or "\n" in value)
                      else forms.TextInput(attrs={"size": 40}))
            self.fields[f"param_{name}"] = forms.CharField(
                label=name, initial=text, required=False, widget=widget, strip=False)

    def changes(self) -> dict:
        """{name: new value} for every parameter whose value differs from the current one."""
        found = {}
        for key, raw in list(self.cleaned_data.items()):  # add_error removes a field from it
            if not key.startswith("param_"):
                continue
            name = key.removeprefix("param_")
            before = self.current.get(name)
            if isinstance(before, str):
                value = raw
            else:
                try:
                    value = json.loads(raw)
                except ValueError:
                    self.add_error(key, "Not valid JSON (a number, true/false, a list or an object).")
                    continue
                if (invalid := text_problem(value)) is not None:
                    self.add_error(key, invalid[1])
                    continue
            if value != before:
                found[name] = value
        return found


# --- an input task's form, drawn from its JSON Schema ---------------------------------------------

ABSTAIN = "abstain"


def _field_for(name: str, schema: dict, *, required: bool) -> forms.Field:
    """One Django form field for one field of a form's schema (`definitions.inputs` allows only
    these kinds). Its bounds are shown and checked here for the person's sake; the service
    checks the answer against the schema itself."""
    label = schema.get("title") or name
    common = {"label": label, "required": required, "help_text": schema.get("description", "")}
    if "default" in schema:
        common["initial"] = schema["default"]
    kind = schema.get("type") or "string"
    if isinstance(schema.get("enum"), list):
        choices = [(str(value), str(value)) for value in schema["enum"]]
        return forms.TypedChoiceField(choices=[("", "—"), *choices] if not required else choices,
                                      coerce=dict(zip([str(v) for v in schema["enum"]],
                                                      schema["enum"], strict=True)).get,
                                      empty_value=None, **common)
    if kind == "boolean":
        # A checkbox cannot say "not given": a required yes/no is a choice, an optional one a box.
        if required:
            return forms.TypedChoiceField(choices=[("true", "Yes"), ("false", "No")],
                                          coerce=lambda v: v == "true", widget=forms.RadioSelect,
                                          **common)
        return forms.BooleanField(**{**common, "required": False})
    if kind in ("integer", "number"):
        bounds = {"min_value": schema.get("minimum"), "max_value": schema.get("maximum")}
        field = forms.IntegerField if kind == "integer" else forms.FloatField
        return field(**bounds, **common)
    long_text = (schema.get("maxLength") or 0) > 200 or schema.get("format") == "textarea"
    return forms.CharField(min_length=schema.get("minLength"), max_length=schema.get("maxLength"),
                           widget=forms.Textarea(attrs={"rows": 4, "cols": 70}) if long_text
                           else forms.TextInput(attrs={"size": 50}), **common)


class AnswerForm(forms.Form):
    """The fields of an input task's form, one Django field per property of its JSON Schema,
    and a note. `answer()` is what the person filled in, optional fields left empty omitted."""

    note = forms.CharField(widget=forms.Textarea(attrs={"rows": 2, "cols": 70}), required=False,
                           max_length=MAX_NOTE, label="Note")

    def __init__(self, *args, schema: dict, **kwargs):
        super().__init__(*args, auto_id="answer_%s", **kwargs)
        required = set(schema.get("required") or [])
        self.names = list(schema.get("properties") or {})
        note = self.fields.pop("note")
        for name, field in (schema.get("properties") or {}).items():
            self.fields[f"field_{name}"] = _field_for(name, field, required=name in required)
        self.fields["note"] = note

    def answer(self) -> dict:
        found = {}
        for name in self.names:
            value = self.cleaned_data.get(f"field_{name}")
            if value is None or value == "":
                continue
            found[name] = value
        return found

    def field_name(self, path: str) -> str | None:
        """The form field a service problem's path (`answer.<field>`) names, if it is one."""
        key = "field_" + path.removeprefix("answer.") if path.startswith("answer.") else path
        return key if key in self.fields else None
