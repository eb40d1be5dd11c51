"""Moving unfinished runs to another version (services/moves.py): the dry run's mapping and each
refusal, the move itself (pin, steps, event, ledger), a gate asked again, and who may move."""
import copy

import pytest

from approvals.models import ApprovalRequest
from audit.models import AuditEntry
from audit.timeline import run_timeline
from orchestrator.engine.errors import Forbidden, InputInvalid
from orchestrator.engine.services.kinds.human_gate import approval_grant
from orchestrator.engine.services.kinds.worker import step_execute
from orchestrator.engine.services.moves import runs_move, runs_move_plan
from orchestrator.engine.services.runs import run_cancel, run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Event, Role, Run, StepState, Workflow
from tests.factories import SETUP, TeamFactory, member

pytestmark = pytest.mark.django_db

RELEASE = {
    "name": "release",
    "input_schema": {"type": "object", "required": ["title"],
                     "properties": {"title": {"type": "string"}}},
    "steps": [
        {"name": "prepare", "type": "tool", "tool": "core.echo", "params": {"title": "{{ input.title }}"}},
        {"name": "approve", "type": "human_gate", "after": ["prepare"], "approvers": "leads"},
        {"name": "publish", "type": "tool", "tool": "core.echo", "after": ["approve"],
         "params": {"title": "{{ steps.prepare.output.title }}"}},
    ],
}


def variant(*, steps: dict | None = None, add: list | None = None, drop: tuple = (),
            **top) -> dict:
    """RELEASE with steps changed ({name: fields}), added, dropped, or top-level keys set."""
    definition = copy.deepcopy(RELEASE)
    definition.update(top)
    for step in definition["steps"]:
        step.update((steps or {}).get(step["name"], {}))
    definition["steps"] = [s for s in definition["steps"] if s["name"] not in drop] + (add or [])
    return definition


ANNOUNCE = {"name": "announce", "type": "tool", "tool": "core.echo", "after": ["publish"],
            "params": {"said": "{{ steps.publish.output.title }}"}}


@pytest.fixture
def operator(team):
    return member(team, "operator", role=Role.OPERATOR)


@pytest.fixture
def v1(team):
    return workflow_save(team=team, definition=RELEASE, actor=SETUP)[0]


def at_gate(version, operator, title: str = "Spring release") -> Run:
    """A run of `version` that has run its first step and waits at its gate."""
    run = run_start(version=version, input={"title": title}, actor=operator)
    for step in run.steps.filter(state=StepState.QUEUED):
        step_execute(step_id=step.id, worker="test")
    run = Run.objects.get(pk=run.pk)
    assert run.state == "waiting", run.state
    return run


def save(team, definition):
    return workflow_save(team=team, definition=definition, actor=SETUP)[0]


def refusals(plan) -> set[str]:
    return {r["code"] for r in plan.refusals}


def test_the_dry_run_maps_each_step_by_name_and_changes_nothing(team, v1, operator):
    run = at_gate(v1, operator)
    v2 = save(team, variant(add=[ANNOUNCE]))
    [plan] = runs_move_plan(run_ids=[run.id], version=v2, actor=operator)
    assert plan.movable and not plan.refusals
    mapping = {s.name: (s.change, s.state, s.kind_from, s.kind_to, s.definition) for s in plan.steps}
    assert mapping == {
        "prepare": ("kept", "completed", "tool", "tool", "same"),
        "approve": ("kept", "waiting", "human_gate", "human_gate", "same"),
        "publish": ("kept", "blocked", "tool", "tool", "same"),
        "announce": ("added", "", "", "tool", ""),
    }
    assert plan.gates_asked_again == []
    assert Run.objects.get(pk=run.pk).version == v1 and not run.steps.filter(name="announce").exists()


def test_a_move_repoints_the_run_adds_the_new_step_and_is_audited(team, v1, operator):
    run = at_gate(v1, operator)
    approval = ApprovalRequest.objects.get(run=run)
    v2 = save(team, variant(add=[ANNOUNCE]))
    [outcome] = runs_move(run_ids=[run.id], version=v2, actor=operator, reason="announce releases")
    assert outcome.movable
    run = Run.objects.get(pk=run.pk)
    assert run.version == v2 and run.state == "waiting"
    steps = {s.name: (s.state, s.position) for s in run.steps.all()}
    assert steps == {"prepare": ("completed", 0), "approve": ("waiting", 1),
                     "publish": ("blocked", 2), "announce": ("blocked", 3)}
    # The gate's action is the same: its request stands.
    assert list(ApprovalRequest.objects.filter(run=run).values_list("id", "state")) == [(approval.id, "pending")]
    moved = Event.objects.get(run=run, kind="run.moved")
    assert moved.actor == "user:operator"
    assert (moved.payload["from"]["version"], moved.payload["to"]["version"]) == (1, 2)
    assert moved.payload["reason"] == "announce releases"
    assert {"name": "announce", "change": "added", "outcome": "added: runs when the steps before it have"} \
        in moved.payload["steps"]
    entry = AuditEntry.objects.filter(action="run.moved").latest("id")
    assert entry.actor == "user:operator" and entry.data["reason"] == "announce releases"
    story = [line.text for line in run_timeline(run.id).decisions]
    assert "Moved from version 1 to version 2 by user:operator: announce releases." in story


def test_a_gate_whose_action_changes_asks_a_new_decision(team, v1, operator):
    run = at_gate(v1, operator)
    old = ApprovalRequest.objects.get(run=run)
    v2 = save(team, variant(steps={"publish": {"params": {"title": "{{ steps.prepare.output.title }}",
                                                          "channel": "news"}}}))
    [plan] = runs_move_plan(run_ids=[run.id], version=v2, actor=operator)
    assert plan.movable and plan.gates_asked_again == ["approve"]
    runs_move(run_ids=[run.id], version=v2, actor=operator, reason="publish to the news channel")
    old.refresh_from_db()
    new = ApprovalRequest.objects.filter(run=run).latest("id")
    assert old.state == "cancelled"
    assert new.id != old.id and new.state == "pending" and new.proposal_hash != old.proposal_hash
    assert new.action["params"] == {"title": "Spring release", "channel": "news"}
    kinds = list(Event.objects.filter(run=run).order_by("id").values_list("kind", flat=True))
    assert kinds[-3:] == ["run.moved", "approval.cancelled", "approval.requested"]


def test_a_removed_step_that_never_started_is_dropped(team, v1, operator):
    run = at_gate(v1, operator)
    v2 = save(team, variant(drop=("publish",)))
    runs_move(run_ids=[run.id], version=v2, actor=operator, reason="nothing to publish")
    assert set(Run.objects.get(pk=run.pk).steps.values_list("name", flat=True)) == {"prepare", "approve"}


@pytest.mark.parametrize("definition, code", [
    # The step the run completed is gone, or is of another kind, or its output fails the schema.
    (variant(drop=("prepare",), steps={"approve": {"after": []},
                                       "publish": {"params": {"title": "{{ input.title }}"}}}),
     "step_missing"),
    (variant(steps={"prepare": {"type": "agent", "model": "fast", "prompt": "p", "tool": None,
                                "params": None, "output_schema": {"type": "object"}}}), "kind_changed"),
    (variant(steps={"prepare": {"output_schema": {"type": "object", "required": ["title", "id"],
                                                  "properties": {"title": {"type": "string"},
                                                                 "id": {"type": "string"}}}}}),
     "output_invalid"),
    # A step added before the gate the run waits at would run after it.
    (variant(steps={"approve": {"after": ["check"]}},
             add=[{"name": "check", "type": "tool", "tool": "core.echo", "after": ["prepare"]}]), "order"),
    # The run's input fails the new input schema.
    (variant(input_schema={"type": "object", "required": ["title", "owner"],
                           "properties": {"title": {"type": "string"}, "owner": {"type": "string"}}}),
     "input_invalid"),
])
def test_what_the_target_would_reinterpret_is_refused_with_its_reason(team, v1, operator, definition, code):
    run = at_gate(v1, operator)
    target = save(team, {k: v for k, v in definition.items() if v is not None} | {
        "steps": [{k: v for k, v in s.items() if v is not None} for s in definition["steps"]]})
    [plan] = runs_move_plan(run_ids=[run.id], version=target, actor=operator)
    assert not plan.movable and refusals(plan) == {code}, plan.refusals
    [outcome] = runs_move(run_ids=[run.id], version=target, actor=operator, reason="try")
    assert not outcome.movable
    run = Run.objects.get(pk=run.pk)
    assert run.version == v1 and not Event.objects.filter(run=run, kind="run.moved").exists()


def test_a_step_put_behind_a_gate_already_approved_is_refused(team, operator):
    """The approval bound the steps it guarded then: a step the target adds behind the gate
    would run on an approval nobody gave for it."""
    settle = {"name": "settle", "type": "wait", "signal": "settled", "after": ["publish"]}
    run = at_gate(save(team, variant(add=[settle])), operator)
    lead = member(team, "lead", groups=("leads",))
    approval = ApprovalRequest.objects.get(run=run)
    approval_grant(approval_id=approval.id, user=lead, proposal_hash=approval.proposal_hash)
    step_execute(step_id=run.steps.get(name="publish").id, worker="test")
    assert Run.objects.get(pk=run.pk).state == "waiting"  # for the signal, the gate approved
    refund = {"name": "refund", "type": "tool", "tool": "core.echo", "after": ["approve"],
              "params": {"amount": 100}}
    [plan] = runs_move_plan(run_ids=[run.id], version=save(team, variant(add=[settle, refund])),
                            actor=operator)
    assert refusals(plan) == {"approval_scope"}
    assert "puts refund behind it too, which nobody approved" in plan.refusals[0]["message"]


def test_a_run_with_a_step_in_flight_is_refused(team, v1, operator):
    run = run_start(version=v1, input={"title": "t"}, actor=operator)
    assert run.steps.get(name="prepare").state == "queued"
    [plan] = runs_move_plan(run_ids=[run.id], version=save(team, variant(add=[ANNOUNCE])), actor=operator)
    assert refusals(plan) == {"in_flight"}
    assert "'prepare' is queued on a worker" in plan.refusals[0]["message"]


def test_a_finished_run_another_workflows_version_and_the_same_version_are_refused(team, v1, operator):
    cancelled = run_start(version=v1, input={"title": "t"}, actor=operator)
    run_cancel(run_id=cancelled.id, actor=operator)
    waiting = at_gate(v1, operator)
    other = save(team, {**RELEASE, "name": "other"})
    v2 = save(team, variant(add=[ANNOUNCE]))
    assert refusals(runs_move_plan(run_ids=[cancelled.id], version=v2, actor=operator)[0]) == {"finished"}
    assert refusals(runs_move_plan(run_ids=[waiting.id], version=other, actor=operator)[0]) == {"other_workflow"}
    assert refusals(runs_move_plan(run_ids=[waiting.id], version=v1, actor=operator)[0]) == {"same_version"}


def test_an_evaluations_sandboxed_run_is_not_moved(team, v1, operator):
    run = run_start(version=v1, input={"title": "t"}, actor=SETUP, capacity="evaluation",
                    sandbox={"purpose": "evaluation"})
    assert run.state == "running"
    [plan] = runs_move_plan(run_ids=[run.id], version=save(team, variant(add=[ANNOUNCE])), actor=operator)
    assert refusals(plan) == {"sandboxed"}


def test_a_waiting_step_whose_definition_changed_is_refused(team, operator):
    definition = {"name": "order", "input_schema": {"type": "object"},
                  "steps": [{"name": "pay", "type": "wait", "signal": "paid"}]}
    run = run_start(version=save(team, definition), input={}, actor=operator)
    assert run.steps.get(name="pay").state == "waiting"
    changed = save(team, {**definition, "steps": [{"name": "pay", "type": "wait", "signal": "settled"}]})
    assert refusals(runs_move_plan(run_ids=[run.id], version=changed, actor=operator)[0]) == {"waiting_changed"}


def test_a_target_that_drops_a_mandatory_gate_is_refused_unless_an_owner_moves(team, operator):
    gated = variant(steps={"approve": {"mandatory": True, "guards": ["publish"]}})
    v1 = save(team, gated)
    run = at_gate(v1, operator)
    Workflow.objects.filter(pk=v1.workflow_id).update(publish_on_save=False)
    owner = member(team, "owner", role=Role.OWNER)
    draft = workflow_save(team=team, actor=owner, definition=variant(
        drop=("approve",), steps={"publish": {"after": ["prepare"]}}))[0]
    [plan] = runs_move_plan(run_ids=[run.id], version=draft, actor=operator)
    assert "version_refused" in refusals(plan)
    assert any("mandatory gate" in r["message"] for r in plan.refusals)
    runs_move(run_ids=[run.id], version=draft, actor=operator, reason="skip the approval")
    assert Run.objects.get(pk=run.pk).version == v1
    # The owner may waive the gate at a start, and so at a move; the waiting gate is then
    # the one refusal left (it is missing from the target).
    assert refusals(runs_move_plan(run_ids=[run.id], version=draft, actor=owner)[0]) == {"step_missing"}


@pytest.mark.parametrize("role", [Role.MEMBER, Role.EDITOR])
def test_members_and_editors_may_not_move_runs(team, v1, operator, role):
    run = at_gate(v1, operator)
    v2 = save(team, variant(add=[ANNOUNCE]))
    user = member(team, "someone", role=role)
    with pytest.raises(Forbidden):
        runs_move_plan(run_ids=[run.id], version=v2, actor=user)
    with pytest.raises(Forbidden):
        runs_move(run_ids=[run.id], version=v2, actor=user, reason="because")
    assert Run.objects.get(pk=run.pk).version == v1


def test_another_teams_run_is_not_found(team, v1, operator):
    run = at_gate(v1, operator)
    v2 = save(team, variant(add=[ANNOUNCE]))
    stranger = member(TeamFactory(slug="elsewhere"), "stranger", role=Role.OWNER)
    with pytest.raises(Run.DoesNotExist):
        runs_move(run_ids=[run.id], version=v2, actor=stranger, reason="mine now")
    assert Run.objects.get(pk=run.pk).version == v1


def test_a_move_needs_a_reason(team, v1, operator):
    run = at_gate(v1, operator)
    with pytest.raises(InputInvalid):
        runs_move(run_ids=[run.id], version=save(team, variant(add=[ANNOUNCE])), actor=operator, reason=" ")
