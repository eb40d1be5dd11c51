"""POST /api/v1/runs/<id>/signals/<name>/ (docs/definitions.md, "wait"): 202 with the signal
consumed or buffered, 200 and nothing changed for a key sent again, 400 naming each payload
problem by path, 404 for a run the caller may not see, 409 when no step of the run waits for
the name or the run has ended."""
import pytest

from orchestrator.engine.services.runs import run_cancel, run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Run, Signal
from tests.factories import SETUP

from .published import assert_documented

pytestmark = pytest.mark.django_db


@pytest.fixture
def run(team) -> Run:
    version, _ = workflow_save(team=team, actor=SETUP, definition={
        "name": "order", "input_schema": {"type": "object"}, "steps": [
            {"name": "pay", "type": "wait", "signal": "paid",
             "schema": {"type": "object", "required": ["amount"],
                        "properties": {"amount": {"type": "number"}}}},
            {"name": "ship", "type": "tool", "tool": "core.echo", "after": ["pay"],
             "params": {"x": 1}}]})
    return run_start(version=version, input={}, actor=SETUP)


PATH = "/api/v1/runs/{id}/signals/{name}/"


def signal(client, run, name="paid", payload=None, key="k-1"):
    response = client.post(f"/api/v1/runs/{run.id}/signals/{name}/",
                           {"payload": {"amount": 5} if payload is None else payload},
                           format="json", headers={"Idempotency-Key": key} if key else {})
    assert_documented(client, response, "POST", PATH)  # every answer as the schema says
    return response


def test_a_signal_completes_the_waiting_step_and_a_repeat_of_its_key_changes_nothing(api, run):
    waiting = api.get(f"/api/v1/runs/{run.id}/")
    assert_documented(api, waiting, "GET", "/api/v1/runs/{id}/")
    until = run.steps.get(name="pay").deadline_at
    assert waiting.json()["waiting_for_signals"] == [
        {"step": "pay", "signal": "paid", "until": until.isoformat().replace("+00:00", "Z")}]
    response = signal(api, run)
    assert response.status_code == 202, response.json()
    body = response.json()
    assert (body["name"], body["key"], body["state"], body["step"], body["payload"],
            body["sent_by"], body["duplicate"]) == (
        "paid", "k-1", "consumed", "pay", {"amount": 5}, "user:requester", False)
    assert run.steps.get(name="pay").output == {"amount": 5}

    again = signal(api, run)
    assert again.status_code == 200 and again.json()["duplicate"] is True
    assert again.json()["id"] == body["id"] and Signal.objects.filter(run=run).count() == 1

    detail = api.get(f"/api/v1/runs/{run.id}/").json()
    assert {s["name"]: s["state"] for s in detail["steps"]} == {"pay": "completed", "ship": "queued"}
    assert detail["waiting_for_signals"] == []


def test_the_same_key_with_another_payload_is_a_409(api, run):
    signal(api, run)
    response = signal(api, run, payload={"amount": 6})
    assert response.status_code == 409
    assert response.json()["errors"] == [{"path": "key", "message": "already used with another payload"}]


def test_a_payload_the_schema_refuses_is_a_400_by_path_and_nothing_is_consumed(api, run):
    response = signal(api, run, payload={"amount": "five"})
    assert response.status_code == 400
    assert response.json()["errors"] == [{"path": "payload.amount",
                                          "message": "'five' is not of type 'number'"}]
    assert signal(api, run, payload=[1]).status_code == 400
    missing = api.post(f"/api/v1/runs/{run.id}/signals/paid/", {}, format="json")
    assert missing.status_code == 400 and missing.json()["errors"][0]["path"] == "payload"
    assert run.steps.get(name="pay").state == "waiting" and not Signal.objects.exists()


def test_a_signal_no_step_waits_for_or_to_an_ended_run_is_a_409(api, run):
    response = signal(api, run, name="refund")
    assert response.status_code == 409
    assert response.json()["errors"] == [{"path": "name",
                                          "message": "no wait step for signal 'refund'"}]
    run_cancel(run_id=run.id, actor=SETUP)
    ended = signal(api, run)
    assert ended.status_code == 409 and "the run is cancelled" in ended.json()["errors"][0]["message"]


def test_a_run_the_caller_may_not_see_is_a_404_and_unsignalled(outsider_api, run):
    assert signal(outsider_api, run).status_code == 404
    assert run.steps.get(name="pay").state == "waiting"


def test_without_a_key_each_send_is_a_new_signal(api, run):
    assert signal(api, run, key=None).status_code == 202
    assert signal(api, run, key=None).status_code == 409  # the one wait for it has completed
