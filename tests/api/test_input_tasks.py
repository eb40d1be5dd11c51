"""The input tasks API (docs/api.md): list the open tasks waiting for me, read one, answer it —
200 when the run moves on, 400 naming each field the form refuses, 403 for someone who may not
answer, 404 for someone who cannot see it, 409 for a stale task — each answer as the published
schema says. The Python client's methods reach the same endpoints.
"""
import httpx
import pytest

from approvals.models import InputTask
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Run
from stepwise_client import Stepwise, StepwiseError
from tests.conftest import client_for
from tests.factories import SETUP, member

from .published import assert_documented

pytestmark = pytest.mark.django_db

DEFINITION = {
    "name": "vendor-iban",
    "input_schema": {"type": "object"},
    "steps": [
        {"name": "ask", "type": "human_input", "group": "clerks", "allow_abstain": True,
         "form": {"type": "object", "required": ["iban"],
                  "properties": {"iban": {"type": "string", "minLength": 5}}}},
        {"name": "pay", "type": "tool", "tool": "core.echo", "after": ["ask"],
         "params": {"iban": "{{ steps.ask.output.answer.iban | default('') }}"}},
    ],
}


@pytest.fixture
def clerk(team):
    return member(team, "clerk", groups=("clerks",))


@pytest.fixture
def task(team, requester) -> InputTask:
    version, _ = workflow_save(team=team, definition=DEFINITION, actor=SETUP)
    run = run_start(version=version, input={}, actor=requester)
    return InputTask.objects.get(run=run)


def test_a_clerk_lists_the_tasks_waiting_for_them_and_reads_one(clerk, requester, task):
    api = client_for(clerk)
    listed = api.get("/api/v1/input-tasks/", {"state": "open", "for": "me"})
    assert listed.status_code == 200
    assert [t["id"] for t in listed.json()["results"]] == [task.id]
    assert_documented(api, listed, "GET", "/api/v1/input-tasks/")
    # The requester sees the team's tasks, but none waits for their answer.
    assert client_for(requester).get("/api/v1/input-tasks/", {"for": "me"}).json()["results"] == []
    assert len(client_for(requester).get("/api/v1/input-tasks/").json()["results"]) == 1

    one = api.get(f"/api/v1/input-tasks/{task.id}/")
    assert one.status_code == 200
    assert one.json()["form"]["required"] == ["iban"] and one.json()["group"] == "clerks"
    assert_documented(api, one, "GET", "/api/v1/input-tasks/{id}/")


def test_an_answer_moves_the_run_on_and_names_who_gave_it(clerk, task):
    api = client_for(clerk)
    response = api.post(f"/api/v1/input-tasks/{task.id}/answer/",
                        {"answer": {"iban": "DE0012345"}, "note": "checked"}, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["state"] == "answered" and response.json()["answered_by"] == "clerk"
    assert_documented(api, response, "POST", "/api/v1/input-tasks/{id}/answer/")
    run = Run.objects.get(id=task.run_id)
    assert run.steps.get(name="pay").state == "queued"

    stale = api.post(f"/api/v1/input-tasks/{task.id}/answer/", {"answer": {"iban": "DE0099999"}},
                     format="json")
    assert stale.status_code == 409
    assert "answered already" in stale.json()["errors"][0]["message"]
    assert_documented(api, stale, "POST", "/api/v1/input-tasks/{id}/answer/")


def test_an_answer_the_form_refuses_is_a_400_naming_the_field(clerk, task):
    api = client_for(clerk)
    response = api.post(f"/api/v1/input-tasks/{task.id}/answer/", {"answer": {"iban": "DE"}},
                        format="json")
    assert response.status_code == 400
    assert [e["path"] for e in response.json()["errors"]] == ["answer.iban"]
    assert_documented(api, response, "POST", "/api/v1/input-tasks/{id}/answer/")
    assert InputTask.objects.get(id=task.id).state == "open"


def test_a_team_member_outside_the_group_gets_403_and_an_outsider_404(requester, outsider, task):
    body = {"answer": {"iban": "DE0012345"}}
    forbidden = client_for(requester).post(f"/api/v1/input-tasks/{task.id}/answer/", body,
                                           format="json")
    assert forbidden.status_code == 403
    assert_documented(client_for(requester), forbidden, "POST", "/api/v1/input-tasks/{id}/answer/")
    hidden = client_for(outsider).post(f"/api/v1/input-tasks/{task.id}/answer/", body,
                                       format="json")
    assert hidden.status_code == 404
    assert InputTask.objects.get(id=task.id).state == "open"


def test_the_python_client_lists_and_answers(clerk, task, live_server):
    token = client_for(clerk)._credentials["HTTP_AUTHORIZATION"].split()[1]
    with Stepwise(live_server.url, token, http=httpx.Client(base_url=live_server.url)) as client:
        [mine] = client.input_tasks()
        assert mine.id == task.id and mine.form["required"] == ["iban"] and mine.allow_abstain
        with pytest.raises(StepwiseError) as refused:
            client.answer(mine, {"iban": "x"})
        assert refused.value.status == 400
        answered = client.answer(mine, abstain=True, note="cannot tell")
        assert answered.state == "abstained"
        assert client.input_task(task.id).data["answered_by"] == "clerk"
        assert client.input_tasks() == []


def test_for_takes_only_me(clerk, task):
    response = client_for(clerk).get("/api/v1/input-tasks/", {"for": "everyone"})
    assert response.status_code == 400
    assert response.json()["errors"][0]["path"] == "for"
