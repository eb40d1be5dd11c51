"""Moving runs that wait at a gate to a new version, on real workers, the real broker and the
real database: the compatible runs move and finish on the new version (its new step runs after
the approval), the others are refused with the reason and finish on theirs; a gate whose
approved action changes asks a new decision."""
import pytest

from approvals.models import ApprovalRequest
from orchestrator.models import Role, Run, StepRun
from tests.conftest import client_for
from tests.engine.test_moves import ANNOUNCE, RELEASE, variant
from tests.factories import member

from .conftest import wait_for_run

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

LONG_TITLES = {"type": "object", "required": ["title"],
               "properties": {"title": {"type": "string", "minLength": 5}}}


@pytest.fixture
def people(team):
    """Who saves the versions, who starts and moves the runs, who approves."""
    return (client_for(member(team, "editor", role=Role.EDITOR)),
            member(team, "operator", role=Role.OPERATOR), member(team, "lead", groups=("leads",)))


def start_at_gate(api, title: str) -> str:
    started = api.post("/api/v1/workflows/release/runs/", {"input": {"title": title}}, format="json")
    assert started.status_code == 202, started.json()
    run = wait_for_run(started.json()["id"], states=("waiting", "failed"))
    assert run.state == "waiting", run.error
    return str(run.id)


def approve(approver, run_id: str, expected: int = 200):
    approval = ApprovalRequest.objects.filter(run_id=run_id, state="pending").get()
    decided = client_for(approver).post(f"/api/v1/approvals/{approval.id}/approve/", {
        "proposal_hash": approval.proposal_hash}, format="json")
    assert decided.status_code == expected, decided.json()
    return approval


def outputs(run_id: str) -> dict:
    return dict(StepRun.objects.filter(run_id=run_id).values_list("name", "output"))


def test_runs_waiting_at_a_gate_move_to_a_version_that_adds_a_step_after_it(workers, team, people):
    editor, operator, lead = people
    api = client_for(operator)
    assert editor.post("/api/v1/workflows/", RELEASE, format="json").status_code == 201
    spring, autumn, short = (start_at_gate(api, t) for t in ("Spring release", "Autumn release", "Fix"))
    # Version 2 announces each release after publishing it, and wants longer titles.
    assert editor.post("/api/v1/workflows/", variant(add=[ANNOUNCE], input_schema=LONG_TITLES),
                    format="json").status_code == 201

    body = {"runs": [spring, autumn, short], "version": 2}
    planned = api.post("/api/v1/runs/move/", body, format="json").json()
    assert [p["movable"] for p in planned["runs"]] == [True, True, False]
    moved = api.post("/api/v1/runs/move/", {**body, "dry_run": False, "reason": "announce releases"},
                     format="json")
    assert moved.status_code == 200, moved.json()
    answer = {p["run"]: p for p in moved.json()["runs"]}
    assert (moved.json()["moved"], moved.json()["refused"]) == (2, 1)
    assert [r["code"] for r in answer[short]["refusals"]] == ["input_invalid"]
    assert "'Fix' is too short" in answer[short]["refusals"][0]["message"]

    for run_id in (spring, autumn, short):
        approve(lead, run_id)
    for run_id in (spring, autumn, short):
        assert wait_for_run(run_id, states=("completed", "failed")).state == "completed"
    # The moved runs ran the new version's step; the refused one finished on its own version.
    assert outputs(spring)["announce"] == {"said": "Spring release"}
    assert outputs(autumn)["announce"] == {"said": "Autumn release"}
    assert "announce" not in outputs(short)
    assert {str(r.id): r.version.number for r in Run.objects.all()} == {spring: 2, autumn: 2, short: 1}


def test_a_gate_whose_approved_action_changes_asks_a_new_decision(workers, team, people):
    editor, operator, lead = people
    api = client_for(operator)
    assert editor.post("/api/v1/workflows/", RELEASE, format="json").status_code == 201
    run_id = start_at_gate(api, "Spring release")
    old = ApprovalRequest.objects.get(run_id=run_id)
    assert editor.post("/api/v1/workflows/", variant(steps={"publish": {"params": {
        "title": "{{ steps.prepare.output.title }}", "channel": "news"}}}), format="json").status_code == 201

    moved = api.post("/api/v1/runs/move/", {"runs": [run_id], "version": 2, "dry_run": False,
                                            "reason": "publish on the news channel"}, format="json")
    assert moved.json()["runs"][0]["gates_asked_again"] == ["approve"]
    # The decision on the old action is refused: it no longer binds what will run.
    stale = client_for(lead).post(f"/api/v1/approvals/{old.id}/approve/", {
        "proposal_hash": old.proposal_hash}, format="json")
    assert stale.status_code == 409
    new = approve(lead, run_id)
    assert new.id != old.id and new.proposal_hash != old.proposal_hash
    assert wait_for_run(run_id, states=("completed", "failed")).state == "completed"
    assert outputs(run_id)["publish"] == {"title": "Spring release", "channel": "news"}
