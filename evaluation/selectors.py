"""Reads of evaluation datasets: which a person may see, a version's cases, and the expected
outcome a finished run shows (what an operator corrects before adding the run as a case).

Reads only; who may change a dataset is the services' check.
"""
from django.db.models import Prefetch, QuerySet

from orchestrator.engine.authz import Actor, visible
from orchestrator.engine.selectors import definition_of
from orchestrator.engine.states import StepKind, StepState
from orchestrator.models import Run

from .models import Dataset, DatasetVersion


def datasets_visible_to(user: Actor) -> QuerySet[Dataset]:
    """The datasets of the teams `user` may see, each with its team and workflow, and its
    latest version as `latest` (one query for every dataset of a page, not one each)."""
    latest = DatasetVersion.objects.select_related("created_by", "workflow_version").order_by("-number")[:1]
    return visible(Dataset.objects.select_related("team", "workflow"), user).prefetch_related(
        Prefetch("versions", queryset=latest, to_attr="latest_versions"))


def latest_of(dataset: Dataset) -> DatasetVersion:
    """The dataset's latest version: prefetched by `datasets_visible_to`, else read."""
    prefetched = getattr(dataset, "latest_versions", None)
    return prefetched[0] if prefetched else dataset.latest_version


def expected_from_run(run: Run) -> dict:
    """What `run` did, in the expected-outcome shape (docs/evaluation.md): its state, whether
    it asked a person (a human gate waited), and for each completed step the action it proposed (a step with
    `proposal.actions`) or else its output. A human gate gives no step expectation: it is the
    run's `must_be_approved`."""
    definition, _ = definition_of(run)
    specs = {spec["name"]: spec for spec in definition["steps"]}
    steps, asked = {}, False
    for step in run.steps.order_by("position", "id"):
        spec = specs.get(step.name)
        if spec is None:
            continue  # an iteration of a loop's body: not a step the definition names
        if step.kind == StepKind.HUMAN_GATE:
            # A gate that started waited for a person (whatever came of it); a skipped one never did.
            asked = asked or step.started_at is not None
            continue
        if step.state != StepState.COMPLETED or step.output is None:
            continue
        proposal = step.output.get("proposal") if isinstance(step.output, dict) else None
        if spec.get("proposal") and isinstance(proposal, dict):
            steps[step.name] = {"action": {"name": proposal.get("action_type"), "params": proposal.get("params", {})}}
        else:
            steps[step.name] = {"output": step.output}
    expected: dict = {"run": {"state": run.state, "must_be_approved": asked}}
    if steps:
        expected["steps"] = steps
    return expected
