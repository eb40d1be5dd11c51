"""Publishing, archiving and mandatory gates (issue 10, part 4).

The attack these reproduce: an editor saves a version of a workflow without its approval gate,
and the next run sends its e-mail unapproved. A gate marked `mandatory` guards named steps; a
version that drops or weakens it becomes active only through an owner.
"""
import copy

import pytest

from audit.models import AuditEntry
from orchestrator.engine.definitions.mandatory_gates import mandatory_gate_problems, weakened_gates
from orchestrator.engine.errors import Forbidden, NotAllowed
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import (
    workflow_archive,
    workflow_publish,
    workflow_restore,
    workflow_save,
)
from orchestrator.models import Role, Run, StepState, Workflow
from tests.conftest import client_for
from tests.factories import SETUP, member

pytestmark = pytest.mark.django_db

GATED = {
    "name": "notify",
    "input_schema": {"type": "object"},
    "steps": [
        {"name": "draft", "type": "tool", "tool": "core.echo", "params": {"to": "a@example.com"}},
        {"name": "approve", "type": "human_gate", "after": ["draft"], "approvers": "support_leads",
         "required_approvals": 2, "mandatory": True, "guards": ["send"]},
        {"name": "send", "type": "tool", "tool": "core.echo", "after": ["approve"],
         "side_effect": True, "params": {"to": "a@example.com", "body": "refund granted"}},
    ],
}


def without_gate() -> dict:
    """GATED with its gate removed and the e-mail sent straight after the draft."""
    definition = copy.deepcopy(GATED)
    definition["steps"] = [definition["steps"][0], {**definition["steps"][2], "after": ["draft"]}]
    return definition


def changed(**gate) -> dict:
    definition = copy.deepcopy(GATED)
    definition["steps"][1].update(gate)
    for key, value in gate.items():
        if value is None:
            del definition["steps"][1][key]
    return definition


@pytest.fixture
def editor(team):
    return member(team, "editor", role=Role.EDITOR)


@pytest.fixture
def owner(team):
    return member(team, "owner", role=Role.OWNER)


@pytest.fixture
def gated(team):
    version, _ = workflow_save(team=team, definition=GATED, actor=SETUP)
    return version.workflow


# --- the definition's own marks ---------------------------------------------------------------


def test_a_mandatory_gate_must_name_steps_that_surely_wait_for_it():
    definition = copy.deepcopy(GATED)
    definition["steps"][1]["guards"] = ["draft", "nowhere"]
    assert [(p.path, p.message[:30]) for p in mandatory_gate_problems(definition)] == [
        ("steps[1].guards[0]", "step 'draft' does not surely w"),
        ("steps[1].guards[1]", "unknown step 'nowhere' in guar"),
    ]
    assert mandatory_gate_problems(GATED) == []


def test_saving_a_mandatory_gate_without_guards_is_a_400_with_its_path(api, team):
    definition = changed(guards=None)
    response = api.post("/api/v1/workflows/", {"definition": definition, "team": team.slug},
                        format="json")
    assert response.status_code == 400
    assert {"path": "steps[1].guards",
            "message": "a mandatory gate names the high-risk steps it guards"} in response.json()["errors"]


# --- what counts as weakening -------------------------------------------------------------------


@pytest.mark.parametrize("after, path", [
    (without_gate(), "steps"),
    (changed(mandatory=False), "steps[1].mandatory"),
    (changed(required_approvals=1), "steps[1].required_approvals"),
    (changed(required_approvals={"high": 3}), "steps[1].required_approvals"),
    (changed(approvers="everyone"), "steps[1].approvers"),
    (changed(self_approval_up_to="critical"), "steps[1].self_approval_up_to"),
    (changed(when="input.urgent == true"), "steps[1].when"),
    (changed(guards=["draft"]), "steps[1].guards"),
])
def test_a_version_that_weakens_a_mandatory_gate_is_named_by_path(after, path):
    assert path in [p.path for p in weakened_gates(GATED, after)]


def test_moving_the_guarded_step_off_the_gates_path_is_weakening():
    after = copy.deepcopy(GATED)
    after["steps"][2]["after"] = ["draft"]
    assert [p.path for p in weakened_gates(GATED, after)] == ["steps[2].after"]
    after["steps"][2]["after"], after["steps"][2]["join"] = ["draft", "approve"], "any"
    assert [p.path for p in weakened_gates(GATED, after)] == ["steps[2].after"]


@pytest.mark.parametrize("after", [
    GATED,
    changed(required_approvals=3),
    changed(instructions="Check the amount."),
])
def test_keeping_or_strengthening_a_mandatory_gate_is_not_weakening(after):
    assert weakened_gates(GATED, after) == []


# --- the attack, through the API ----------------------------------------------------------------


def test_an_editor_cannot_save_a_version_that_drops_the_mandatory_gate(team, gated, editor):
    response = client_for(editor).post(
        "/api/v1/workflows/", {"definition": without_gate(), "team": team.slug}, format="json")
    assert response.status_code == 403
    assert {"path": "steps", "message": "mandatory gate 'approve' was removed (or renamed)"} in \
        response.json()["errors"]
    assert gated.versions.count() == 1  # nothing saved
    # ... so the next run still waits for the gate before the e-mail.
    started = client_for(editor).post(f"/api/v1/workflows/{gated.name}/runs/",
                                      {"input": {}}, format="json")
    assert started.status_code == 202
    run = Run.objects.get(pk=started.json()["id"])
    steps = dict(run.steps.values_list("name", "state"))
    assert steps["send"] == StepState.BLOCKED and "approve" in steps


def test_an_editors_draft_without_the_gate_runs_only_once_an_owner_publishes_it(
        team, gated, editor, owner):
    Workflow.objects.filter(pk=gated.pk).update(publish_on_save=False)
    draft, created = workflow_save(team=team, definition=without_gate(), actor=editor)
    assert created and Workflow.objects.get(pk=gated.pk).active_version.number == 1
    # The editor can neither publish it nor start it by number; the API starts version 1.
    with pytest.raises(Forbidden) as refused:
        workflow_publish(workflow_id=gated.id, number=draft.number, actor=editor)
    assert refused.value.problems[0]["path"] == "steps"
    by_number = client_for(editor).post(f"/api/v1/workflows/{gated.name}/runs/",
                                        {"input": {}, "version": 2}, format="json")
    assert by_number.status_code == 403
    assert by_number.json()["errors"][0]["path"] == "version.steps"
    run = run_start(version=Workflow.objects.get(pk=gated.pk).active_version, input={}, actor=editor)
    assert run.version.number == 1
    # The owner's publish is the approval, recorded in the ledger with what it waived.
    workflow_publish(workflow_id=gated.id, number=draft.number, actor=owner)
    entry = AuditEntry.objects.filter(action="workflow.published").latest("id")  # on PostgreSQL the chain seals (numbers) entries later
    assert (entry.outcome, entry.actor, entry.workflow_version) == ("waived", "user:owner", 2)
    assert "mandatory gate 'approve' was removed" in entry.data["gates_waived"][0]


def test_an_owner_may_save_a_version_that_drops_the_gate(team, gated, owner):
    version, created = workflow_save(team=team, definition=without_gate(), actor=owner)
    assert created and Workflow.objects.get(pk=gated.pk).active_version == version


def test_saving_a_draft_does_not_change_what_runs(team, gated, editor):
    Workflow.objects.filter(pk=gated.pk).update(publish_on_save=False)
    workflow_save(team=team, definition=changed(instructions="v2"), actor=editor)
    started = client_for(editor).post(f"/api/v1/workflows/{gated.name}/runs/", {"input": {}},
                                      format="json")
    assert started.json()["version"] == 1
    workflow_publish(workflow_id=gated.id, number=2, actor=editor)  # not weakening: editors may
    started = client_for(editor).post(f"/api/v1/workflows/{gated.name}/runs/", {"input": {}},
                                      format="json")
    assert started.json()["version"] == 2


def test_a_trigger_pinned_to_a_version_without_the_gate_is_refused_at_firing(team, gated, owner):
    from triggers.models import Firing
    from triggers.services.config import trigger_create
    from triggers.services.firing import trigger_fire_api

    Workflow.objects.filter(pk=gated.pk).update(publish_on_save=False)
    workflow_save(team=team, definition=without_gate(), actor=owner)  # a draft, never published
    trigger, _ = trigger_create(team=team, kind="api", name="pinned", workflow=gated.name,
                                workflow_version=2, actor=owner)
    outcome = trigger_fire_api(trigger_id=trigger.id, payload={}, key="k1", actor=SETUP)
    assert outcome.run is None and not Firing.objects.filter(run__isnull=False).exists()


def test_an_archived_workflow_starts_no_run_until_restored(team, gated, editor):
    workflow_archive(workflow_id=gated.id, actor=editor)
    response = client_for(editor).post(f"/api/v1/workflows/{gated.name}/runs/", {"input": {}},
                                       format="json")
    assert response.status_code == 409
    assert response.json()["errors"] == [{"path": "workflow", "message": "archived"}]
    with pytest.raises(NotAllowed):
        workflow_publish(workflow_id=gated.id, number=1, actor=editor)
    workflow_restore(workflow_id=gated.id, actor=editor)
    run = run_start(version=gated.versions.get(number=1), input={}, actor=editor)
    assert run.steps.get(name="draft").state == StepState.QUEUED
    actions = list(AuditEntry.objects.filter(action__startswith="workflow.").values_list(
        "action", flat=True).order_by("sequence", "id"))
    assert actions[-2:] == ["workflow.archived", "workflow.restored"]
