"""Concurrency keys (`concurrency: {key, limit}`, services/concurrency.py): at most `limit`
unfinished runs of a workflow per key; the others are held `pending`, in order, each with its
place in line, and start as runs of their key end. Runs are driven in this process as workers
would; what a worker's end of a run sends (`release_held_runs`) is called as the task would."""
import pytest
from django.db import transaction

from orchestrator.engine.errors import InputInvalid
from orchestrator.engine.selectors import place_in_line
from orchestrator.engine.services import reaper
from orchestrator.engine.services.concurrency import held_runs_release
from orchestrator.engine.services.kinds.worker import step_execute
from orchestrator.engine.services.runs import run_cancel, run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Event, Run
from tests.factories import SETUP

pytestmark = pytest.mark.django_db

ECHO = {"name": "echo", "type": "tool", "tool": "core.echo", "params": {"customer": "{{ input.customer }}"}}
SCHEMA = {"type": "object", "required": ["customer"], "properties": {"customer": {"type": "string"}}}


def keyed(team, limit: int = 1, key: str = "{{ input.customer }}"):
    version, _ = workflow_save(team=team, actor=SETUP, definition={
        "name": "refund-one", "input_schema": SCHEMA, "concurrency": {"key": key, "limit": limit},
        "steps": [ECHO]})
    return version


def start(version, customer: str) -> Run:
    return run_start(version=version, input={"customer": customer}, actor=SETUP)


def finish(run: Run) -> Run:
    """What workers do with the run's queued steps, then the release its end sends."""
    while step := run.steps.filter(state="queued").first():
        step_execute(step_id=step.id, worker="test")
    run.refresh_from_db()
    if run.is_terminal:
        held_runs_release(workflow_id=run.version.workflow_id, key=run.concurrency_key)
    return run


def states(runs: list[Run]) -> list[str]:
    return [Run.objects.get(pk=r.pk).state for r in runs]


def test_a_key_of_one_serializes_one_customers_runs_in_order_and_lets_another_customer_pass(team):
    version = keyed(team)
    alice = [start(version, "alice") for _ in range(20)]
    bob = start(version, "bob")

    assert states(alice) == ["running"] + ["pending"] * 19
    assert bob.state == "running" and bob.concurrency_key == "bob"
    assert [place_in_line(Run.objects.get(pk=r.pk)) for r in alice] == [None, *range(1, 20)]
    held = Event.objects.filter(run=alice[5], kind="run.held").get()
    assert held.payload == {"concurrency_key": "alice", "place": 5}
    assert set(alice[5].steps.values_list("state", flat=True)) == {"blocked"}  # nothing started

    for n, run in enumerate(alice):
        assert finish(run).state == "completed"
        assert states(alice[n + 1:n + 2]) in ([], ["running"])
        assert set(states(alice[n + 2:])) <= {"pending"}
    ordered = sorted((Run.objects.get(pk=r.pk) for r in alice), key=lambda r: r.started_at)
    assert [r.pk for r in ordered] == [r.pk for r in alice]  # first in line, first started
    assert all(a.finished_at <= b.started_at for a, b in zip(ordered, ordered[1:], strict=False))
    released = Event.objects.get(run=alice[1], kind="run.running")
    assert released.actor == "service:scheduler" and released.payload["released"] is True


def test_a_limit_lets_that_many_go_at_once(team):
    version = keyed(team, limit=3)
    runs = [start(version, "alice") for _ in range(5)]
    assert states(runs) == ["running"] * 3 + ["pending"] * 2

    finish(runs[1])
    assert states(runs) == ["running", "completed", "running", "running", "pending"]


def test_a_held_run_cancelled_leaves_the_line_and_the_others_move_up(team):
    version = keyed(team)
    first, second, third = (start(version, "alice") for _ in range(3))

    run_cancel(run_id=second.id, actor=SETUP)

    assert states([first, second, third]) == ["running", "cancelled", "pending"]
    assert place_in_line(Run.objects.get(pk=third.pk)) == 1
    finish(first)
    assert states([third]) == ["running"]


def test_a_release_lost_with_a_worker_is_made_by_the_reapers_sweep(team):
    version = keyed(team)
    first, second = start(version, "alice"), start(version, "alice")
    while step := first.steps.filter(state="queued").first():  # ends; its release is never sent
        step_execute(step_id=step.id, worker="test")
    assert states([first, second]) == ["completed", "pending"]

    assert reaper.reap()["held_runs_released"] == 1
    assert states([second]) == ["running"]
    assert reaper.reap()["held_runs_released"] == 0


def test_two_releases_at_once_start_one_run_for_one_place(team):
    version = keyed(team)
    first, second, third = (start(version, "alice") for _ in range(3))
    finish(first)
    assert held_runs_release(workflow_id=version.workflow_id, key="alice") == 0
    assert states([second, third]) == ["running", "pending"]


@pytest.mark.parametrize("customer", ["", "  ", "x" * 201])
def test_a_key_the_input_cannot_make_refuses_the_start_and_creates_nothing(team, customer):
    version = keyed(team)
    with pytest.raises(InputInvalid) as refused:
        with transaction.atomic():
            start(version, customer)
    assert refused.value.problems == [{"path": "concurrency.key", "message":
                                       f"gave {len(customer.strip())} characters; a key has 1 to 200"}]
    assert not Run.objects.exists()


def test_the_same_key_in_two_workflows_is_two_lines(team):
    version = keyed(team)
    other, _ = workflow_save(team=team, actor=SETUP, definition={
        "name": "refund-two", "input_schema": SCHEMA, "concurrency": {"key": "{{ input.customer }}", "limit": 1},
        "steps": [ECHO]})
    assert (start(version, "alice").state, start(other, "alice").state) == ("running", "running")


def test_a_key_may_read_only_the_input(team):
    from orchestrator.engine.services.workflows import DefinitionInvalid

    with pytest.raises(DefinitionInvalid) as refused:
        keyed(team, key="{{ steps.echo.output.customer }}")
    assert {p.path for p in refused.value.problems} == {"concurrency.key"}


def test_an_evaluation_run_is_not_held_behind_live_runs_of_its_key(team):
    version = keyed(team)
    live = start(version, "alice")
    sandboxed = run_start(version=version, input={"customer": "alice"}, actor=SETUP,
                          capacity="evaluation", sandbox={"purpose": "evaluation"})
    assert (live.state, sandboxed.state, sandboxed.concurrency_key) == ("running", "running", "")


def test_a_fork_waits_its_turn_with_its_carried_steps_and_runs_from_its_step_when_released(team):
    from orchestrator.engine.services.forks import run_fork

    version, _ = workflow_save(team=team, actor=SETUP, definition={
        "name": "refund-one", "input_schema": SCHEMA, "concurrency": {"key": "{{ input.customer }}", "limit": 1},
        "steps": [ECHO, {**ECHO, "name": "again", "after": ["echo"]}]})
    done = finish(start(version, "alice"))
    going = start(version, "alice")

    fork = run_fork(run_id=done.id, step="again", actor=SETUP)

    assert fork.state == "pending" and place_in_line(fork) == 1
    assert dict(fork.steps.values_list("name", "state")) == {"echo": "completed", "again": "blocked"}
    assert list(Event.objects.filter(run=fork).values_list("kind", flat=True).order_by("id")) == [
        "run.created", "run.held", "run.forked", "step.carried", "step.attested"]
    finish(going)
    assert finish(Run.objects.get(pk=fork.pk)).state == "completed"
    assert fork.steps.get(name="echo").attempts == 0  # carried, never run again
