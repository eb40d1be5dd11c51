"""Capacity classes (engine/capacity.py): the built-in batch class and the ones an operator adds
with STEPWISE_CAPACITY_CLASSES each send a run's work to queues of their own, which their
worker family consumes; a workflow names its runs' default class, and a start (service or API)
or a trigger may name another — a class the deployment does not know is refused with its path.

Messages are read as they are sent (`current_app.send_task` recorded).
"""
import pytest

from orchestrator.engine.definitions import DefinitionInvalid
from orchestrator.engine.dispatch import batch_queue_for, queue_for
from orchestrator.engine.errors import InputInvalid
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_publish, workflow_save
from orchestrator.management.commands.stepwise_queues import queues
from orchestrator.models import Run, StepRun, Workflow
from orchestrator.operations.queues import capacity_of_queue, known_queues
from tests.factories import SETUP
from triggers.services.config import TriggerInvalid, trigger_create
from triggers.services.firing import trigger_fire_api

pytestmark = pytest.mark.django_db

ECHO = {"name": "echo", "type": "tool", "tool": "core.echo"}
THINK = {"name": "think", "type": "agent", "model": "fast", "prompt": "hi",
         "output_schema": {"type": "object"}}
BULK = {"bulk": {"shares": {"model:fast": 0.1}}}


def save(team, *steps, name="classes", **definition):
    version, _ = workflow_save(team=team, definition={
        "name": name, "input_schema": {"type": "object"}, "steps": list(steps), **definition},
        actor=SETUP)
    return version


@pytest.fixture
def bulk(settings):
    settings.STEPWISE_CAPACITY_CLASSES = BULK


@pytest.mark.parametrize("capacity, tools, agent", [
    ("batch", "tools.batch", "agent.fast.batch"),
    ("bulk", "tools.bulk", "agent.fast.bulk"),
])
def test_a_run_s_steps_go_to_its_class_s_queues(team, sent, bulk, capacity, tools, agent,
                                                 django_capture_on_commit_callbacks):
    version = save(team, ECHO, THINK)
    with django_capture_on_commit_callbacks(execute=True):
        run = run_start(version=version, input={}, actor=SETUP, capacity=capacity)

    assert run.capacity == capacity
    assert {s.name: s.queue for s in StepRun.objects.filter(run=run)} == {"echo": tools,
                                                                          "think": agent}
    assert sorted(sent) == sorted([("execute_step", tools), ("execute_step", agent)])


def test_an_added_class_is_a_worker_family_of_its_own_and_its_queues_are_watched(settings, bulk):
    settings.STEPWISE_MODELS = {"fast": {}}

    assert queues("bulk") == ["orchestrator.bulk", "tools.bulk", "agent.fast.bulk"]
    assert set(queues("bulk")) <= set(queues("all"))
    assert set(queues("bulk")) <= set(known_queues())  # the operations page's depths
    assert [capacity_of_queue(q) for q in queues("bulk")] == ["bulk"] * 3
    assert capacity_of_queue("tools.batch") == "batch"
    assert capacity_of_queue("agent.fast") == "interactive"


def test_a_batch_run_s_orchestrator_steps_stay_on_the_orchestrator_queue(bulk):
    router = {"type": "router", "strategy": "first"}

    assert queue_for(router, capacity="batch") == "orchestrator"
    assert queue_for(router, capacity="bulk") == "orchestrator.bulk"
    assert queue_for(router, capacity="evaluation") == "orchestrator.evaluation"
    assert batch_queue_for(ECHO, capacity="batch") == "tools.batch"
    assert batch_queue_for(ECHO, capacity="bulk") == "tools.bulk"


def test_a_workflow_s_class_is_its_runs_default_and_a_start_may_name_another(team, bulk):
    version = save(team, ECHO, capacity="bulk")

    assert run_start(version=version, input={}, actor=SETUP).capacity == "bulk"
    assert run_start(version=version, input={}, actor=SETUP, capacity="interactive").capacity \
        == "interactive"
    assert run_start(version=save(team, ECHO, name="plain"), input={}, actor=SETUP).capacity \
        == "interactive"


def test_a_class_the_deployment_does_not_know_is_refused_and_nothing_is_created(team, settings):
    version = save(team, ECHO, name="unknown-class")
    settings.STEPWISE_CAPACITY_CLASSES = BULK
    stale = save(team, ECHO, name="stale-default", capacity="bulk")
    settings.STEPWISE_CAPACITY_CLASSES = {}  # the class is gone; the saved default names it

    with pytest.raises(InputInvalid) as refused:
        run_start(version=version, input={}, actor=SETUP, capacity="bulk")
    with pytest.raises(InputInvalid):
        run_start(version=stale, input={}, actor=SETUP)

    assert refused.value.problems == [
        {"path": "capacity", "message": "one of interactive, batch, evaluation"}]
    assert not Run.objects.exists()


def test_a_definition_naming_a_class_the_deployment_does_not_know_is_not_saved(team):
    with pytest.raises(DefinitionInvalid) as refused:
        save(team, ECHO, name="typo", capacity="bacth")

    assert [(p.path, p.message) for p in refused.value.problems] == [
        ("capacity", "one of interactive, batch, evaluation")]
    assert not Workflow.objects.filter(name="typo").exists()


def test_the_api_starts_a_run_on_the_class_it_names_and_refuses_an_unknown_one(team, api, bulk):
    version = save(team, ECHO, name="api-classes")
    workflow_publish(workflow_id=version.workflow_id, number=version.number, actor=SETUP)

    started = api.post("/api/v1/workflows/api-classes/runs/", {"input": {}, "capacity": "bulk"},
                       format="json")
    refused = api.post("/api/v1/workflows/api-classes/runs/", {"input": {}, "capacity": "gpu"},
                       format="json")

    assert started.status_code == 202, started.content
    assert started.json()["capacity"] == "bulk"
    assert refused.status_code == 400
    assert refused.json()["errors"] == [
        {"path": "capacity", "message": "one of interactive, batch, evaluation, bulk"}]
    assert Run.objects.count() == 1


def test_a_trigger_s_class_overrides_the_workflow_s_and_an_unknown_one_is_refused(team, bulk):
    version = save(team, ECHO, name="triggered", capacity="batch")
    workflow_publish(workflow_id=version.workflow_id, number=version.number, actor=SETUP)
    plain, _ = trigger_create(team=team, kind="api", name="plain", workflow="triggered",
                              actor=SETUP)
    to_bulk, _ = trigger_create(team=team, kind="api", name="bulk", workflow="triggered",
                                capacity="bulk", actor=SETUP)

    with pytest.raises(TriggerInvalid) as refused:
        trigger_create(team=team, kind="api", name="gpu", workflow="triggered", capacity="gpu",
                       actor=SETUP)

    assert trigger_fire_api(trigger_id=plain.id, key="a", actor=SETUP, payload={}).run.capacity \
        == "batch"
    assert trigger_fire_api(trigger_id=to_bulk.id, key="a", actor=SETUP, payload={}).run.capacity \
        == "bulk"
    assert refused.value.problems == [
        {"path": "capacity", "message": "one of interactive, batch, evaluation, bulk"}]
