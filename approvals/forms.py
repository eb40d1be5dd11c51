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
