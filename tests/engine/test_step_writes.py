"""Finishing a step writes what changed, not the step's whole input back."""
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from orchestrator.engine import clock
from orchestrator.engine.retry import StepError
from orchestrator.engine.services.kinds.worker import (
    Usage,
    step_claim,
    step_execute,
    step_fail,
    step_succeed,
)
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Run
from tests.factories import SETUP

BIG = "x" * 20_000


@pytest.fixture
def claimed(team):
    version, _ = workflow_save(team=team, definition={
        "name": "writes", "input_schema": {"type": "object"}, "steps": [
            {"name": "a", "type": "tool", "tool": "core.echo", "params": {"text": "{{ input.big }}"}},
            {"name": "b", "type": "tool", "tool": "core.echo", "after": ["a"]}]}, actor=SETUP)
    run = run_start(version=version, input={"big": BIG}, actor=SETUP)
    step = run.steps.get(name="a")
    assert BIG in str(step.input)
    return step, step_claim(step_id=step.id, worker="w")


def updates_of(step, queries) -> list[str]:
    return [q["sql"] for q in queries if q["sql"].startswith("UPDATE")
            and "orchestrator_steprun" in q["sql"] and f'"id" = {step.id}' in q["sql"]]


@pytest.mark.parametrize("finish", ["succeed", "fail"])
def test_finishing_a_step_leaves_its_input_out_of_the_update(claimed, finish):
    step, claim = claimed
    with CaptureQueriesContext(connection) as queries:
        if finish == "succeed":
            step_succeed(step_id=step.id, attempt=claim.attempt, output={"ok": True}, usage=Usage(), worker="w")
        else:
            step_fail(step_id=step.id, attempt=claim.attempt, error=StepError("permanent", "no"),
                      usage=Usage(), worker="w")
    updates = updates_of(step, queries)
    assert updates, "the step was not updated"
    assert not any(BIG in sql for sql in updates)
    step.refresh_from_db()
    assert BIG in str(step.input)


def test_claiming_a_step_leaves_its_input_out_of_the_update(team):
    version, _ = workflow_save(team=team, definition={
        "name": "claimed", "input_schema": {"type": "object"}, "steps": [
            {"name": "a", "type": "tool", "tool": "core.echo", "params": {"text": "{{ input.big }}"}}]},
        actor=SETUP)
    step = run_start(version=version, input={"big": BIG}, actor=SETUP).steps.get(name="a")

    with CaptureQueriesContext(connection) as queries:
        claim = step_claim(step_id=step.id, worker="w")

    updates = updates_of(step, queries)
    assert len(updates) == 1 and BIG not in updates[0]
    step.refresh_from_db()
    assert (step.state, step.attempts, step.lease_owner) == ("running", 1, "w")
    assert step.started_at and step.deadline_at and step.lease_expires_at
    assert BIG in str(step.input) and BIG in str(claim.step_input)


def test_a_runs_progress_time_is_written_once_its_last_write_is_a_second_old(team, monkeypatch):
    """A chain's steps a few milliseconds apart leave the run's row alone; the stuck sweep
    (minutes) still sees a run progress, to the second."""
    at = [clock.now()]
    monkeypatch.setattr(clock, "_source", lambda: at[0])
    version, _ = workflow_save(team=team, definition={
        "name": "progress", "input_schema": {"type": "object"}, "steps": [
            {"name": f"s{i}", "type": "tool", "tool": "core.echo", **({"after": [f"s{i - 1}"]} if i else {})}
            for i in range(3)]}, actor=SETUP)
    run = run_start(version=version, input={}, actor=SETUP)
    started = Run.objects.get(id=run.id).progressed_at
    steps = {s.name: s.id for s in run.steps.all()}

    at[0] += timedelta(milliseconds=900)
    with CaptureQueriesContext(connection) as within:
        step_execute(step_id=steps["s0"], worker="w")
    assert Run.objects.get(id=run.id).progressed_at == started
    assert not [q for q in within.captured_queries
                if q["sql"].startswith("UPDATE") and "orchestrator_run" in q["sql"].split(" SET ")[0]]

    at[0] += timedelta(milliseconds=200)
    step_execute(step_id=steps["s1"], worker="w")
    assert Run.objects.get(id=run.id).progressed_at == at[0]


def test_advancing_a_run_reads_no_steps_input(claimed):
    """Each step's input holds every upstream output: the scheduler, which reads the run's
    steps at every transition, reads their outputs and leaves their inputs in the database."""
    step, claim = claimed
    with CaptureQueriesContext(connection) as queries:
        step_succeed(step_id=step.id, attempt=claim.attempt, output={"text": "done"}, usage=Usage(),
                     worker="w")
    reads = [q["sql"] for q in queries if q["sql"].startswith("SELECT")
             and 'FROM "orchestrator_steprun"' in q["sql"]]
    assert reads, "the run's steps were not read"
    assert not any('"orchestrator_steprun"."input"' in sql for sql in reads), reads
    after = Run.objects.get(id=step.run_id).steps.get(name="b")
    assert after.state == "queued"
    assert after.input["steps"]["a"]["output"] == {"text": "done"}
