"""The dataset services: versions written per change, immutable, digested; every case checked
against the workflow with a path per problem; permissions by role and team; the ledger."""
import pytest

from audit.models import AuditEntry
from evaluation.models import Case, DatasetVersion
from evaluation.services import (
    case_digest,
    dataset_case_from_run,
    dataset_cases_add,
    dataset_cases_remove,
    dataset_create,
)
from orchestrator.engine.errors import Forbidden, InputInvalid, NotAllowed
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Role, Workflow
from tests.engine.test_artifacts import raw
from tests.factories import SETUP, example_definition, member

from .conftest import good_case, sample_cases

pytestmark = pytest.mark.django_db


def paths(exc) -> list[str]:
    return [p["path"] for p in exc.value.problems]


# --- versions ------------------------------------------------------------------------------------


def test_a_new_dataset_starts_at_an_empty_version_one(dataset):
    version = dataset.versions.get()
    assert (version.number, version.case_count, version.change) == (1, 0, "created")
    assert version.workflow_version == dataset.workflow.active_version


def test_every_change_writes_the_next_version_and_leaves_the_earlier_ones_as_they_were(dataset, editor):
    two = dataset_cases_add(dataset=dataset, cases=sample_cases(), actor=editor)
    three = dataset_cases_add(dataset=dataset, cases=[good_case()], actor=editor)
    four = dataset_cases_remove(dataset=dataset, keys=["decline-01", "c1"], actor=editor)

    assert [v.number for v in dataset.versions.order_by("number")] == [1, 2, 3, 4]
    assert (two.case_count, three.case_count, four.case_count) == (30, 31, 29)
    assert two.tier_counts == {"low": 10, "medium": 10, "high": 10}
    assert set(two.cases.values_list("key", flat=True)) == {c["key"] for c in sample_cases()}
    assert two.cases.count() == 30 and three.cases.filter(key="c1").exists()
    assert not four.cases.filter(key__in=["decline-01", "c1"]).exists()
    assert four.change == "removed" and three.change == "added"


def test_a_version_and_a_case_are_immutable_once_written(dataset, editor):
    version = dataset_cases_add(dataset=dataset, cases=[good_case()], actor=editor)
    case = version.cases.get()
    case.risk_tier = "low"
    with pytest.raises(ValueError, match="immutable"):
        case.save()
    version.note = "rewritten"
    with pytest.raises(ValueError, match="immutable"):
        version.save()
    assert Case.objects.get(pk=case.pk).risk_tier == "high"


def test_the_digest_is_over_the_cases_whatever_their_order_or_version(refund, editor):
    one = dataset_create(workflow=refund, name="one", actor=editor)
    two = dataset_create(workflow=refund, name="two", actor=editor)
    cases = sample_cases()
    a = dataset_cases_add(dataset=one, cases=cases, actor=editor)
    b = dataset_cases_add(dataset=two, cases=list(reversed(cases)), actor=editor)
    assert a.digest == b.digest and len(a.digest) == 64

    changed = [dict(cases[0], risk_tier="medium"), *cases[1:]]
    c = dataset_cases_add(dataset=two, cases=changed, actor=editor, mode="replace_all")
    assert c.digest != a.digest
    case = c.cases.get(key=cases[0]["key"])
    assert case.digest == case_digest(case.key, case.input, case.expected, "medium", case.tags)


def test_replace_replaces_a_case_of_the_same_key_and_add_refuses_it(dataset, editor):
    dataset_cases_add(dataset=dataset, cases=[good_case()], actor=editor)
    with pytest.raises(InputInvalid) as refused:
        dataset_cases_add(dataset=dataset, cases=[good_case(tier="low")], actor=editor)
    assert paths(refused) == ["cases[0].key"]

    version = dataset_cases_add(dataset=dataset, cases=[good_case(tier="low"), good_case("c2")],
                                actor=editor, mode="replace")
    assert version.change == "replaced"
    assert dict(version.cases.values_list("key", "risk_tier")) == {"c1": "low", "c2": "high"}


def test_replace_all_makes_the_cases_the_whole_dataset(dataset, editor):
    dataset_cases_add(dataset=dataset, cases=sample_cases(), actor=editor)
    version = dataset_cases_add(dataset=dataset, cases=[good_case()], actor=editor, mode="replace_all")
    assert list(version.cases.values_list("key", flat=True)) == ["c1"]


def test_a_large_input_is_stored_as_an_artifact_and_read_back(dataset, editor, settings, tmp_path):
    settings.STEPWISE_ARTIFACT_BYTES = 200
    settings.STORAGES = {**settings.STORAGES, "artifacts": {
        "BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": tmp_path}}}
    message = "It never arrived. " * 100
    version = dataset_cases_add(dataset=dataset, cases=[good_case(input={"order_id": "ORD-1001",
                                                                          "message": message})], actor=editor)
    case = version.cases.get()
    assert "$artifact" in raw(Case, "input", case.pk) and message not in raw(Case, "input", case.pk)
    assert case.input["message"] == message
    assert list(tmp_path.rglob("*.json"))


# --- what a case must be -------------------------------------------------------------------------


@pytest.mark.parametrize("changes, path", [
    ({"input": {"order_id": "1001", "message": "x"}}, "cases[0].input.order_id"),
    ({"input": {"order_id": "ORD-1001"}}, "cases[0].input"),
    ({"risk_tier": "critical"}, "cases[0].risk_tier"),
    ({"risk_tier": None}, "cases[0].risk_tier"),
    ({"key": "has space"}, "cases[0].key"),
    ({"tags": ["a", "a"]}, "cases[0].tags"),
    ({"extra": 1}, "cases[0].extra"),
    ({"line": 5}, "cases[0].line"),
    ({"expected": {}}, "cases[0].expected"),
    ({"expected": {"run": {"state": "paused"}}}, "cases[0].expected.run.state"),
    ({"expected": {"steps": {"nope": {"abstain": True}}}}, "cases[0].expected.steps.nope"),
    ({"expected": {"steps": {"propose": {"labels": ["x"], "abstain": True}}}}, "cases[0].expected.steps.propose"),
    ({"expected": {"steps": {"propose": {"action": {"name": "wire"}}}}}, "cases[0].expected.steps.propose.action.name"),
    ({"expected": {"steps": {"propose": {"action": {"name": "refund", "params": {"order_id": "ORD-1"}}}}}},
     "cases[0].expected.steps.propose.action.params"),
    ({"expected": {"steps": {"order": {"action": {"name": "refund"}}}}}, "cases[0].expected.steps.order.action"),
    ({"expected": {"steps": {"order": {"abstain": True}}}}, "cases[0].expected.steps.order.abstain"),
    ({"expected": {"steps": {"propose": {"abstain": False}}}}, "cases[0].expected.steps.propose.abstain"),
])
def test_a_bad_case_is_refused_at_its_path_and_nothing_is_written(dataset, editor, changes, path):
    with pytest.raises(InputInvalid) as refused:
        dataset_cases_add(dataset=dataset, cases=[good_case("ok"), {**good_case("c1"), **changes}], actor=editor)
    assert paths(refused) == [path.replace("cases[0]", "cases[1]")]
    assert dataset.versions.count() == 1


def test_a_missing_field_and_a_repeated_key_are_each_reported(dataset, editor):
    case = good_case()
    del case["risk_tier"]
    with pytest.raises(InputInvalid) as refused:
        dataset_cases_add(dataset=dataset, cases=[case, good_case("d"), good_case("d")], actor=editor)
    assert paths(refused) == ["cases[0].risk_tier", "cases[2].key"]


def test_an_output_is_checked_against_the_steps_output_schema(team, editor):
    version, _ = workflow_save(team=team, definition=example_definition("content-moderation"), actor=SETUP)
    data = dataset_create(workflow=version.workflow, name="mod", actor=editor)
    case = {"key": "k", "risk_tier": "low", "input": {"content_id": "P", "author": "a", "text": "t"},
            "expected": {"steps": {"classify": {"output": {"category": "weird", "score": 2, "reason": "r"}}}}}
    with pytest.raises(InputInvalid) as refused:
        dataset_cases_add(dataset=data, cases=[case], actor=editor)
    assert paths(refused) == ["cases[0].expected.steps.classify.output.category",
                              "cases[0].expected.steps.classify.output.score"]
    assert dataset_cases_add(dataset=data, cases=sample_cases("content-moderation"), actor=editor).case_count == 11


def test_inputs_are_checked_against_the_version_named_else_the_published_one(team, refund, dataset, editor):
    strict = example_definition("refund-proposal")
    strict["input_schema"]["properties"]["message"]["maxLength"] = 5
    Workflow.objects.filter(pk=refund.pk).update(publish_on_save=False)
    workflow_save(team=team, definition=strict, actor=SETUP)  # v2, a draft

    assert dataset_cases_add(dataset=dataset, cases=[good_case()], actor=editor).workflow_version.number == 1
    with pytest.raises(InputInvalid) as refused:
        dataset_cases_add(dataset=dataset, cases=[good_case("c2")], actor=editor, workflow_version=2)
    assert paths(refused) == ["cases[0].input.message"]
    with pytest.raises(InputInvalid) as refused:
        dataset_cases_add(dataset=dataset, cases=[good_case("c2")], actor=editor, workflow_version=9)
    assert paths(refused) == ["workflow_version"]


def test_limits_on_a_change_and_on_a_version(dataset, editor, monkeypatch):
    import evaluation.services as services

    monkeypatch.setattr(services, "MAX_CASES_PER_CHANGE", 2)
    with pytest.raises(InputInvalid) as refused:
        dataset_cases_add(dataset=dataset, cases=[good_case(str(i)) for i in range(3)], actor=editor)
    assert paths(refused) == ["cases"]
    monkeypatch.setattr(services, "MAX_CASES_PER_VERSION", 3)
    dataset_cases_add(dataset=dataset, cases=[good_case("a"), good_case("b")], actor=editor)
    with pytest.raises(InputInvalid, match="too many"):
        dataset_cases_add(dataset=dataset, cases=[good_case("c"), good_case("d")], actor=editor)
    assert dataset.versions.count() == 2


def test_dataset_names_are_unique_per_workflow_and_slugs(refund, dataset, editor, team):
    with pytest.raises(InputInvalid) as refused:
        dataset_create(workflow=refund, name="golden", actor=editor)
    assert paths(refused) == ["name"]
    with pytest.raises(InputInvalid):
        dataset_create(workflow=refund, name="Not A Slug", actor=editor)
    version, _ = workflow_save(team=team, definition=example_definition("content-moderation"), actor=SETUP)
    assert dataset_create(workflow=version.workflow, name="golden", actor=editor).name == "golden"


def test_removing_a_key_the_dataset_lacks_is_refused_at_its_path(dataset, editor):
    dataset_cases_add(dataset=dataset, cases=[good_case()], actor=editor)
    with pytest.raises(InputInvalid) as refused:
        dataset_cases_remove(dataset=dataset, keys=["c1", "ghost"], actor=editor)
    assert paths(refused) == ["keys[1]"]
    assert dataset.versions.count() == 2


# --- from a finished run -------------------------------------------------------------------------


def test_a_finished_run_becomes_a_case_with_what_it_did_as_expected(dataset, finished_run, operator):
    version = dataset_case_from_run(dataset=dataset, run=finished_run, actor=operator, risk_tier="medium",
                                    tags=["from-prod"])
    case = version.cases.get()
    assert case.key == f"run-{finished_run.id}" and case.source_run == finished_run
    assert case.input == {"order_id": "ORD-1002", "message": "hi"}
    assert case.expected == {
        "run": {"state": "completed", "must_be_approved": False},
        "steps": {"order": {"output": {"order_id": "ORD-1002", "total_usd": 80.0, "customer_email": "bo@example.com"}},
                  "propose": {"action": {"name": "decline", "params": {"explanation": "Nothing to refund."}}},
                  "reply": {"output": {"sent": True}}}}
    assert version.change == "from_run"


def test_the_operator_corrects_the_outcome_before_the_run_is_added(dataset, finished_run, operator):
    corrected = {"run": {"must_be_approved": True}, "steps": {"propose": {"action": {"name": "refund"}}}}
    version = dataset_case_from_run(dataset=dataset, run=finished_run, actor=operator, risk_tier="high",
                                    expected=corrected, key="corrected-1")
    assert version.cases.get(key="corrected-1").expected == corrected
    with pytest.raises(InputInvalid) as refused:
        dataset_case_from_run(dataset=dataset, run=finished_run, actor=operator, risk_tier="high",
                              expected={"steps": {"propose": {"action": {"name": "wire"}}}})
    assert paths(refused) == ["cases[0].expected.steps.propose.action.name"]


def test_a_run_not_finished_or_of_another_workflow_is_refused(dataset, refund, editor, operator, team):
    live = run_start(version=refund.active_version, input={"order_id": "ORD-1002", "message": "hi"}, actor=editor)
    with pytest.raises(NotAllowed, match="not finished"):
        dataset_case_from_run(dataset=dataset, run=live, actor=operator, risk_tier="low")
    version, _ = workflow_save(team=team, definition=example_definition("content-moderation"), actor=SETUP)
    other = dataset_create(workflow=version.workflow, name="mod", actor=editor)
    with pytest.raises(NotAllowed, match="another workflow"):
        dataset_case_from_run(dataset=other, run=live, actor=operator, risk_tier="low")


# --- who may ----------------------------------------------------------------------------------


@pytest.mark.parametrize("role, may_edit, may_add_run", [
    (Role.MEMBER, False, False), (Role.EDITOR, True, True), (Role.OPERATOR, False, True), (Role.OWNER, True, True),
])
def test_who_may_change_a_dataset_by_role(dataset, finished_run, team, role, may_edit, may_add_run):
    person = member(team, f"as-{role}", role=role)
    for allowed, change in [
        (may_edit, lambda: dataset_create(workflow=dataset.workflow, name=f"by-{role}", actor=person)),
        (may_edit, lambda: dataset_cases_add(dataset=dataset, cases=[good_case(f"k-{role}")], actor=person)),
        (may_add_run, lambda: dataset_case_from_run(dataset=dataset, run=finished_run, actor=person, risk_tier="low",
                                                    key=f"r-{role}")),
    ]:
        if allowed:
            change()
        else:
            with pytest.raises(Forbidden):
                change()
    if may_edit:
        dataset_cases_remove(dataset=dataset, keys=[f"k-{role}"], actor=person)
    else:
        with pytest.raises(Forbidden):
            dataset_cases_remove(dataset=dataset, keys=["c1"], actor=person)


def test_an_editor_of_another_team_changes_nothing(dataset, finished_run, elsewhere):
    before = DatasetVersion.objects.filter(dataset=dataset).count()
    for change in (lambda: dataset_cases_add(dataset=dataset, cases=[good_case()], actor=elsewhere),
                   lambda: dataset_cases_remove(dataset=dataset, keys=["c1"], actor=elsewhere),
                   lambda: dataset_case_from_run(dataset=dataset, run=finished_run, actor=elsewhere, risk_tier="low"),
                   lambda: dataset_create(workflow=dataset.workflow, name="mine", actor=elsewhere)):
        with pytest.raises(Forbidden):
            change()
    assert DatasetVersion.objects.filter(dataset=dataset).count() == before


# --- the ledger -------------------------------------------------------------------------------


def test_each_change_is_one_ledger_entry_with_actor_version_counts_and_digest(dataset, editor):
    version = dataset_cases_add(dataset=dataset, cases=sample_cases(), actor=editor, note="first load")
    entries = AuditEntry.objects.filter(subject_type="dataset", subject_id=str(dataset.id)).order_by("id")
    assert [e.action for e in entries] == ["dataset.created", "dataset.cases_added"]
    entry = entries.last()
    assert entry.actor == "user:editor" and entry.team == "support" and entry.workflow == "refund-proposal"
    assert entry.data["version"] == version.number == 2
    assert entry.data["digest"] == version.digest
    assert (entry.data["added"], entry.data["case_count"]) == (30, 30)
    assert entry.data["tier_counts"] == {"low": 10, "medium": 10, "high": 10}


def test_a_run_that_asked_for_approval_must_be_approved(dataset, refund, editor, team, operator):
    from approvals.models import ApprovalRequest
    from orchestrator.engine.services.kinds.human_gate import approval_grant
    from orchestrator.engine.services.runs import run_cancel
    from orchestrator.models import Run

    from .conftest import DECLINE, OUTPUTS, finish

    asks = {**DECLINE, "risk": {"tier": "high", "reasons": ["amount"], "requires_approval": True}}
    OUTPUTS_ASKING = {**OUTPUTS, "propose": asks}
    run = run_start(version=refund.active_version, input={"order_id": "ORD-1002", "message": "hi"}, actor=editor)
    run = finish(run, outputs=OUTPUTS_ASKING)
    assert run.state == "waiting"
    gate = ApprovalRequest.objects.get(step__run=run)
    approver = member(team, "lead", role=Role.MEMBER, groups=("support_leads",))
    approval_grant(approval_id=gate.id, user=approver, proposal_hash=gate.proposal_hash)
    run = finish(run, outputs=OUTPUTS_ASKING)
    assert run.state == "completed"

    case = dataset_case_from_run(dataset=dataset, run=run, actor=operator, risk_tier="high").cases.get()
    assert case.expected["run"] == {"state": "completed", "must_be_approved": True}
    assert "approve" not in case.expected["steps"]  # a gate is the run's must_be_approved

    waited = finish(run_start(version=refund.active_version, input={"order_id": "ORD-1003", "message": "hi"},
                              actor=editor), outputs=OUTPUTS_ASKING)
    run_cancel(run_id=waited.id, actor=operator)
    waited = Run.objects.get(pk=waited.pk)
    assert waited.state == "cancelled"
    version = dataset_case_from_run(dataset=dataset, run=waited, actor=operator, risk_tier="high")
    assert version.cases.get(key=f"run-{waited.id}").expected["run"] == {"state": "cancelled",
                                                                         "must_be_approved": True}


def test_a_run_with_secret_input_cannot_become_a_case(team, editor, operator):
    from .conftest import finish

    secretive = {"name": "secretive", "steps": [{"name": "call", "type": "tool", "tool": "core.echo"}],
                 "input_schema": {"type": "object", "properties": {"token": {"type": "string", "writeOnly": True}}}}
    version, _ = workflow_save(team=team, definition=secretive, actor=SETUP)
    dataset = dataset_create(workflow=version.workflow, name="s", actor=editor)
    run = finish(run_start(version=version, input={"token": "hunter2"}, actor=editor), outputs={"call": {}})
    assert run.state == "completed"
    with pytest.raises(NotAllowed, match="secret"):
        dataset_case_from_run(dataset=dataset, run=run, actor=operator, risk_tier="low")
    assert dataset.versions.count() == 1
