"""The admin's dataset forms: what an editor or operator submits, read for shape only. What a
case must be, and who may change what, is the services' to say."""
import json

from django import forms

from .limits import MAX_UPLOAD_BYTES
from .models import RiskTier
from .services import MODES

MODE_CHOICES = [("add", "Add (a key the dataset has is refused)"),
                ("replace", "Add, replacing the cases of the same keys"),
                ("replace_all", "Replace the whole dataset with these cases")]
assert [m for m, _ in MODE_CHOICES] == list(MODES)


class DatasetCreateForm(forms.Form):
    workflow = forms.ModelChoiceField(queryset=None, help_text="Its cases are inputs of this workflow.")
    name = forms.SlugField(max_length=100, help_text="Lowercase letters, digits, - and _.")
    description = forms.CharField(widget=forms.Textarea(attrs={"rows": 3, "cols": 70}), required=False,
                                  max_length=2000)

    def __init__(self, *args, workflows, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["workflow"].queryset = workflows
        self.fields["workflow"].label_from_instance = lambda w: f"{w.name} ({w.team.slug})"


class UploadForm(forms.Form):
    file = forms.FileField(help_text=f"JSON lines (.jsonl) or CSV (.csv), at most {MAX_UPLOAD_BYTES // 1024 // 1024} MiB.")
    mode = forms.ChoiceField(choices=MODE_CHOICES, initial="add")
    workflow_version = forms.IntegerField(min_value=1, required=False,
                                          help_text="Check the cases against this version (default: the published one).")
    note = forms.CharField(max_length=500, required=False)


class RemoveForm(forms.Form):
    keys = forms.CharField(widget=forms.Textarea(attrs={"rows": 3, "cols": 70}),
                           help_text="The keys of the cases to remove, one a line.")
    note = forms.CharField(max_length=500, required=False)

    def clean_keys(self) -> list[str]:
        return [k.strip() for k in self.cleaned_data["keys"].splitlines() if k.strip()]


class FromRunForm(forms.Form):
    dataset = forms.ModelChoiceField(queryset=None)
    risk_tier = forms.ChoiceField(choices=RiskTier.choices, help_text="How much a wrong outcome of this case costs.")
    tags = forms.CharField(required=False, max_length=1100, help_text="Comma separated.")
    key = forms.CharField(required=False, max_length=200, help_text="Default: \"run-\" and the run's id.")
    expected = forms.CharField(widget=forms.Textarea(attrs={"rows": 18, "cols": 90, "class": "vLargeTextField"}),
                               help_text="What the run should have done, as JSON (docs/evaluation.md): correct it here.")
    note = forms.CharField(max_length=500, required=False)

    def __init__(self, *args, datasets, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["dataset"].queryset = datasets

    def clean_tags(self) -> list[str]:
        return [t.strip() for t in self.cleaned_data["tags"].split(",") if t.strip()]

    def clean_expected(self) -> object:
        try:
            return json.loads(self.cleaned_data["expected"])
        except ValueError as exc:
            raise forms.ValidationError(f"not JSON: {exc}") from None
