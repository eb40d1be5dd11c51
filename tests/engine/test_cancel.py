"""Cancelling runs in every state the vocabulary names: a clear answer, never a 500.

A `compensating` run is undoing its effects and ends by itself, so a cancel is refused (409);
a parent whose child is compensating is cancelled, and the child goes on undoing its effects.
The runs are driven in this process through the services a worker calls; a real worker that
the same test process started for other tests may take a step or the compensation too.
"""
import time

import pytest

from orchestrator.engine.services.kinds.worker import step_execute
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.engine.states import RUN_CANCELLABLE, RUN_TERMINAL, RunState
from orchestrator.models import Run
from tests.conftest import client_for
from tests.factories import SETUP, member
from tests.support.children import start_children
from tests.support.http_sink import HttpSink

pytestmark = pytest.mark.django_db(transaction=True)


def saga(sink_url: str) -> dict:
    """pay (compensated by a refund), then ship, which the remote refuses."""
    post = {"type": "tool", "tool": "http.request", "side_effect": True}
    return {"name": "saga", "input_schema": {"type": "object"}, "steps": [
        {**post, "name": "pay", "params": {"method": "POST", "url": f"{sink_url}/pay"},
         "compensate": {"tool": "http.request", "params": {"method": "POST", "url": f"{sink_url}/refund"}}},
        {**post, "name": "ship", "after": ["pay"], "params": {"method": "POST", "url": f"{sink_url}/ship"}}]}


def drive(run: Run) -> Run:
    """Run queued steps in this process, as a worker would, until the run stops running.

    A real worker of this test process may take a step first (the claim is exclusive): then
    this waits for it."""
    deadline = time.monotonic() + 30
    while (run := Run.objects.get(pk=run.pk)).state == RunState.RUNNING:
        assert time.monotonic() < deadline, f"run {run.id} still running"
        if step := run.steps.filter(state="queued").first():
            step_execute(step_id=step.id, worker="test")
        else:
            time.sleep(0.05)
    return run


def hold_refunds(sink: HttpSink) -> None:
    """Keep every refund call unanswered until the sink closes: a real worker of this test
    process (the browser and live tests start them for the session) that takes the
    compensation is still undoing the payment when the test looks, as a slow remote would."""
    sink.hold("/refund")


@pytest.fixture
def operator_api(team):
    return client_for(member(team, "op", role="operator"))


def test_cancelling_a_compensating_run_is_a_409_not_a_500(team, operator_api):
    with HttpSink() as sink:
        hold_refunds(sink)
        sink.fail_next(1, 422, path="/ship")
        version, _ = workflow_save(team=team, definition=saga(sink.url), actor=SETUP)
        run = drive(run_start(version=version, input={}, actor=SETUP))
        assert run.state == RunState.COMPENSATING  # the refund waits for a compensating worker

        response = operator_api.post(f"/api/v1/runs/{run.id}/cancel/")

        assert response.status_code == 409, response.content
        assert "undoing its effects" in response.json()["errors"][0]["message"]
        assert Run.objects.get(pk=run.pk).state == RunState.COMPENSATING


def test_cancelling_a_parent_whose_child_is_compensating_cancels_the_parent_only(team, operator_api):
    with HttpSink() as sink:
        hold_refunds(sink)
        sink.fail_next(1, 422, path="/ship")
        workflow_save(team=team, definition=saga(sink.url), actor=SETUP)
        parent_version, _ = workflow_save(team=team, definition={
            "name": "parent", "input_schema": {"type": "object"},
            "steps": [{"name": "child", "type": "sub_workflow", "workflow": "saga", "input": {}}]},
            actor=SETUP)
        parent = run_start(version=parent_version, input={}, actor=SETUP)
        [child] = start_children(parent)
        child = drive(child)
        assert child.state == RunState.COMPENSATING

        response = operator_api.post(f"/api/v1/runs/{parent.id}/cancel/")

        assert response.status_code == 202, response.content
        assert Run.objects.get(pk=parent.pk).state == RunState.CANCELLED
        assert Run.objects.get(pk=child.pk).state == RunState.COMPENSATING


@pytest.mark.parametrize("state", list(RunState))
def test_every_state_is_either_cancellable_ended_or_explained(state):
    """The vocabulary leaves no state a cancel does not know what to do with."""
    assert (state in RUN_CANCELLABLE) + (state in RUN_TERMINAL) + (
        state in (RunState.CANCELLING, RunState.COMPENSATING)) == 1
