"""POST /api/v1/runs/move/: the dry run (the default), the move, and its errors in the API's shape."""
import pytest

from orchestrator.models import Role, Run
from tests.conftest import client_for
from tests.engine.test_moves import ANNOUNCE, RELEASE, at_gate, save, variant
from tests.factories import TeamFactory, member

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator(team):
    return member(team, "operator", role=Role.OPERATOR)


@pytest.fixture
def waiting(team, operator):
    """Two runs at the gate of version 1, and version 2 adding a step after it that requires a
    title of at least 5 characters: the first run moves, the second is refused."""
    v1 = save(team, RELEASE)
    runs = [at_gate(v1, operator, "Spring release"), at_gate(v1, operator, "Fix")]
    save(team, variant(add=[ANNOUNCE], input_schema={
        "type": "object", "required": ["title"], "properties": {"title": {"type": "string", "minLength": 5}}}))
    return runs


def test_a_dry_run_is_the_default_and_changes_nothing(operator, waiting):
    response = client_for(operator).post("/api/v1/runs/move/", {
        "runs": [str(r.id) for r in waiting], "version": 2}, format="json")
    assert response.status_code == 200, response.json()
    body = response.json()
    assert (body["dry_run"], body["moved"], body["refused"]) == (True, 0, 1)
    ok, refused = body["runs"]
    assert ok["movable"] and ok["run"] == str(waiting[0].id)
    assert {s["name"]: s["change"] for s in ok["steps"]} == {
        "prepare": "kept", "approve": "kept", "publish": "kept", "announce": "added"}
    assert not refused["movable"]
    assert refused["refusals"] == [{"code": "input_invalid", "path": "input.title", "message":
                                    "the run's input fails version 2's input_schema: 'Fix' is too short"}]
    assert {r.version.number for r in Run.objects.all()} == {1}


def test_moving_moves_what_can_move_and_says_why_the_rest_did_not(operator, waiting):
    response = client_for(operator).post("/api/v1/runs/move/", {
        "runs": [str(r.id) for r in waiting], "version": 2, "dry_run": False,
        "reason": "announce every release"}, format="json")
    assert response.status_code == 200, response.json()
    assert (response.json()["moved"], response.json()["refused"]) == (1, 1)
    assert Run.objects.get(pk=waiting[0].pk).version.number == 2
    assert Run.objects.get(pk=waiting[1].pk).version.number == 1


@pytest.mark.parametrize("body, status, path", [
    ({"version": 9}, 400, "version"),
    ({"version": 2, "dry_run": False}, 400, "reason"),
    ({"version": 2, "runs": []}, 400, "runs"),
])
def test_a_bad_request_is_an_error_with_its_path(operator, waiting, body, status, path):
    response = client_for(operator).post("/api/v1/runs/move/", {
        "runs": [str(waiting[0].id)], **body}, format="json")
    assert response.status_code == status, response.json()
    assert response.json()["errors"][0]["path"] == path


def test_a_member_is_refused_and_another_team_sees_no_run(team, waiting):
    body = {"runs": [str(waiting[0].id)], "version": 2}
    assert client_for(member(team, "m", role=Role.MEMBER)).post(
        "/api/v1/runs/move/", body, format="json").status_code == 403
    stranger = member(TeamFactory(slug="elsewhere"), "stranger", role=Role.OWNER)
    assert client_for(stranger).post("/api/v1/runs/move/", body, format="json").status_code == 404
