"""The release gate: a workflow with a release policy publishes only a version whose completed
evaluation over the policy's dataset meets every threshold (and does not regress against the
published version where a tier says so); editors are refused with the failing measures, an
owner's publish is an override, audited; saving under a policy leaves a draft."""
import pytest

from audit.models import AuditEntry
from evaluation.gate import release_policy_set, release_problems
from evaluation.models import Evaluation, EvaluationState
from evaluation.services import dataset_cases_add, dataset_create
from orchestrator.engine.errors import Forbidden, InputInvalid
from orchestrator.engine.services.workflows import workflow_publish, workflow_save
from orchestrator.models import Workflow
from tests.factories import SETUP, example_definition

from .conftest import sample_cases

pytestmark = pytest.mark.django_db

POLICY = {"tiers": {"high": {"unauthorized_actions": {"max": 0}, "action_accuracy": {"min": 0.98},
                             "max_regression": 0.01}}}


def metric(value: float, n: int = 10) -> dict:
    return {"n": n, "value": value, "ci": [max(value - 0.1, 0), min(value + 0.1, 1)]}


def evaluated(version, cases, *, unauthorized: float = 0, accuracy: float = 1.0,
              state: str = EvaluationState.COMPLETED) -> Evaluation:
    """A finished evaluation of `version` over the dataset version `cases` with this summary of
    the high tier (the summary an evaluation writes; tests/evaluation/test_evaluations.py makes
    real ones)."""
    high = {"cases": 10, "passed": 10, "metrics": {
        "unauthorized_actions": {"kind": "count", **metric(unauthorized), "total": unauthorized * 10},
        "action_accuracy": {"kind": "proportion", **metric(accuracy)}}}
    empty = {"cases": 0, "passed": 0, "metrics": {}}
    return Evaluation.objects.create(
        team=version.workflow.team, workflow=version.workflow, version=version, dataset_version=cases,
        state=state, budget_usd=1, concurrency=1,
        summary={"overall": high, "low": empty, "medium": empty, "high": high, "cases": {"scored": 10}})


@pytest.fixture
def cases(dataset, editor):
    return dataset_cases_add(dataset=dataset, cases=sample_cases(), actor=editor)


@pytest.fixture
def gated(refund, dataset, cases, owner) -> Workflow:
    release_policy_set(workflow=refund, dataset=dataset, thresholds=POLICY, actor=owner)
    refund.publish_on_save = False
    refund.save(update_fields=["publish_on_save"])
    return refund


def draft(workflow: Workflow, description: str):
    definition = {**example_definition("refund-proposal"), "description": description}
    version, _ = workflow_save(team=workflow.team, definition=definition, actor=SETUP)
    return version


def problems(exc) -> dict[str, str]:
    return {p["path"]: p["message"] for p in exc.value.problems}


def test_a_version_without_an_evaluation_is_refused_to_an_editor(gated, editor):
    version = draft(gated, "v2")
    with pytest.raises(Forbidden) as refused:
        workflow_publish(workflow_id=gated.id, number=version.number, actor=editor)
    assert "release gate" in str(refused.value)
    assert list(problems(refused)) == ["release_gate.evaluation"]
    gated.refresh_from_db()
    assert gated.active_version.number == 1


def test_a_failing_evaluation_is_refused_with_its_failing_measures(gated, cases, editor):
    evaluated(gated.active_version, cases)
    version = draft(gated, "v2")
    evaluated(version, cases, unauthorized=0.2, accuracy=0.9)
    with pytest.raises(Forbidden) as refused:
        workflow_publish(workflow_id=gated.id, number=version.number, actor=editor)
    found = problems(refused)
    assert set(found) >= {"release_gate.high.unauthorized_actions", "release_gate.high.action_accuracy"}
    assert "0.2" in found["release_gate.high.unauthorized_actions"]


def test_a_passing_evaluation_publishes(gated, cases, editor):
    evaluated(gated.active_version, cases)
    version = draft(gated, "v2")
    evaluated(version, cases, accuracy=0.995)
    before = AuditEntry.objects.order_by("-id").values_list("id", flat=True).first() or 0
    workflow_publish(workflow_id=gated.id, number=version.number, actor=editor)
    gated.refresh_from_db()
    assert gated.active_version == version
    entry = AuditEntry.objects.get(id__gt=before, action="workflow.published")
    assert entry.outcome == "published"


def test_a_regression_beyond_the_policy_against_the_published_version_is_refused(gated, cases, editor):
    evaluated(gated.active_version, cases, accuracy=1.0)
    version = draft(gated, "v2")
    evaluated(version, cases, accuracy=0.985)  # above the floor, but 1.5 points worse
    with pytest.raises(Forbidden) as refused:
        workflow_publish(workflow_id=gated.id, number=version.number, actor=editor)
    found = problems(refused)
    assert list(found) == ["release_gate.high.action_accuracy"]
    assert "from the published version" in found["release_gate.high.action_accuracy"]


def test_a_regression_limit_needs_an_evaluation_of_the_published_version(gated, cases, editor):
    version = draft(gated, "v2")
    evaluated(version, cases)
    with pytest.raises(Forbidden) as refused:
        workflow_publish(workflow_id=gated.id, number=version.number, actor=editor)
    assert list(problems(refused)) == ["release_gate.baseline"]


def test_only_a_completed_evaluation_over_the_datasets_latest_cases_counts(gated, dataset, cases, editor):
    evaluated(gated.active_version, cases)
    version = draft(gated, "v2")
    evaluated(version, cases, state=EvaluationState.STOPPED)
    assert [p["path"] for p in release_problems(workflow=gated, version=version)] == ["release_gate.evaluation"]
    evaluated(version, cases)
    assert release_problems(workflow=gated, version=version) == []
    dataset_cases_add(dataset=dataset, cases=[{**sample_cases()[0], "key": "one-more"}], actor=editor)
    assert [p["path"] for p in release_problems(workflow=gated, version=version)] == ["release_gate.evaluation"]


def test_an_owner_may_override_and_the_ledger_says_so_with_the_failing_measures(gated, cases, owner):
    evaluated(gated.active_version, cases)
    version = draft(gated, "v2")
    evaluated(version, cases, unauthorized=0.1)
    before = AuditEntry.objects.order_by("-id").values_list("id", flat=True).first() or 0
    workflow_publish(workflow_id=gated.id, number=version.number, actor=owner)
    gated.refresh_from_db()
    assert gated.active_version == version
    entry = AuditEntry.objects.get(id__gt=before, action="workflow.published")
    assert entry.outcome == "overridden" and entry.actor == "user:owner"
    assert any("unauthorized_actions" in line for line in entry.data["release_gate_overridden"])


def test_saving_under_a_release_policy_leaves_a_draft_even_when_saving_publishes(gated, editor):
    gated.publish_on_save = True
    gated.save(update_fields=["publish_on_save"])
    version, created = workflow_save(team=gated.team, definition={
        **example_definition("refund-proposal"), "description": "v2"}, actor=editor)
    gated.refresh_from_db()
    assert created and gated.active_version.number == 1 and version.number == 2


def test_only_an_owner_sets_the_policy_and_it_is_checked(refund, dataset, editor, owner, team):
    with pytest.raises(Forbidden):
        release_policy_set(workflow=refund, dataset=dataset, thresholds=POLICY, actor=editor)
    with pytest.raises(InputInvalid) as refused:
        release_policy_set(workflow=refund, dataset=dataset, thresholds={"tiers": {"severe": {}}}, actor=owner)
    assert all(p["path"].startswith("thresholds") for p in refused.value.problems)
    other_version, _ = workflow_save(team=team, definition=example_definition("content-moderation"), actor=SETUP)
    elsewhere = dataset_create(workflow=other_version.workflow, name="mod", actor=owner)
    with pytest.raises(InputInvalid) as wrong:
        release_policy_set(workflow=refund, dataset=elsewhere, thresholds=POLICY, actor=owner)
    assert [p["path"] for p in wrong.value.problems] == ["dataset"]

    before = AuditEntry.objects.order_by("-id").values_list("id", flat=True).first() or 0
    policy = release_policy_set(workflow=refund, dataset=dataset, thresholds=POLICY, actor=owner)
    assert policy.thresholds == POLICY
    assert release_policy_set(workflow=refund, dataset=None, thresholds=None, actor=owner) is None
    assert [e.outcome for e in AuditEntry.objects.filter(id__gt=before, action="workflow.release_policy")
            .order_by("id")] == ["set", "removed"]


def test_without_a_policy_nothing_changes(refund, editor):
    version = draft(refund, "v2")
    assert release_problems(workflow=refund, version=version) == []


# --- a draft held back does not run live by being named --------------------------------------


def test_a_draft_the_gate_holds_back_does_not_run_live_when_named_through_the_api(gated, cases, editor, owner):
    from orchestrator.engine.services.runs import run_start
    from tests.conftest import client_for

    evaluated(gated.active_version, cases)
    version = draft(gated, "v2")
    evaluated(version, cases, unauthorized=0.3)
    body = {"input": {"order_id": "ORD-1300", "message": "hi"}, "version": version.number}
    refused = client_for(editor).post(f"/api/v1/workflows/{gated.name}/runs/", body, format="json")
    assert refused.status_code == 403, refused.content
    assert [e["path"] for e in refused.json()["errors"]] == ["version.release_gate.high.unauthorized_actions"]
    with pytest.raises(Forbidden):
        run_start(version=version, input=body["input"], actor=SETUP)  # a pinned trigger's path
    assert run_start(version=version, input=body["input"], actor=owner).version == version  # an owner's waiver
    published = client_for(editor).post(f"/api/v1/workflows/{gated.name}/runs/", {"input": body["input"]},
                                        format="json")
    assert published.status_code == 202  # the published version runs as ever


def test_a_draft_that_passes_its_gate_runs_when_named(gated, cases, editor):
    from orchestrator.engine.services.runs import run_start

    evaluated(gated.active_version, cases)
    version = draft(gated, "v2")
    evaluated(version, cases)
    run = run_start(version=version, input={"order_id": "ORD-1300", "message": "hi"}, actor=editor)
    assert run.version == version
