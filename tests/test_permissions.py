"""The permission matrix (docs/permissions.md), through the API and through the admin.

Every case puts one object in the state its action needs, then lets one persona try the action
through the REST API and, where the admin offers the action, through the admin; both must agree
with the matrix. The personas are staff accounts (so the admin lets them in), which also shows
that being staff grants nothing by itself.
"""
import json
import re
from pathlib import Path

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client

from approvals.models import ApprovalRequest, InputTask
from orchestrator.engine.authz import GRANTS, Action
from orchestrator.engine.errors import Forbidden
from orchestrator.engine.retry import StepError
from orchestrator.engine.services.kinds.human_gate import approval_grant
from orchestrator.engine.services.kinds.worker import Usage, step_claim, step_fail
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.signals import signal_send
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import DeadLetter, Role, Run, StepRun, StepState
from tests.api.driving import drive_to_gate, support_run
from tests.conftest import client_for
from tests.factories import SETUP, TeamFactory, UserFactory, example_definition, member

pytestmark = pytest.mark.django_db

PERSONAS = ("member", "editor", "operator", "owner", "staff", "superuser")
MATRIX = Path(__file__).resolve().parent.parent / "docs" / "permissions.md"

FAILING = {"name": "fragile", "input_schema": {"type": "object"}, "steps": [
    {"name": "call", "type": "tool", "tool": "core.echo"},
    {"name": "after", "type": "tool", "tool": "core.echo", "after": ["call"]}]}


def documented_matrix() -> dict[str, set[str]]:
    """{row label: personas marked yes}, read from docs/permissions.md."""
    text = MATRIX.read_text()
    table = text.split("<!-- permission-matrix:start -->")[1].split("<!-- permission-matrix:end -->")[0]
    rows = [line for line in table.strip().splitlines()[2:]]
    matrix = {}
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        matrix[cells[0]] = {p for p, cell in zip(PERSONAS, cells[1:], strict=True) if cell == "yes"}
    return matrix


@pytest.fixture
def starter(team):
    """An editor of the team who starts the runs the cases act on."""
    return member(team, "starter", role=Role.EDITOR)


def persona(team, name: str) -> User:
    if name == "superuser":
        return UserFactory(username="root", is_staff=True, is_superuser=True)
    if name == "staff":
        TeamFactory(slug="elsewhere")  # staff with no role in the team acted on
        return UserFactory(username="staffer", is_staff=True)
    return member(team, name, role=name, staff=True)


def admin_client(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def paused_with_failed_step(team, starter) -> tuple[Run, StepRun]:
    version, _ = workflow_save(team=team, definition={**FAILING, "on_error": "pause"}, actor=SETUP)
    return _fail_first_step(run_start(version=version, input={}, actor=starter))


def failed_with_dead_letter(team, starter) -> DeadLetter:
    version, _ = workflow_save(team=team, definition=FAILING, actor=SETUP)
    run, step = _fail_first_step(run_start(version=version, input={}, actor=starter))
    assert run.state == "failed"
    return DeadLetter.objects.get(step=step)


def _fail_first_step(run: Run) -> tuple[Run, StepRun]:
    step = run.steps.get(name="call")
    claim = step_claim(step_id=step.id, worker="test")
    step_fail(step_id=step.id, attempt=claim.attempt, error=StepError("permanent", "boom"),
              usage=Usage(), worker="test")
    return Run.objects.get(pk=run.pk), StepRun.objects.get(pk=step.pk)


# --- the matrix, in the docs and in the code ---------------------------------------------------


ROW_ACTIONS = {
    "workflow.save": Action.WORKFLOW_SAVE, "run.start": Action.RUN_START,
    "run.cancel (a run someone else started)": Action.RUN_CANCEL, "run.resume": Action.RUN_RESUME,
    "run.move": Action.RUN_MOVE,
    "run.signal": Action.RUN_SIGNAL,
    "step.retry": Action.STEP_RETRY, "step.skip": Action.STEP_SKIP,
    "dead_letter.redrive": Action.DEAD_LETTER_REDRIVE,
    "trigger.manage": Action.TRIGGER_MANAGE,
    "workflow.publish": Action.WORKFLOW_PUBLISH, "workflow.archive": Action.WORKFLOW_ARCHIVE,
    "workflow.waive_gate": Action.WORKFLOW_WAIVE_GATE, "workflow.policy": Action.WORKFLOW_POLICY,
    "alert.handle": Action.ALERT_HANDLE,
    "budget.raise": Action.BUDGET_RAISE, "budget.manage": Action.BUDGET_MANAGE,
    "view the team's workflows and runs": Action.VIEW,
    "dataset.edit": Action.DATASET_EDIT, "dataset.add_run": Action.DATASET_ADD_RUN,
    "evaluation.run": Action.EVALUATION_RUN,
    "retention.manage": Action.RETENTION_MANAGE, "legal_hold.manage": Action.LEGAL_HOLD,
}


def test_the_documented_matrix_is_the_one_the_code_enforces():
    documented = documented_matrix()
    for row, action in ROW_ACTIONS.items():
        by_role = {role for role, actions in GRANTS.items() if action in actions}
        assert documented[row] == by_role | {"superuser"}, row
    assert documented["run.cancel (a run you started)"] == {"member", "editor", "operator", "owner",
                                                            "superuser"}
    assert set(ROW_ACTIONS) | {"run.cancel (a run you started)"} == set(documented)
    assert set(ROW_ACTIONS.values()) == set(Action), "every action has its row in the matrix"


# --- through the API and the admin ----------------------------------------------------------


def allowed(row: str, who: str) -> bool:
    return who in documented_matrix()[row]


def refused_code(who: str) -> int:
    """A person of the team sees the object and is refused (403); anyone else does not see it."""
    return 403 if who in ("member", "editor", "operator", "owner") else 404


@pytest.mark.parametrize("who", PERSONAS)
def test_saving_a_workflow(team, who):
    api = client_for(persona(team, who))
    response = api.post("/api/v1/workflows/", {"definition": example_definition("support"),
                                               "team": team.slug}, format="json")
    if allowed("workflow.save", who):
        assert response.status_code == 201, response.json()
    else:  # not a member: the team is unknown to them (400 naming `team`); a member: 403
        assert response.status_code == (403 if refused_code(who) == 403 else 400), response.json()


def _two_versions(team):
    from orchestrator.models import Workflow

    definition = example_definition("support")
    workflow_save(team=team, definition=definition, actor=SETUP)
    workflow = Workflow.objects.get(team=team, name=definition["name"])
    Workflow.objects.filter(pk=workflow.pk).update(publish_on_save=False)
    workflow_save(team=team, definition={**definition, "description": "v2"}, actor=SETUP)
    return workflow


@pytest.mark.parametrize("surface", ["api", "admin"])
@pytest.mark.parametrize("who", PERSONAS)
def test_publishing_a_version(team, who, surface):
    workflow = _two_versions(team)
    user = persona(team, who)
    if surface == "api":
        response = client_for(user).post(f"/api/v1/workflows/{workflow.name}/versions/2/publish/")
        assert response.status_code == (200 if allowed("workflow.publish", who) else refused_code(who))
    else:
        version = workflow.versions.get(number=2)
        admin_client(user).post("/admin/orchestrator/workflowversion/", {
            "action": "publish", "_selected_action": [str(version.id)]})
    workflow.refresh_from_db()
    assert (workflow.active_version.number == 2) is allowed("workflow.publish", who)


@pytest.mark.parametrize("surface", ["api", "admin"])
@pytest.mark.parametrize("who", PERSONAS)
def test_archiving_a_workflow(team, who, surface):
    workflow = _two_versions(team)
    user = persona(team, who)
    if surface == "api":
        response = client_for(user).post(f"/api/v1/workflows/{workflow.name}/archive/")
        assert response.status_code == (200 if allowed("workflow.archive", who) else refused_code(who))
    else:
        admin_client(user).post("/admin/orchestrator/workflow/", {
            "action": "archive", "_selected_action": [str(workflow.id)]})
    workflow.refresh_from_db()
    assert (workflow.archived_at is not None) is allowed("workflow.archive", who)


@pytest.mark.parametrize("surface", ["api", "admin"])
@pytest.mark.parametrize("who", PERSONAS)
def test_setting_whether_saving_publishes(team, who, surface):
    workflow = _two_versions(team)
    user = persona(team, who)
    if surface == "api":
        response = client_for(user).post(f"/api/v1/workflows/{workflow.name}/policy/",
                                         {"publish_on_save": True}, format="json")
        assert response.status_code == (200 if allowed("workflow.policy", who) else refused_code(who))
    else:
        admin_client(user).post("/admin/orchestrator/workflow/", {
            "action": "publish_on_save", "_selected_action": [str(workflow.id)]})
    workflow.refresh_from_db()
    assert workflow.publish_on_save is allowed("workflow.policy", who)


@pytest.mark.parametrize("who", PERSONAS)
def test_publishing_a_version_that_drops_a_mandatory_gate(team, who):
    from orchestrator.models import Workflow
    from tests.engine.test_mandatory_gates import GATED, without_gate

    workflow_save(team=team, definition=GATED, actor=SETUP)
    workflow = Workflow.objects.get(team=team, name=GATED["name"])
    Workflow.objects.filter(pk=workflow.pk).update(publish_on_save=False)
    workflow_save(team=team, definition=without_gate(), actor=SETUP)
    response = client_for(persona(team, who)).post(
        f"/api/v1/workflows/{workflow.name}/versions/2/publish/")
    may_publish, may_waive = allowed("workflow.publish", who), allowed("workflow.waive_gate", who)
    assert response.status_code == (200 if may_waive else 403 if may_publish else refused_code(who))
    workflow.refresh_from_db()
    assert (workflow.active_version.number == 2) is may_waive


@pytest.mark.parametrize("who", PERSONAS)
def test_starting_a_run(team, starter, who):
    workflow_save(team=team, definition=example_definition("support"), actor=SETUP)
    api = client_for(persona(team, who))
    response = api.post("/api/v1/workflows/support-reply/runs/", {"input": {
        "ticket_id": "T-1", "body": "hi", "customer_email": "a@example.com"}}, format="json")
    assert response.status_code == (202 if allowed("run.start", who) else refused_code(who))


@pytest.mark.parametrize("who", PERSONAS)
def test_forking_a_run(team, starter, who):
    """A fork is a start (run.start), of a run the person must be able to see."""
    version, _ = workflow_save(team=team, definition=FAILING, actor=SETUP)
    source = run_start(version=version, input={}, actor=starter)
    response = client_for(persona(team, who)).post(f"/api/v1/runs/{source.id}/fork/",
                                                   {"step": "after"}, format="json")
    assert response.status_code == (202 if allowed("run.start", who) else refused_code(who))
    assert Run.objects.filter(forked_from=source).exists() is allowed("run.start", who)


@pytest.mark.parametrize("who", [*PERSONAS, "removed"])
def test_run_start_itself_refuses_whoever_may_not_start_runs(team, who):
    """The service decides, not the paths that reach it already filtered: every entry point
    (API, builder, triggers, a queued firing admitted later) relies on this check."""
    version, _ = workflow_save(team=team, definition=FAILING, actor=SETUP)
    user = persona(team, "member" if who == "removed" else who)
    if who == "removed":
        user.team_memberships.all().delete()
    if who != "removed" and allowed("run.start", who):
        assert run_start(version=version, input={}, actor=user).created_by == user
    else:
        with pytest.raises(Forbidden):
            run_start(version=version, input={}, actor=user)
        assert not Run.objects.exists()


@pytest.mark.parametrize("surface", ["api", "admin"])
@pytest.mark.parametrize("who", PERSONAS)
def test_cancelling_a_run_someone_else_started(team, starter, who, surface):
    run = support_run(team, starter)
    user = persona(team, who)
    if surface == "api":
        response = client_for(user).post(f"/api/v1/runs/{run.id}/cancel/")
        assert response.status_code == (202 if allowed("run.cancel (a run someone else started)", who)
                                         else refused_code(who))
    else:
        admin_client(user).post("/admin/orchestrator/run/", {
            "action": "cancel_runs", "_selected_action": [str(run.id)]})
    cancelled = Run.objects.get(pk=run.pk).state in ("cancelled", "cancelling")
    assert cancelled is allowed("run.cancel (a run someone else started)", who)


@pytest.mark.parametrize("who", PERSONAS)
def test_signalling_a_run(team, starter, who):
    version, _ = workflow_save(team=team, actor=SETUP, definition={
        "name": "order", "input_schema": {"type": "object"},
        "steps": [{"name": "pay", "type": "wait", "signal": "paid"}]})
    run = run_start(version=version, input={}, actor=starter)
    user = persona(team, who)
    response = client_for(user).post(f"/api/v1/runs/{run.id}/signals/paid/",
                                     {"payload": {"ok": True}}, format="json")
    assert response.status_code == (202 if allowed("run.signal", who) else refused_code(who))
    signalled = run.steps.get(name="pay").state == "completed"
    assert signalled is allowed("run.signal", who)
    if who == "member":  # the engine refuses whoever the matrix refuses, the API aside
        user.team_memberships.all().delete()
        with pytest.raises(Forbidden):
            signal_send(run_id=run.id, name="paid", payload={}, key="k", actor=user)


@pytest.mark.parametrize("surface", ["api", "admin"])
@pytest.mark.parametrize("role", ["member", "editor"])
def test_whoever_started_a_run_may_cancel_it(team, role, surface):
    user = member(team, "own", role=role, staff=True)
    run = support_run(team, user) if role == "editor" else _started_by_member(team, user)
    if surface == "api":
        assert client_for(user).post(f"/api/v1/runs/{run.id}/cancel/").status_code == 202
    else:
        admin_client(user).post("/admin/orchestrator/run/", {
            "action": "cancel_runs", "_selected_action": [str(run.id)]})
    assert Run.objects.get(pk=run.pk).state in ("cancelled", "cancelling")


def _started_by_member(team, user) -> Run:
    version, _ = workflow_save(team=team, definition=example_definition("support"), actor=SETUP)
    return run_start(version=version, input={"ticket_id": "T-1", "body": "hi",
                                             "customer_email": "a@example.com"}, actor=user)


@pytest.mark.parametrize("who", PERSONAS)
def test_resuming_a_paused_run(team, starter, who):
    version, _ = workflow_save(team=team, definition={
        "name": "frugal", "input_schema": {"type": "object"}, "budget": {"max_cost_usd": 0.01},
        "steps": [{"name": "think", "type": "agent", "model": "fast", "prompt": "hi",
                   "output_schema": {"type": "object"}}]}, actor=SETUP)
    run = run_start(version=version, input={}, actor=starter)
    assert run.state == "paused"  # its first model call would cross the budget
    response = client_for(persona(team, who)).post(f"/api/v1/runs/{run.id}/resume/")
    assert response.status_code == (202 if allowed("run.resume", who) else refused_code(who))


@pytest.mark.parametrize("surface", ["api", "admin"])
@pytest.mark.parametrize("who", PERSONAS)
def test_moving_a_run_to_another_version(team, starter, who, surface):
    run = drive_to_gate(support_run(team, starter))
    target, _ = workflow_save(team=team, actor=SETUP, definition={
        **example_definition("support"), "description": "v2"})
    user = persona(team, who)
    if surface == "api":
        response = client_for(user).post("/api/v1/runs/move/", {
            "runs": [str(run.id)], "version": target.number, "dry_run": False,
            "reason": "the fixed version"}, format="json")
        assert response.status_code == (200 if allowed("run.move", who) else refused_code(who))
    else:
        admin_client(user).post("/admin/orchestrator/run/", {
            "action": "move_runs", "_selected_action": [str(run.id)], "version": str(target.id),
            "reason": "the fixed version", "confirm": "1"})
    moved = Run.objects.get(pk=run.pk).version_id == target.id
    assert moved is allowed("run.move", who)


@pytest.mark.parametrize("action, row", [("retry", "step.retry"), ("skip", "step.skip")])
@pytest.mark.parametrize("who", PERSONAS)
def test_retrying_or_skipping_a_failed_step(team, starter, who, action, row):
    run, step = paused_with_failed_step(team, starter)
    response = client_for(persona(team, who)).post(f"/api/v1/runs/{run.id}/steps/call/{action}/")
    assert response.status_code == (202 if allowed(row, who) else refused_code(who))
    changed = StepRun.objects.get(pk=step.pk).state != StepState.FAILED
    assert changed is allowed(row, who)


@pytest.mark.parametrize("surface", ["api", "admin"])
@pytest.mark.parametrize("who", PERSONAS)
def test_redriving_a_dead_letter(team, starter, who, surface):
    letter = failed_with_dead_letter(team, starter)
    user = persona(team, who)
    if surface == "api":
        response = client_for(user).post(f"/api/v1/dead-letters/{letter.id}/redrive/")
        assert response.status_code == (200 if allowed("dead_letter.redrive", who) else refused_code(who))
    else:
        admin_client(user).post("/admin/orchestrator/deadletter/", {
            "action": "redrive", "_selected_action": [str(letter.id)]})
    redriven = DeadLetter.objects.get(pk=letter.pk).status == "redriven"
    assert redriven is allowed("dead_letter.redrive", who)


@pytest.mark.parametrize("surface", ["api", "admin"])
@pytest.mark.parametrize("who", PERSONAS)
def test_managing_a_trigger(team, who, surface):
    from triggers.models import Trigger
    from triggers.services.config import trigger_create

    workflow_save(team=team, definition=example_definition("support"), actor=SETUP)
    trigger, _ = trigger_create(team=team, kind="webhook", name="inbox", workflow="support-reply",
                                actor=SETUP, enabled=False)
    user = persona(team, who)
    if surface == "api":
        response = client_for(user).post(f"/api/v1/triggers/{trigger.id}/enable/")
        assert response.status_code == (200 if allowed("trigger.manage", who) else refused_code(who))
        created = client_for(user).post("/api/v1/triggers/", {
            "kind": "api", "name": "by-hand", "workflow": "support-reply", "team": team.slug},
            format="json")
        assert created.status_code == (201 if allowed("trigger.manage", who) else
                                       403 if refused_code(who) == 403 else 400)
    else:
        admin_client(user).post("/admin/triggers/trigger/", {
            "action": "enable_selected", "_selected_action": [str(trigger.id)]})
    assert Trigger.objects.get(pk=trigger.pk).enabled is allowed("trigger.manage", who)


@pytest.mark.parametrize("surface", ["api", "admin"])
@pytest.mark.parametrize("who", PERSONAS)
def test_raising_a_runs_budget(team, starter, who, surface):
    from budgets.models import BudgetOverride

    version, _ = workflow_save(team=team, definition={
        "name": "frugal", "input_schema": {"type": "object"}, "budget": {"max_cost_usd": 0.01},
        "steps": [{"name": "think", "type": "agent", "model": "fast", "prompt": "hi",
                   "output_schema": {"type": "object"}}]}, actor=SETUP)
    run = run_start(version=version, input={}, actor=starter)
    assert run.state == "paused"
    user = persona(team, who)
    body = {"max_cost_usd": "5.00", "reason": "a long ticket"}
    if surface == "api":
        response = client_for(user).post(f"/api/v1/runs/{run.id}/budget/", body, format="json")
        assert response.status_code == (202 if allowed("budget.raise", who) else refused_code(who))
    else:
        admin_client(user).post("/admin/budgets/budgetoverride/add/", {**body, "run": str(run.id)})
    assert BudgetOverride.objects.filter(run=run).exists() is allowed("budget.raise", who)
    assert (Run.objects.get(pk=run.pk).state == "running") is allowed("budget.raise", who)


@pytest.mark.parametrize("surface", ["api", "admin"])
@pytest.mark.parametrize("who", PERSONAS)
def test_changing_a_datasets_cases(team, who, surface):
    from evaluation.services import dataset_create
    from tests.evaluation.conftest import SAMPLES

    version, _ = workflow_save(team=team, definition=example_definition("refund-proposal"), actor=SETUP)
    dataset = dataset_create(workflow=version.workflow, name="golden", actor=SETUP)
    user, data = persona(team, who), (SAMPLES / "refund-proposal.jsonl").read_bytes()
    if surface == "api":
        response = client_for(user).generic("POST", f"/api/v1/datasets/{dataset.id}/upload/", data,
                                            content_type="application/jsonl")
        assert response.status_code == (201 if allowed("dataset.edit", who) else refused_code(who))
    else:
        from django.core.files.uploadedfile import SimpleUploadedFile

        admin_client(user).post(f"/admin/evaluation/dataset/{dataset.id}/upload/", {
            "file": SimpleUploadedFile("cases.jsonl", data), "mode": "add"})
    assert (dataset.versions.count() == 2) is allowed("dataset.edit", who)


@pytest.mark.parametrize("surface", ["api", "admin"])
@pytest.mark.parametrize("who", PERSONAS)
def test_adding_a_finished_run_to_a_dataset(team, starter, who, surface):
    from evaluation.services import dataset_create

    dataset = dataset_create(workflow=workflow_save(team=team, definition=FAILING, actor=SETUP)[0].workflow,
                             name="golden", actor=SETUP)
    run = failed_with_dead_letter(team, starter).run
    user = persona(team, who)
    if surface == "api":
        response = client_for(user).post(f"/api/v1/datasets/{dataset.id}/from-run/",
                                         {"run": str(run.id), "risk_tier": "high"}, format="json")
        assert response.status_code == (201 if allowed("dataset.add_run", who) else refused_code(who))
    else:
        admin_client(user).post(f"/admin/evaluation/dataset/from-run/{run.id}/", {
            "dataset": dataset.id, "risk_tier": "high", "expected": '{"run": {"state": "completed"}}'})
    assert (dataset.versions.count() == 2) is allowed("dataset.add_run", who)


def _evaluated_dataset(team):
    from evaluation.services import dataset_cases_add, dataset_create
    from tests.evaluation.conftest import sample_cases

    version, _ = workflow_save(team=team, definition=example_definition("refund-proposal"), actor=SETUP)
    dataset = dataset_create(workflow=version.workflow, name="golden", actor=SETUP)
    dataset_cases_add(dataset=dataset, cases=sample_cases(), actor=SETUP)
    return dataset


@pytest.mark.parametrize("surface", ["api", "admin"])
@pytest.mark.parametrize("who", PERSONAS)
def test_starting_an_evaluation(team, who, surface):
    from evaluation.models import Evaluation

    dataset, user = _evaluated_dataset(team), persona(team, who)
    if surface == "api":
        response = client_for(user).post("/api/v1/evaluations/", {"dataset": dataset.id, "version": 1,
                                                                  "budget_usd": "1"}, format="json")
        # A dataset named in the body that the person does not see is a 400 at its path.
        assert response.status_code == (201 if allowed("evaluation.run", who) else
                                         403 if who in ("member", "operator") else 400), response.json()
    else:
        admin_client(user).post(f"/admin/evaluation/dataset/{dataset.id}/evaluate/", {
            "version": "1", "dataset_version": "2", "budget_usd": "1", "concurrency": "4"})
    assert Evaluation.objects.filter(dataset_version__dataset=dataset).exists() is allowed("evaluation.run", who)


@pytest.mark.parametrize("surface", ["api", "admin"])
@pytest.mark.parametrize("who", PERSONAS)
def test_cancelling_an_evaluation(team, who, surface):
    from evaluation.evaluations import evaluation_start
    from evaluation.models import Evaluation

    evaluation = evaluation_start(dataset=_evaluated_dataset(team), version=1, actor=SETUP, budget_usd="1")
    user = persona(team, who)
    if surface == "api":
        response = client_for(user).post(f"/api/v1/evaluations/{evaluation.id}/cancel/", {}, format="json")
        assert response.status_code == (200 if allowed("evaluation.run", who) else refused_code(who))
    else:
        admin_client(user).post(f"/admin/evaluation/evaluation/{evaluation.id}/cancel/", {"reason": "no"})
    cancelled = Evaluation.objects.get(pk=evaluation.pk).state == "cancelled"
    assert cancelled is allowed("evaluation.run", who)


@pytest.mark.parametrize("who", PERSONAS)
def test_starting_a_shadow(team, who):
    from evaluation.models import Evaluation
    from orchestrator.engine.services.workflows import workflow_policy_set

    workflow = _evaluated_dataset(team).workflow
    workflow_policy_set(workflow_id=workflow.id, publish_on_save=False, actor=SETUP)
    workflow_save(team=team, definition={**example_definition("refund-proposal"), "description": "a draft"},
                  actor=SETUP)
    response = client_for(persona(team, who)).post("/api/v1/evaluations/shadow/", {
        "workflow": workflow.name, "team": team.slug, "version": 2, "budget_usd": "1"}, format="json")
    # A team named in the body that the person is not a member of is a 400 at its path.
    assert response.status_code == (201 if allowed("evaluation.run", who) else
                                    403 if who in ("member", "operator") else 400), response.json()
    assert Evaluation.objects.filter(workflow=workflow, purpose="shadow").exists() is allowed("evaluation.run", who)


@pytest.mark.parametrize("surface", ["api", "admin"])
@pytest.mark.parametrize("who", PERSONAS)
def test_setting_and_removing_a_release_policy(team, who, surface):
    from evaluation.gate import release_policy_set
    from evaluation.models import ReleasePolicy

    dataset, user = _evaluated_dataset(team), persona(team, who)
    workflow, thresholds = dataset.workflow, {"tiers": {"high": {"unauthorized_actions": {"max": 0}}}}
    url = "/api/v1/workflows/refund-proposal/release-policy/"
    if surface == "api":
        response = client_for(user).put(url, {"dataset": dataset.id, "thresholds": thresholds}, format="json")
        assert response.status_code == (200 if allowed("workflow.policy", who) else refused_code(who))
    else:
        admin_client(user).post(f"/admin/evaluation/releasepolicy/workflow/{workflow.id}/", {
            "dataset": dataset.id, "thresholds": json.dumps(thresholds)})
    assert ReleasePolicy.objects.filter(workflow=workflow).exists() is allowed("workflow.policy", who)
    release_policy_set(workflow=workflow, dataset=dataset, thresholds=thresholds, actor=SETUP)
    if surface == "api":
        client_for(user).delete(url)
    else:
        admin_client(user).post(f"/admin/evaluation/releasepolicy/workflow/{workflow.id}/",
                                {"dataset": "", "thresholds": ""})
    assert ReleasePolicy.objects.filter(workflow=workflow).exists() is not allowed("workflow.policy", who)


@pytest.mark.parametrize("who", PERSONAS)
def test_setting_a_teams_budget_limit(team, who):
    from budgets.models import BudgetLimit

    admin_client(persona(team, who)).post("/admin/budgets/budgetlimit/add/", {
        "team": str(team.id), "monthly_usd": "100", "warn_at": "0.8",
        "effective_from_0": "2026-01-01", "effective_from_1": "00:00:00"})
    assert BudgetLimit.objects.filter(team=team).exists() is allowed("budget.manage", who)


@pytest.mark.parametrize("surface", ["api", "admin"])
@pytest.mark.parametrize("who", PERSONAS)
def test_setting_and_removing_a_mandatory_gate_policy(team, who, surface):
    from orchestrator.engine.services.gate_policies import gate_policy_create
    from orchestrator.models import GatePolicy

    user = persona(team, who)
    if surface == "api":
        response = client_for(user).post("/api/v1/gate-policies/", {
            "tool": "email.send", "team": team.slug}, format="json")
        assert response.status_code == (201 if allowed("workflow.policy", who)
                                        else 400 if who == "staff" else 403)
    else:
        admin_client(user).post("/admin/orchestrator/gatepolicy/add/", {
            "team": str(team.id), "tool": "email.send", "required_approvals": "1"})
    assert GatePolicy.objects.filter(team=team).exists() is allowed("workflow.policy", who)
    kept = gate_policy_create(team=team, actor=SETUP, tool="payments.*")
    if surface == "api":
        client_for(user).delete(f"/api/v1/gate-policies/{kept.id}/")
    else:
        admin_client(user).post(f"/admin/orchestrator/gatepolicy/{kept.id}/delete/", {"post": "yes"})
    assert GatePolicy.objects.filter(pk=kept.pk).exists() is not allowed("workflow.policy", who)


# --- approvals: the group, the team, separation of duties --------------------------------------

APPROVAL_PERSONAS = ("approver", "starter", "member", "operator", "outside_approver", "staff",
                     "superuser")
APPROVAL_ACTIONS = ("approve", "reject", "edit", "revoke")


def approval_matrix() -> dict[str, set[str]]:
    """{row label: personas marked yes}, from the approval table of docs/permissions.md."""
    text = MATRIX.read_text()
    table = text.split("<!-- approval-matrix:start -->")[1].split("<!-- approval-matrix:end -->")[0]
    matrix = {}
    for row in table.strip().splitlines()[2:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        matrix[cells[0]] = {p for p, cell in zip(APPROVAL_PERSONAS, cells[1:], strict=True)
                            if cell == "yes"}
    return matrix


def approval_persona(team, who: str, starter: User) -> User:
    if who == "starter":
        return starter
    if who == "approver":
        return member(team, "lead", role=Role.MEMBER, staff=True, groups=("support_leads",))
    if who == "operator":  # an owner, the strongest role: still not an approver
        return member(team, "owner", role=Role.OWNER, staff=True)
    if who == "outside_approver":  # in the approvers group, but not in the run's team
        return member(TeamFactory(slug="other"), "lead", role=Role.OWNER, staff=True,
                      groups=("support_leads",))
    return persona(team, who)


def gate_for(team, starter, action: str) -> ApprovalRequest:
    """The support gate, waiting; for `revoke`, approved by another lead (send not run yet)."""
    starter.groups.add(Group.objects.get_or_create(name="support_leads")[0])
    gate = ApprovalRequest.objects.get(run=drive_to_gate(support_run(team, starter)))
    if action == "revoke":
        other = member(team, "lead_x", role=Role.MEMBER, groups=("support_leads",))
        approval_grant(approval_id=gate.id, user=other, proposal_hash=gate.proposal_hash)
    return gate


BODIES = {"approve": {"note": "ok"}, "reject": {"note": "no"}, "revoke": {"note": "withdrawn"},
          "edit": {"params": {"subject": "Your refund"}}}
DONE = {"approve": lambda g: g.state == "approved", "reject": lambda g: g.state == "rejected",
        "revoke": lambda g: g.state == "revoked",
        "edit": lambda g: g.edits == {"subject": "Your refund"}}


def test_the_documented_approval_matrix_has_every_action_and_persona():
    documented = approval_matrix()
    assert set(documented) == {"see the request (API)", "see the request (admin)",
                               *(f"approval.{a}" for a in APPROVAL_ACTIONS)}
    assert "starter" not in documented["approval.approve"]  # separation of duties


@pytest.mark.parametrize("surface", ["api", "admin"])
@pytest.mark.parametrize("who", APPROVAL_PERSONAS)
@pytest.mark.parametrize("action", APPROVAL_ACTIONS)
def test_deciding_an_approval(team, starter, who, action, surface):
    gate = gate_for(team, starter, action)
    user = approval_persona(team, who, starter)
    may = who in approval_matrix()[f"approval.{action}"]
    body = {**BODIES[action], "proposal_hash": gate.proposal_hash}
    if surface == "api":
        response = client_for(user).post(f"/api/v1/approvals/{gate.id}/{action}/", body,
                                         format="json")
        sees = who in approval_matrix()["see the request (API)"]
        assert response.status_code == (200 if may else 403 if sees else 404), response.json()
    else:
        form = {"form": "decision", "decision": action} if action in ("approve", "reject") else {
            "form": action}
        if action == "edit":
            form.update(param_subject="Your refund", param_body=gate.action["params"]["body"])
        response = admin_client(user).post(f"/admin/approvals/approvalrequest/{gate.id}/change/",
                                           {**form, **body, "params": ""})
        sees = who in approval_matrix()["see the request (admin)"]
        assert response.status_code == (302 if may else 403 if sees else 404)
    assert DONE[action](ApprovalRequest.objects.get(pk=gate.pk)) is may


@pytest.mark.parametrize("who", APPROVAL_PERSONAS)
def test_seeing_an_approval_request(team, starter, who):
    gate = gate_for(team, starter, "approve")
    user = approval_persona(team, who, starter)
    api = client_for(user).get(f"/api/v1/approvals/{gate.id}/").status_code
    admin = admin_client(user).get(f"/admin/approvals/approvalrequest/{gate.id}/change/").status_code
    assert (api == 200) is (who in approval_matrix()["see the request (API)"])
    assert (admin == 200) is (who in approval_matrix()["see the request (admin)"])


def test_a_refusal_names_the_permission_and_changes_nothing(team, starter):
    run = support_run(team, starter)
    response = client_for(persona(team, "member")).post(f"/api/v1/runs/{run.id}/cancel/")
    assert response.status_code == 403
    assert re.search(r"user:member may not run\.cancel in team 'support'",
                     response.json()["errors"][0]["message"])
    assert Run.objects.get(pk=run.pk).state == run.state


# --- input tasks: the group, the team, separation of duties ---------------------------------------

INPUT_ACTIONS = ("answer", "abstain")
ASKING = {"name": "asking", "input_schema": {"type": "object"}, "steps": [
    {"name": "ask", "type": "human_input", "group": "support_leads", "allow_abstain": True,
     "separation_of_duties": True,
     "form": {"type": "object", "required": ["reason"],
              "properties": {"reason": {"type": "string"}}}}]}


def input_matrix() -> dict[str, set[str]]:
    """{row label: personas marked yes}, from the input task table of docs/permissions.md."""
    text = MATRIX.read_text()
    table = text.split("<!-- input-matrix:start -->")[1].split("<!-- input-matrix:end -->")[0]
    matrix = {}
    for row in table.strip().splitlines()[2:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        matrix[cells[0]] = {p for p, cell in zip(APPROVAL_PERSONAS, cells[1:], strict=True)
                            if cell == "yes"}
    return matrix


def input_task_for(team, starter):
    starter.groups.add(Group.objects.get_or_create(name="support_leads")[0])
    version, _ = workflow_save(team=team, definition=ASKING, actor=SETUP)
    return InputTask.objects.get(run=run_start(version=version, input={}, actor=starter))


def test_the_documented_input_matrix_has_every_action_and_persona():
    documented = input_matrix()
    assert set(documented) == {"see the task (API)", "see the task (admin)",
                               *(f"input.{a}" for a in INPUT_ACTIONS)}
    assert "starter" not in documented["input.answer"]  # separation of duties


@pytest.mark.parametrize("surface", ["api", "admin"])
@pytest.mark.parametrize("who", APPROVAL_PERSONAS)
@pytest.mark.parametrize("action", INPUT_ACTIONS)
def test_answering_an_input_task(team, starter, who, action, surface):
    task = input_task_for(team, starter)
    user = approval_persona(team, who, starter)
    may = who in input_matrix()[f"input.{action}"]
    if surface == "api":
        body = {"abstain": True} if action == "abstain" else {"answer": {"reason": "ok"}}
        response = client_for(user).post(f"/api/v1/input-tasks/{task.id}/answer/", body,
                                         format="json")
        sees = who in input_matrix()["see the task (API)"]
        assert response.status_code == (200 if may else 403 if sees else 404), response.json()
    else:
        response = admin_client(user).post(f"/admin/approvals/inputtask/{task.id}/change/",
                                           {"decision": action, "field_reason": "ok"})
        sees = who in input_matrix()["see the task (admin)"]
        assert response.status_code == (302 if may else 403 if sees else 404)
    expected = ("abstained" if action == "abstain" else "answered") if may else "open"
    assert InputTask.objects.get(pk=task.pk).state == expected


@pytest.mark.parametrize("who", APPROVAL_PERSONAS)
def test_seeing_an_input_task(team, starter, who):
    task = input_task_for(team, starter)
    user = approval_persona(team, who, starter)
    api = client_for(user).get(f"/api/v1/input-tasks/{task.id}/").status_code
    admin = admin_client(user).get(f"/admin/approvals/inputtask/{task.id}/change/").status_code
    assert (api == 200) is (who in input_matrix()["see the task (API)"])
    assert (admin == 200) is (who in input_matrix()["see the task (admin)"])
