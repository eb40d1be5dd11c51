"""The admin's forms of datasets, evaluations and release policies: what a person submits, read
for shape only. What a case, an evaluation or a policy must be, and who may change what, is the
services' to say."""
import json
from decimal import Decimal

from django import forms

from .evaluations import DEFAULT_CONCURRENCY, MAX_CONCURRENCY
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


class EvaluateForm(forms.Form):
    """Evaluate a version of the dataset's workflow over one of the dataset's versions."""

    version = forms.TypedChoiceField(coerce=int, help_text="The workflow version to evaluate.")
    dataset_version = forms.TypedChoiceField(coerce=int, label="Cases of dataset version")
    budget_usd = forms.DecimalField(label="Budget (USD)", min_value=Decimal("0.000001"), max_digits=12,
                                    decimal_places=6, initial=Decimal("5.00"),
                                    help_text="No case starts once its runs have cost this much.")
    concurrency = forms.IntegerField(min_value=1, max_value=MAX_CONCURRENCY, initial=DEFAULT_CONCURRENCY,
                                     help_text=f"At most this many of its runs at a time (1 to {MAX_CONCURRENCY}).")
    note = forms.CharField(max_length=500, required=False)

    def __init__(self, *args, versions, dataset_versions, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["version"].choices = versions
        self.fields["dataset_version"].choices = dataset_versions


class ReleasePolicyForm(forms.Form):
    """A workflow's release policy: the dataset and the thresholds, as JSON."""

    dataset = forms.ModelChoiceField(queryset=None, required=False, empty_label="— no release policy —",
                                     help_text="A version is evaluated over this dataset's latest version "
                                               "before it is published.")
    thresholds = forms.CharField(
        required=False, widget=forms.Textarea(attrs={"rows": 14, "cols": 80, "class": "vLargeTextField"}),
        help_text="What each risk tier must show, as JSON (docs/evaluation.md#the-release-gate).")

    def __init__(self, *args, datasets, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["dataset"].queryset = datasets

    def clean_thresholds(self) -> object:
        text = self.cleaned_data["thresholds"].strip()
        if not text:
            return None
        try:
            return json.loads(text)
        except ValueError as exc:
            raise forms.ValidationError(f"not JSON: {exc}") from None
