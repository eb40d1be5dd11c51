"""Forking a run (`services.forks.run_fork`): what is carried over, what runs again, what the
fork may change and who may fork. The effect a fork does or does not perform again is shown on
real workers in tests/integration/test_forks.py.

Steps are finished in this process through the services a worker calls; the test transaction
never commits, so no message is consumed.
"""
from decimal import Decimal

import pytest

from orchestrator.engine.errors import InputInvalid, NotAllowed
from orchestrator.engine.keys import idempotency_key_for
from orchestrator.engine.selectors import effect_key_of
from orchestrator.engine.services.forks import run_fork
from orchestrator.engine.services.kinds.worker import Usage, step_claim, step_succeed
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Effect, Event, Role, Run, StepRun
from tests.conftest import client_for
from tests.factories import SETUP, TeamFactory, member

pytestmark = pytest.mark.django_db

CHAIN = {
    "name": "chain",
    "input_schema": {"type": "object", "required": ["topic"],
                     "properties": {"topic": {"type": "string", "minLength": 1}}},
    "steps": [
        {"name": "research", "type": "tool", "tool": "core.echo"},
        {"name": "draft", "type": "tool", "tool": "core.echo", "after": ["research"],
         "input_schema": {"type": "object", "properties": {
             "research": {"type": "object", "required": ["notes"]}}}},
        {"name": "send", "type": "tool", "tool": "core.echo", "after": ["draft"],
         "side_effect": True},
    ],
}
# A mandatory gate that guards `send` from two steps away: a fork from `send` carries it.
GATED = {
    "name": "gated",
    "input_schema": {"type": "object"},
    "steps": [
        {"name": "draft", "type": "tool", "tool": "core.echo"},
        {"name": "approve", "type": "human_gate", "after": ["draft"], "approvers": "support_leads",
         "mandatory": True, "guards": ["send"]},
        {"name": "prepare", "type": "tool", "tool": "core.echo", "after": ["approve"]},
        {"name": "send", "type": "tool", "tool": "core.echo", "after": ["prepare"],
         "side_effect": True},
    ],
}
COST = Decimal("0.25")


def finish(run: Run, name: str, output: dict) -> None:
    step = run.steps.get(name=name)
    claim = step_claim(step_id=step.id, worker="test")
    assert claim is not None, f"{name} is {step.state}, not queued"
    step_succeed(step_id=step.id, attempt=claim.attempt, output=output,
                 usage=Usage(tokens_in=100, tokens_out=50, cost_usd=COST, model="fast"),
                 worker="test")


@pytest.fixture
def requester(team):
    return member(team, "requester", role=Role.MEMBER)


@pytest.fixture
def source(team, requester) -> Run:
    """A completed run of CHAIN, each step of which cost COST."""
    version, _ = workflow_save(team=team, definition=CHAIN, actor=SETUP)
    run = run_start(version=version, input={"topic": "refunds"}, actor=requester)
    finish(run, "research", {"notes": "n1"})
    finish(run, "draft", {"text": "d1"})
    finish(run, "send", {"sent": True})
    run = Run.objects.get(pk=run.pk)
    assert (run.state, run.cost_usd) == ("completed", 3 * COST)
    return run


def states(run: Run) -> dict[str, str]:
    return dict(StepRun.objects.filter(run=run).values_list("name", "state"))


def test_a_fork_carries_the_steps_before_its_step_completed_and_free_and_runs_the_rest_again(
        source, requester):
    fork = run_fork(run_id=source.id, step="draft", actor=requester)

    assert states(fork) == {"research": "completed", "draft": "queued", "send": "blocked"}
    carried = StepRun.objects.get(run=fork, name="research")
    assert carried.output == {"notes": "n1"}
    assert (carried.cost_usd, carried.tokens_in, carried.attempts) == (0, 0, 0)
    assert not carried.attempt_records.exists()  # nothing ran it
    fork = Run.objects.get(pk=fork.pk)
    assert (fork.cost_usd, fork.tokens_in, fork.input) == (0, 0, {"topic": "refunds"})
    event = Event.objects.get(run=fork, kind="step.carried")
    assert (event.step.name, event.payload) == ("research", {"from_run": str(source.id)})
    # The fork step reads the carried output as the source's did.
    assert StepRun.objects.get(run=fork, name="draft").input["steps"]["research"]["output"] == {"notes": "n1"}


def test_a_fork_is_linked_to_its_source_both_ways(source, requester):
    fork = run_fork(run_id=source.id, step="send", actor=requester)

    fork = Run.objects.get(pk=fork.pk)
    assert (fork.forked_from_id, fork.fork_step) == (source.id, "send")
    assert list(source.forks.all()) == [fork]
    assert fork.provenance["path"] == "fork" and fork.provenance["forked_from"] == str(source.id)
    assert [p["as"] for p in fork.provenance["people"]] == ["started it, forked it"]
    assert Event.objects.get(run=source, kind="run.fork_started").payload["fork"] == str(fork.id)
    api = client_for(requester)
    detail = api.get(f"/api/v1/runs/{fork.id}/").json()
    assert (detail["forked_from"], detail["fork_step"]) == (str(source.id), "send")
    assert detail["provenance"]["summary"] == (f"a fork of run {source.id} from step 'send'; set "
                                               "in motion by requester (started it, forked it)")
    forks = api.get(api.get(f"/api/v1/runs/{source.id}/").json()["forks_url"]).json()["results"]
    assert [(f["id"], f["forked_from"], f["fork_step"]) for f in forks] == [
        (str(fork.id), str(source.id), "send")]


def test_another_teams_member_cannot_fork_a_run_nor_learn_it_exists(source):
    stranger = member(TeamFactory(slug="other"), "stranger", role=Role.OWNER)

    with pytest.raises(Run.DoesNotExist):
        run_fork(run_id=source.id, step="draft", actor=stranger)
    response = client_for(stranger).post(f"/api/v1/runs/{source.id}/fork/", {"step": "draft"},
                                         format="json")
    assert response.status_code == 404
    assert Run.objects.count() == 1


def test_a_fork_whose_input_fails_the_schema_is_refused_with_its_path_and_creates_nothing(
        source, requester):
    with pytest.raises(InputInvalid) as refused:
        run_fork(run_id=source.id, step="draft", actor=requester, input={"topic": ""})
    assert [p["path"] for p in refused.value.problems] == ["input.topic"]
    assert Run.objects.count() == 1


def test_step_input_replaces_what_the_fork_step_reads_of_an_upstream_step(source, requester):
    fork = run_fork(run_id=source.id, step="draft", actor=requester,
                    step_input={"research": {"notes": "corrected"}})

    step = StepRun.objects.get(run=fork, name="draft")
    assert step.input["steps"]["research"] == {"state": "completed", "output": {"notes": "corrected"}}
    # What was carried is the source's; only the fork step reads the edit.
    assert StepRun.objects.get(run=fork, name="research").output == {"notes": "n1"}


@pytest.mark.parametrize(("step_input", "path"), [
    ({"research": {"other": 1}}, "step_input.research"),  # the step's input_schema
    ({"send": {}}, "step_input.send"),  # not upstream of the fork step
])
def test_a_step_input_the_step_does_not_accept_is_refused_with_its_path(source, requester,
                                                                        step_input, path):
    with pytest.raises(InputInvalid) as refused:
        run_fork(run_id=source.id, step="draft", actor=requester, step_input=step_input)
    assert [p["path"] for p in refused.value.problems] == [path]
    assert Run.objects.count() == 1


def test_a_fork_from_an_unknown_step_or_version_is_refused_by_path(source, requester):
    for kwargs, path in (({"step": "nope"}, "step"), ({"step": "draft", "version": 9}, "version")):
        with pytest.raises(InputInvalid) as refused:
            run_fork(run_id=source.id, actor=requester, **kwargs)
        assert [p["path"] for p in refused.value.problems] == [path]


def test_a_fork_reuses_the_effects_its_source_performed_unless_told_to_repeat_them(source, requester):
    send = StepRun.objects.get(run=source, name="send")
    used = send.attempt_records.get().idempotency_key
    Effect.objects.create(key=used, run=source, step=send, tool="core.echo",
                          status=Effect.Status.SUCCEEDED, result={"sent": True})

    reusing = run_fork(run_id=source.id, step="draft", actor=requester)
    repeating = run_fork(run_id=source.id, step="draft", actor=requester, repeat_effects=["send"],
                         reason="the first e-mail bounced")

    assert effect_key_of(reusing, "send") == used
    # Each logical action of the step is found the same way (a map step's items).
    Effect.objects.create(key=idempotency_key_for(source.id, "send", "item-0"), run=source,
                          step=send, tool="core.echo", status=Effect.Status.SUCCEEDED)
    assert effect_key_of(reusing, "send", "item-0") == f"{source.id}:send:item-0"
    assert effect_key_of(reusing, "send", "item-1") == f"{reusing.id}:send:item-1"
    assert effect_key_of(repeating, "send") == idempotency_key_for(repeating.id, "send")
    audit = Event.objects.get(run=repeating, kind="fork.effect_repeat")
    assert (audit.actor, audit.payload["step"], audit.payload["reason"]) == (
        "user:requester", "send", "the first e-mail bounced")
    # The fork's attempt at the step records the source's key; a fork of the fork finds it.
    finish(reusing, "draft", {"text": "d2"})
    assert step_claim(step_id=StepRun.objects.get(run=reusing, name="send").id,
                      worker="test").idempotency_key == used
    again = run_fork(run_id=reusing.id, step="draft", actor=requester)
    assert effect_key_of(again, "send") == used


def test_repeat_effects_names_only_steps_that_run_again_and_act(source, requester):
    with pytest.raises(InputInvalid) as refused:
        run_fork(run_id=source.id, step="draft", actor=requester,
                 repeat_effects=["research", "draft"])
    assert refused.value.problems == [
        {"path": "repeat_effects[0]", "message": "'research' does not run again in this fork: "
         "it is carried over, nothing of it is performed"},
        {"path": "repeat_effects[1]", "message": "'draft' performs no side effect"}]


def test_repeating_an_effect_behind_a_mandatory_gate_the_fork_carries_is_refused(team, requester):
    version, _ = workflow_save(team=team, definition=GATED, actor=SETUP)
    source = run_start(version=version, input={}, actor=requester)

    with pytest.raises(NotAllowed) as refused:
        run_fork(run_id=source.id, step="send", actor=requester, repeat_effects=["send"])
    assert refused.value.problems == [{"path": "repeat_effects[0]", "message": (
        "'send' sits behind gate 'approve', which this fork carries over instead of asking again")}]
    assert Run.objects.count() == 1
    # Reusing the effect needs no approval; asking the gate again allows repeating it.
    assert run_fork(run_id=source.id, step="send", actor=requester)._created
    fork = run_fork(run_id=source.id, step="approve", actor=requester, repeat_effects=["send"])
    assert fork.fork_edits["repeat_effects"] == ["send"]


def test_a_human_gate_right_before_a_step_that_runs_again_asks_again(team, requester):
    definition = {**GATED, "steps": [GATED["steps"][0], GATED["steps"][1],
                                     {**GATED["steps"][3], "after": ["approve"]}]}
    definition["steps"][1] = {**definition["steps"][1], "mandatory": False}
    del definition["steps"][1]["guards"]
    version, _ = workflow_save(team=team, definition={**definition, "name": "direct"}, actor=SETUP)
    source = run_start(version=version, input={}, actor=requester)
    finish(source, "draft", {"text": "d"})

    fork = run_fork(run_id=source.id, step="send", actor=requester, repeat_effects=["send"])

    assert states(fork) == {"draft": "completed", "approve": "waiting", "send": "blocked"}


def test_forking_through_the_api_honours_the_idempotency_key(source, requester):
    api = client_for(requester)
    body = {"step": "draft", "step_input": {"research": {"notes": "again"}}}

    first = api.post(f"/api/v1/runs/{source.id}/fork/", body, format="json",
                     HTTP_IDEMPOTENCY_KEY="fork-1")
    second = api.post(f"/api/v1/runs/{source.id}/fork/", body, format="json",
                      HTTP_IDEMPOTENCY_KEY="fork-1")
    other = api.post(f"/api/v1/runs/{source.id}/fork/", {"step": "send"}, format="json",
                     HTTP_IDEMPOTENCY_KEY="fork-1")

    assert (first.status_code, second.status_code, other.status_code) == (202, 200, 409)
    assert first.json()["id"] == second.json()["id"]
    assert first.json()["forked_from"] == str(source.id)
    assert Run.objects.filter(forked_from=source).count() == 1


def test_a_fork_input_failing_the_schema_is_a_400_with_its_path(source, requester):
    response = client_for(requester).post(f"/api/v1/runs/{source.id}/fork/",
                                          {"step": "draft", "input": {"topic": 3}}, format="json")
    assert response.status_code == 400
    assert [e["path"] for e in response.json()["errors"]] == ["input.topic"]


def test_an_evaluations_sandboxed_run_is_not_forked(team, requester):
    version, _ = workflow_save(team=team, definition=CHAIN, actor=SETUP)
    sandboxed = run_start(version=version, input={"topic": "t"}, actor=SETUP,
                          capacity="evaluation", sandbox={"purpose": "evaluation"})

    with pytest.raises(NotAllowed):
        run_fork(run_id=sandboxed.id, step="draft", actor=requester)
    assert Run.objects.count() == 1
