"""Children end with their parent: every way a step that owns work can end, times every kind of
work it owns (docs/failure-semantics.md, "Owned work ends with its owner").

A sub-workflow step owns its child run (and, through it, the child's own children and open
approvals), a map step owns its items, a human gate owns its approval request. When the owning
step ends other than completed — its own timeout, or its run cancelled, failed, timed out or
compensating — everything it owns is stopped, once, in the transaction that ended it; nothing it
owned acts afterwards. The runs are driven in this process through the services a worker and the
reaper call, with a controlled clock; no message is consumed (the test transaction never
commits), so nothing races the assertions.
"""
from datetime import timedelta

import pytest

from approvals.models import ApprovalRequest
from audit.models import AuditEntry
from orchestrator.engine import clock
from orchestrator.engine.keys import idempotency_key_for
from orchestrator.engine.retry import StepError
from orchestrator.engine.services import reaper
from orchestrator.engine.services.kinds import map_step
from orchestrator.engine.services.kinds.worker import Usage, step_claim, step_fail, step_succeed
from orchestrator.engine.services.runs import run_cancel, run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Effect, MapItem, Run, StepRun
from tests.factories import SETUP
from tests.support.children import start_children

pytestmark = pytest.mark.django_db

GATE = {"type": "human_gate", "approvers": "leads", "timeout_s": 3600}
OWNERS = {
    "child run": {"name": "owner", "type": "sub_workflow", "workflow": "child", "input": {},
                  "timeout_s": 60},
    "map items": {"name": "owner", "type": "map", "over": "input.items", "timeout_s": 60,
                  "item": {"type": "tool", "tool": "core.echo"}},
    "approval": {"name": "owner", **GATE, "timeout_s": 60},
}
WAYS = ["its own timeout", "run cancelled", "run failed", "run timed out", "run compensating"]


@pytest.fixture
def at(monkeypatch):
    """Move the engine's clock to `seconds` past the test's start. It stands still until moved, so
    the deadlines set while the runs start are measured from the same instant however slow the
    machine is."""
    start = clock.now()

    def move(seconds: float) -> None:
        monkeypatch.setattr(clock, "_source", lambda: start + timedelta(seconds=seconds))

    move(0)
    return move


def save(team, definition: dict):
    return workflow_save(team=team, definition={"input_schema": {"type": "object"}, **definition},
                         actor=SETUP)[0]


def parent_run(team, owned: str, way: str) -> Run:
    """A run of: the owning step, `pay` (an effect with a compensation) and `boom`."""
    save(team, {"name": "grandchild", "steps": [{"name": "ask", **GATE}]})
    save(team, {"name": "child", "steps": [
        {"name": "ask", **GATE},
        {"name": "grand", "type": "sub_workflow", "workflow": "grandchild", "input": {}}]})
    definition = {"name": "parent", "steps": [
        OWNERS[owned],
        {"name": "pay", "type": "tool", "tool": "core.echo", "side_effect": True,
         "compensate": {"tool": "core.echo", "params": {"undo": True}}},
        {"name": "boom", "type": "tool", "tool": "core.echo"}]}
    if way == "run timed out":
        definition["budget"] = {"max_duration_s": 30, "on_duration": "fail"}
    run = run_start(version=save(team, definition), input={"items": [1, 2, 3]}, actor=SETUP)
    start_children(run)
    return run


def finish_worker_step(run: Run, name: str, *, error: StepError | None = None) -> None:
    """What a worker does with a queued step: claim it, then succeed or fail it."""
    step = run.steps.get(name=name)
    claim = step_claim(step_id=step.id, worker="test")
    if error:
        step_fail(step_id=step.id, attempt=claim.attempt, error=error, usage=Usage(), worker="test")
        return
    if name == "pay":  # what the effect ledger records for a call that happened
        Effect.objects.create(key=idempotency_key_for(run.id, name), run=run, step=step,
                              tool="core.echo", status=Effect.Status.SUCCEEDED, result={})
    step_succeed(step_id=step.id, attempt=claim.attempt, output={}, usage=Usage(), worker="test")


def end_the_owner(run: Run, way: str, at) -> None:
    boom = StepError("permanent", "boom")
    if way == "its own timeout":
        at(61)
        reaper.reap()
    elif way == "run cancelled":
        run_cancel(run_id=run.id, actor=SETUP)
    elif way == "run failed":
        finish_worker_step(run, "boom", error=boom)
    elif way == "run timed out":
        at(31)
        reaper.reap()
    elif way == "run compensating":
        finish_worker_step(run, "pay")
        finish_worker_step(run, "boom", error=boom)
        assert Run.objects.get(pk=run.pk).state == "compensating"


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("owned", list(OWNERS))
def test_work_a_step_owns_is_stopped_when_the_step_ends_other_than_completed(team, at, owned, way):
    run = parent_run(team, owned, way)
    owner = run.steps.get(name="owner")
    assert owner.state == "waiting"

    end_the_owner(run, way, at)

    owner.refresh_from_db()
    assert owner.state in ("timed_out", "cancelled"), owner.state
    if owned == "child run":
        child = Run.objects.get(parent_step=owner)
        grandchild = Run.objects.get(parent_step__run=child)
        for stopped in (child, grandchild):
            assert stopped.state == "cancelled"
            assert not stopped.steps.exclude(state__in=["cancelled", "completed", "skipped"]).exists()
            assert ApprovalRequest.objects.get(run=stopped).state == "cancelled"
        why = AuditEntry.objects.get(run_id=child.id, action="run.cancelling")
        assert f"parent step 'owner' of run {run.id} ended {owner.state}" in why.payload
    elif owned == "map items":
        items = MapItem.objects.filter(step=owner)
        assert all(i.done and i.error["class"] == "cancelled" for i in items)
        verdicts = {map_step.map_item_run(step_id=owner.id, index=i.index).verdict for i in items}
        assert verdicts == {map_step.SKIPPED}  # a message still in flight runs nothing
    else:
        expected = "expired" if way == "its own timeout" else "cancelled"
        assert ApprovalRequest.objects.get(step=owner).state == expected


def test_a_child_that_already_finished_stays_finished(team):
    save(team, {"name": "quick", "steps": [{"name": "only", "type": "tool", "tool": "core.echo"}]})
    parent = run_start(version=save(team, {"name": "parent", "steps": [
        {"name": "owner", "type": "sub_workflow", "workflow": "quick", "input": {}}]}),
        input={}, actor=SETUP)
    [child] = start_children(parent)
    finish_worker_step(child, "only")
    assert Run.objects.get(pk=child.pk).state == "completed"  # its parent has not heard yet

    run_cancel(run_id=parent.id, actor=SETUP)

    assert Run.objects.get(pk=parent.pk).state == "cancelled"
    assert Run.objects.get(pk=child.pk).state == "completed"


def test_a_completed_owner_releases_nothing(team):
    version = save(team, {"name": "fan", "steps": [OWNERS["map items"]]})
    run = run_start(version=version, input={"items": [1, 2]}, actor=SETUP)
    owner = run.steps.get(name="owner")
    for index in (0, 1):
        assert map_step.map_item_run(step_id=owner.id, index=index).verdict == map_step.DONE
    assert map_step.map_join(step_id=owner.id)

    owner.refresh_from_db()
    assert owner.state == "completed" and owner.output == [{}, {}]
    assert not StepRun.objects.filter(run=run, state="cancelled").exists()
