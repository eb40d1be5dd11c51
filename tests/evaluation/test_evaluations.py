"""Evaluations driven in this process (no worker): every case a sandboxed run of the version on
the evaluation capacity class, at most `concurrency` at a time, scored when it ends, summarised
by tier; stopped at the budget; cancelled; audited; refused to those without evaluation.run."""
import time
from decimal import Decimal

import pytest

from approvals.models import ApprovalRequest
from audit.models import AuditEntry
from evaluation.evaluations import (
    evaluation_advance,
    evaluation_cancel,
    evaluation_start,
    evaluations_sweep,
    sampled,
    sandbox_of,
    shadow_start,
)
from evaluation.models import CaseRunState, Evaluation, EvaluationState
from evaluation.selectors import outcome_of_run
from evaluation.services import dataset_cases_add
from orchestrator.engine.errors import Forbidden, InputInvalid, NotAllowed
from orchestrator.engine.services.kinds.worker import step_execute
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_policy_set, workflow_save
from orchestrator.engine.states import RUN_TERMINAL
from orchestrator.models import Run
from tests.factories import SETUP, example_definition, member

from .conftest import sample_cases

pytestmark = pytest.mark.django_db


def paths(exc) -> list[str]:
    return [p["path"] for p in exc.value.problems]


def drive(evaluation: Evaluation, *, rounds: int = 200) -> Evaluation:
    """Run the evaluation's queued steps here, as workers would, advancing it after each round
    as its runs' ends would, until it ends."""
    for _ in range(rounds):
        evaluation = evaluation_advance(evaluation_id=evaluation.id)
        if evaluation.is_finished:
            return evaluation
        for run in Run.objects.filter(evaluation_case__evaluation=evaluation).exclude(state__in=RUN_TERMINAL):
            while step := run.steps.filter(state="queued").first():
                step_execute(step_id=step.id, worker="test")
        time.sleep(0)  # let nothing else in
    raise AssertionError(f"evaluation {evaluation.id} still {evaluation.state}")


@pytest.fixture
def cases(dataset, editor):
    return dataset_cases_add(dataset=dataset, cases=sample_cases(), actor=editor)


def test_every_case_runs_sandboxed_on_the_evaluation_class_and_is_scored_by_tier(dataset, cases, editor):
    evaluation = evaluation_start(dataset=dataset, version=1, actor=editor, budget_usd="1.00", concurrency=3)
    assert evaluation.cases.count() == 30 and evaluation.cases.filter(state="pending").count() == 30

    first = evaluation_advance(evaluation_id=evaluation.id)
    runs = Run.objects.filter(evaluation_case__evaluation=first)
    assert runs.count() == 3  # its concurrency
    assert {(r.capacity, r.sandbox["purpose"], r.trigger) for r in runs} == {("evaluation", "evaluation", "evaluation")}

    done = drive(evaluation)
    assert done.state == EvaluationState.COMPLETED
    assert done.cases.filter(state=CaseRunState.SCORED).count() == 30
    assert done.summary["cases"]["scored"] == 30
    for tier in ("low", "medium", "high", "overall"):
        assert tier in done.summary
    # The published refund example does what its sample expects, everywhere.
    assert done.cases.filter(passed=True).count() == 30, [
        (c.key, {k: v for k, v in c.scores.items() if v is False}) for c in done.cases.filter(passed=False)]
    assert done.summary["high"]["metrics"]["unauthorized_actions"]["value"] == 0
    # No person was asked: the gates of the high-tier refunds were decided by the evaluation.
    assert not ApprovalRequest.objects.filter(run__in=runs, state="pending").exists()


def test_a_case_run_is_sandboxed_with_its_responses_and_its_gate_decided_as_expected(dataset, editor):
    case = {"key": "never-arrived", "input": {"order_id": "ORD-1300", "message": "It never arrived."},
            "expected": {"run": {"must_be_approved": True},
                         "steps": {"propose": {"action": {"name": "refund"}}, "approve": {"decision": "reject"}}},
            "responses": {"refund": {"refund_id": "R-1", "amount_usd": 1200.0}},
            "risk_tier": "high"}
    version = dataset_cases_add(dataset=dataset, cases=[case], actor=editor)
    stored = version.cases.get()
    assert sandbox_of(stored, dataset.workflow.active_version.normalized) == {
        "purpose": "evaluation", "responses": {"refund": {"refund_id": "R-1", "amount_usd": 1200.0}},
        "decisions": {"approve": "reject"}}

    evaluation = drive(evaluation_start(dataset=dataset, version=1, actor=editor, budget_usd=1))
    [row] = evaluation.cases.all()
    outcome = row.outcome
    assert outcome["gates"]["approve"] == {"asked": True, "decision": "reject"}
    assert outcome["effects"] == []  # rejected: the refund never ran, not even sandboxed
    assert outcome["steps"]["propose"]["action"]["name"] == "refund"


def test_responses_name_only_steps_an_evaluation_answers(dataset, editor):
    case = {"key": "k", "input": {"order_id": "ORD-1300", "message": "hi"}, "risk_tier": "low",
            "expected": {"run": {"state": "completed"}}, "responses": {"propose": {}, "refund": []}}
    with pytest.raises(InputInvalid) as refused:
        dataset_cases_add(dataset=dataset, cases=[case], actor=editor)
    assert paths(refused) == ["cases[0].responses.propose"]


def test_a_gate_decision_is_expected_of_a_gate_only(dataset, editor):
    case = {"key": "k", "input": {"order_id": "ORD-1300", "message": "hi"}, "risk_tier": "low",
            "expected": {"steps": {"propose": {"decision": "approve"}}}}
    with pytest.raises(InputInvalid) as refused:
        dataset_cases_add(dataset=dataset, cases=[case], actor=editor)
    assert paths(refused) == ["cases[0].expected.steps.propose.decision"]


def test_an_evaluation_stops_at_its_budget_and_leaves_the_rest_unrun(dataset, cases, editor):
    evaluation = evaluation_start(dataset=dataset, version=1, actor=editor, budget_usd="0.000001", concurrency=2)
    done = drive(evaluation)
    assert done.state == EvaluationState.STOPPED
    assert "budget" in done.stop_reason
    assert done.cost_usd >= Decimal("0.000001")
    counts = done.summary["cases"]
    assert counts["not_run"] >= 26 and counts["pending"] == 0 and counts["running"] == 0
    assert Run.objects.filter(evaluation_case__evaluation=done).count() <= 4
    assert all(r.state in RUN_TERMINAL for r in Run.objects.filter(evaluation_case__evaluation=done))


def test_cancelling_stops_the_runs_and_keeps_what_was_scored(dataset, cases, editor):
    evaluation = evaluation_start(dataset=dataset, version=1, actor=editor, budget_usd=1, concurrency=2)
    evaluation_advance(evaluation_id=evaluation.id)
    cancelled = evaluation_cancel(evaluation_id=evaluation.id, actor=editor, reason="wrong version")
    assert cancelled.state == EvaluationState.CANCELLED and cancelled.stop_reason == "wrong version"
    assert cancelled.cases.filter(state="not_run").count() == 28
    assert all(r.state in ("cancelled", "cancelling") for r in Run.objects.filter(evaluation_case__evaluation=cancelled))
    with pytest.raises(NotAllowed):
        evaluation_cancel(evaluation_id=evaluation.id, actor=editor)


def test_who_may_start_and_cancel_an_evaluation(dataset, cases, team, reader, owner):
    operator = member(team, "op", role="operator")
    for refused in (reader, operator):
        with pytest.raises(Forbidden):
            evaluation_start(dataset=dataset, version=1, actor=refused, budget_usd=1)
    evaluation = evaluation_start(dataset=dataset, version=1, actor=owner, budget_usd=1)
    with pytest.raises(Forbidden):
        evaluation_cancel(evaluation_id=evaluation.id, actor=reader)


def test_what_an_evaluation_is_refused_for_is_said_by_path(dataset, editor):
    with pytest.raises(InputInvalid) as refused:
        evaluation_start(dataset=dataset, version=7, actor=editor, budget_usd="-1", concurrency=0,
                         dataset_version=9)
    assert paths(refused) == ["version", "dataset_version", "budget_usd", "concurrency"]
    with pytest.raises(InputInvalid) as empty:  # version 1 of a dataset holds no case
        evaluation_start(dataset=dataset, version=1, actor=editor, budget_usd=1)
    assert paths(empty) == ["dataset_version"]
    for budget in ("NaN", "Infinity", "abc", 0, "100001"):
        with pytest.raises(InputInvalid):
            evaluation_start(dataset=dataset, version=1, actor=editor, budget_usd=budget)


def test_starting_and_ending_are_in_the_ledger(dataset, cases, editor):
    before = AuditEntry.objects.order_by("-id").values_list("id", flat=True).first() or 0
    done = drive(evaluation_start(dataset=dataset, version=1, actor=editor, budget_usd=1, concurrency=10))
    entries = AuditEntry.objects.filter(id__gt=before, subject_type="evaluation", subject_id=str(done.id))
    assert [(e.action, e.actor) for e in entries.order_by("id")] == [
        ("evaluation.started", "user:editor"), ("evaluation.completed", "service:evaluation")]


def test_advancing_again_changes_nothing_and_the_sweep_advances_the_running_ones(dataset, cases, editor):
    evaluation = evaluation_start(dataset=dataset, version=1, actor=editor, budget_usd=1, concurrency=2)
    assert evaluations_sweep() == 1
    again = evaluation_advance(evaluation_id=evaluation.id)
    assert Run.objects.filter(evaluation_case__evaluation=again).count() == 2


def test_the_outcome_of_a_sandboxed_refund_names_the_effect_and_its_approval(dataset, editor):
    case = {"key": "big", "input": {"order_id": "ORD-1300", "message": "It never arrived."},
            "expected": {"run": {"must_be_approved": True}, "steps": {"propose": {"action": {"name": "refund"}}}},
            "risk_tier": "high"}
    dataset_cases_add(dataset=dataset, cases=[case], actor=editor)
    done = drive(evaluation_start(dataset=dataset, version=1, actor=editor, budget_usd=1))
    [row] = done.cases.all()
    outcome = outcome_of_run(row.run)
    assert outcome["run"]["state"] == "completed" and outcome["run"]["asked"] is True
    [effect] = outcome["effects"]
    assert (effect["step"], effect["tool"], effect["approved"]) == ("refund", "shop.refund", True)
    assert float(effect["params"]["amount_usd"]) == 1200.0
    assert row.passed is True


def test_a_version_that_is_not_the_published_one_is_evaluated_as_it_is(dataset, cases, editor, team):
    workflow_policy_set(workflow_id=dataset.workflow_id, publish_on_save=False, actor=SETUP)
    draft = example_definition("refund-proposal")
    draft["description"] = "A draft."
    version, _ = workflow_save(team=team, definition=draft, actor=SETUP)
    dataset.workflow.refresh_from_db()
    assert version.number == 2 and dataset.workflow.active_version.number == 1
    done = drive(evaluation_start(dataset=dataset, version=2, actor=editor, budget_usd=1, concurrency=10))
    assert {r.version_id for r in Run.objects.filter(evaluation_case__evaluation=done)} == {version.id}


# --- shadow ----------------------------------------------------------------------------------


def live_run(version, message: str, *, secret: bool = False) -> Run:
    run = run_start(version=version, input={"order_id": "ORD-1300", "message": message}, actor=SETUP,
                    known_secrets=[message] if secret else ())
    while step := run.steps.filter(state="queued").first():
        step_execute(step_id=step.id, worker="test")
    return Run.objects.get(pk=run.pk)


@pytest.fixture
def draft(refund):
    workflow_policy_set(workflow_id=refund.id, publish_on_save=False, actor=SETUP)
    version, _ = workflow_save(team=refund.team, actor=SETUP, definition={
        **example_definition("refund-proposal"), "description": "A draft."})
    return version


def test_a_shadow_runs_the_draft_again_on_a_sample_of_live_runs_and_scores_agreement(refund, draft, editor):
    shadow = shadow_start(workflow=refund, version=draft.number, actor=editor, budget_usd=1,
                          sample_percent=100, max_cases=2)
    before = live_run(refund.active_version, "Where is my invoice?")  # ended before: not followed
    Evaluation.objects.filter(pk=shadow.pk).update(examined_until=before.finished_at)
    live = [live_run(refund.active_version, "Where is my invoice?"),
            live_run(refund.active_version, "The table arrived scratched."),
            live_run(refund.active_version, "A third one, past the maximum.")]
    assert all(run.state == "completed" for run in live)

    done = drive(shadow)
    assert done.state == EvaluationState.COMPLETED and done.purpose == "shadow"
    rows = list(done.cases.order_by("id"))
    assert [row.live_run_id for row in rows] == [live[0].id, live[1].id]
    assert all(row.passed for row in rows), [row.scores for row in rows]
    assert {row.run.version_id for row in rows} == {draft.id}
    assert {row.run.sandbox["purpose"] for row in rows} == {"shadow"}
    # The live run's email was answered to the shadow as it was sent: the shadow sent none.
    assert rows[0].run.sandbox["responses"]["reply"] == live[0].steps.get(name="reply").output


def test_a_shadow_leaves_out_a_live_run_whose_input_is_sealed(refund, draft, editor):
    shadow = shadow_start(workflow=refund, version=draft.number, actor=editor, budget_usd=1,
                          sample_percent=100, max_cases=2)
    Evaluation.objects.filter(pk=shadow.pk).update(examined_until=refund.active_version.created_at)
    live = [live_run(refund.active_version, "My card number is in here.", secret=True),
            live_run(refund.active_version, "Where is my invoice?"),
            live_run(refund.active_version, "The table arrived scratched.")]
    assert live[0].input["message"] == {"secret": "input.message"}

    done = drive(shadow)
    assert [row.live_run_id for row in done.cases.order_by("id")] == [live[1].id, live[2].id]


def test_a_shadow_follows_only_a_sample_chosen_by_run_id():
    ids = [f"00000000-0000-0000-0000-{i:012d}" for i in range(1000)]
    chosen = [i for i in ids if sampled(i, 10)]
    assert 60 < len(chosen) < 140
    assert chosen == [i for i in ids if sampled(i, 10)]  # the same every time
    assert all(sampled(i, 100) for i in ids)


def test_what_a_shadow_is_refused_for(refund, draft, editor, reader):
    with pytest.raises(Forbidden):
        shadow_start(workflow=refund, version=draft.number, actor=reader, budget_usd=1)
    with pytest.raises(InputInvalid) as refused:
        shadow_start(workflow=refund, version=1, actor=editor, budget_usd=1, sample_percent=0, max_cases=0)
    assert paths(refused) == ["version", "sample_percent", "max_cases"]
    shadow_start(workflow=refund, version=draft.number, actor=editor, budget_usd=1)
    with pytest.raises(InputInvalid) as twice:
        shadow_start(workflow=refund, version=draft.number, actor=editor, budget_usd=1)
    assert paths(twice) == ["workflow"]


def test_a_stopped_evaluation_counts_what_its_cancelled_runs_spend_after_the_stop(dataset, cases, editor):
    evaluation = evaluation_start(dataset=dataset, version=1, actor=editor, budget_usd="0.000015", concurrency=2)
    done = drive(evaluation)
    assert done.state == EvaluationState.STOPPED and "the budget of 0.000015 USD" in done.stop_reason
    run = Run.objects.filter(evaluation_case__evaluation=done).first()
    Run.objects.filter(pk=run.pk).update(cost_usd=run.cost_usd + Decimal("0.25"))  # a call settled late
    later = evaluation_advance(evaluation_id=done.id)
    assert later.state == EvaluationState.STOPPED and later.cost_usd == done.cost_usd + Decimal("0.25")
