"""Child runs are created by workers, one level per `child_start` message, never inside the
request or transaction that started their parent; and they nest at most
`STEPWISE_MAX_CHILD_DEPTH` deep. Workflows that call each other (a chain here: a cycle is
refused at save, and the depth limit is what stops a chain too long or a cycle saved before)
grow one level per message, so one start costs one run in the request."""
import pytest

from orchestrator.engine.services import reaper
from orchestrator.engine.services.kinds.sub_workflow import child_run_start
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Event, Run, StepRun
from tests.conftest import client_for
from tests.factories import SETUP, member
from tests.support.children import start_children

pytestmark = pytest.mark.django_db
LEVELS = 12


def chain(team, levels: int = LEVELS) -> None:
    """w0 calls w1 calls ... w<levels - 1>, which echoes."""
    workflow_save(team=team, definition={
        "name": f"w{levels - 1}", "input_schema": {"type": "object"},
        "steps": [{"name": "leaf", "type": "tool", "tool": "core.echo"}]}, actor=SETUP)
    for level in reversed(range(levels - 1)):
        workflow_save(team=team, definition={
            "name": f"w{level}", "input_schema": {"type": "object"},
            "steps": [{"name": "call", "type": "sub_workflow", "workflow": f"w{level + 1}",
                       "input": {"level": level + 1}}]}, actor=SETUP)


def test_a_member_s_start_creates_one_run_in_the_request_and_sends_its_child_to_a_worker(
        team, django_capture_on_commit_callbacks, monkeypatch):
    chain(team)
    sent = []
    monkeypatch.setattr("orchestrator.engine.dispatch.current_app.send_task",
                        lambda name, args, **options: sent.append((name, args, options)))
    api = client_for(member(team, "starter", role="member"))

    with django_capture_on_commit_callbacks(execute=True):
        response = api.post("/api/v1/workflows/w0/runs/", {"input": {}}, format="json")

    assert response.status_code == 202, response.content
    assert Run.objects.count() == 1
    call = StepRun.objects.get(run_id=response.json()["id"], name="call")
    assert call.state == "waiting"
    assert [(name, args, options["queue"]) for name, args, options in sent
            if name.endswith("child_start")] == [
        ("orchestrator.tasks.child_start", (call.id,), "orchestrator")]


def test_each_message_creates_one_level_and_a_replay_creates_nothing(team):
    chain(team, 3)
    top = run_start(version=team.workflows.get(name="w0").active_version, input={}, actor=SETUP)
    call = top.steps.get(name="call")

    assert child_run_start(parent_step_id=call.id) is True
    assert child_run_start(parent_step_id=call.id) is False  # the same message, delivered again
    child = Run.objects.get(parent_step=call)
    assert child.input == {"level": 1} and not Run.objects.filter(parent_step__run=child).exists()
    assert Event.objects.filter(run=top, kind="step.child_started",
                                payload__child_run=str(child.id)).count() == 1


def test_a_child_deeper_than_the_limit_fails_its_step_permanent(team, settings):
    settings.STEPWISE_MAX_CHILD_DEPTH = 3
    chain(team)
    top = run_start(version=team.workflows.get(name="w0").active_version, input={}, actor=SETUP)

    start_children(top, depth=LEVELS)

    runs = [top]
    while child := Run.objects.filter(parent_step__run=runs[-1]).first():
        runs.append(child)
    assert len(runs) == 4  # the top-level run and three levels of children
    deepest = runs[-1].steps.get(name="call")
    assert deepest.state == "failed" and deepest.error["class"] == "permanent"
    assert "3 deep (STEPWISE_MAX_CHILD_DEPTH)" in deepest.error["message"]
    assert "'w4'" in deepest.error["message"]
    assert Run.objects.get(pk=runs[-1].pk).state == "failed"


def test_the_reaper_creates_a_child_whose_message_was_lost(team, settings, move_clock):
    chain(team, 2)
    top = run_start(version=team.workflows.get(name="w0").active_version, input={}, actor=SETUP)
    assert reaper.reap()["children_started"] == 0  # its message may still be on its way

    move_clock(settings.STEPWISE_REDISPATCH_AFTER_S + 1)

    assert reaper.reap()["children_started"] == 1
    assert Run.objects.filter(parent_step__run=top).count() == 1
    assert reaper.reap()["children_started"] == 0
