"""The retention sweep on the whole stack: a real worker group runs runs while the sweep deletes,
in batches, the runs past their policy with everything under them; it skips held runs and teams,
runs under a longer workflow policy, teams without a policy and every unfinished run; the
sweep is one ledger entry with its counts, and `audit_verify` passes afterwards."""
import json
from datetime import timedelta

import pytest
from django.core.management import call_command

from orchestrator.engine import clock
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.signals import signal_send
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.engine.states import RUN_TERMINAL
from orchestrator.models import Event, Role, Run, StepAttempt, StepRun
from retention.models import Kind
from retention.services import legal_hold_place, legal_hold_release, retention_policy_set
from retention.sweep import retention_sweep
from tests.factories import SETUP, TeamFactory, member
from tests.integration.conftest import wait_for, wait_for_run
from tests.support.http_sink import HttpSink
from tests.support.ledger import ledger_before, new_entries  # noqa: F401 (the autouse fixture)

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def chain(team, name: str, steps: int = 4):
    """A workflow of `steps` echo steps, one after another."""
    definition = {"name": name, "input_schema": {"type": "object"}, "steps": [
        {"name": f"s{i}", "type": "tool", "tool": "core.echo", "params": {"i": i, "n": "{{ input.n }}"},
         **({"after": [f"s{i - 1}"]} if i else {})} for i in range(steps)]}
    return workflow_save(team=team, definition=definition, actor=SETUP)[0]


def slow(team, url: str):
    """Echo, a call to the local server (held there until the test releases it), echo."""
    definition = {"name": "slow", "input_schema": {"type": "object"}, "steps": [
        {"name": "before", "type": "tool", "tool": "core.echo", "params": {"n": "{{ input.n }}"}},
        {"name": "call", "type": "tool", "tool": "http.request", "after": ["before"],
         "params": {"method": "POST", "url": f"{url}/slow", "json": {"n": "{{ input.n }}"}}},
        {"name": "after", "type": "tool", "tool": "core.echo", "after": ["call"], "params": {}}]}
    return workflow_save(team=team, definition=definition, actor=SETUP)[0]


def waiter(team):
    definition = {"name": "waiter", "input_schema": {"type": "object"}, "steps": [
        {"name": "first", "type": "tool", "tool": "core.echo", "params": {}},
        {"name": "go", "type": "wait", "signal": "go", "after": ["first"], "timeout_s": 3600}]}
    return workflow_save(team=team, definition=definition, actor=SETUP)[0]


def completed(version, count: int, first: int = 0) -> list[Run]:
    runs = [run_start(version=version, input={"n": first + i}, actor=SETUP) for i in range(count)]
    return [wait_for_run(run.id, states=("completed",), timeout=60) for run in runs]


def test_a_sweep_deletes_what_is_past_its_policy_in_batches_while_runs_keep_going(
        workers, team, monkeypatch, capsys):
    owner = member(team, "owner", role=Role.OWNER)
    short, longer = chain(team, "short"), chain(team, "longer")
    held_team = TeamFactory(slug="held")
    unruled_team = TeamFactory(slug="unruled")
    held_team_version, unruled_version = chain(held_team, "short"), chain(unruled_team, "short")
    held_owner = member(held_team, "held-owner", role=Role.OWNER)

    old = completed(short, 7)
    held_run, released_run = completed(short, 2, first=50)
    [kept_by_workflow] = completed(longer, 1)
    [kept_by_hold_on_team] = completed(held_team_version, 1)
    [kept_without_policy] = completed(unruled_version, 1)
    waiting = run_start(version=waiter(team), input={}, actor=SETUP)
    waiting = wait_for_run(waiting.id, states=("waiting",))
    split = clock.now()

    retention_policy_set(team=team, kind=Kind.RUNS, days=7, actor=owner)
    retention_policy_set(team=held_team, kind=Kind.RUNS, days=7, actor=held_owner)
    retention_policy_set(team=team, workflow=longer.workflow, kind=Kind.RUNS, days=60, actor=owner)
    legal_hold_place(run=held_run, reason="a customer's dispute", actor=owner)
    legal_hold_release(hold=legal_hold_place(run=released_run, reason="briefly", actor=owner),
                       reason="resolved", actor=owner)
    legal_hold_place(team=held_team, reason="regulator's inquiry", actor=held_owner)

    # Started after the split: the workers are inside their calls while the sweep goes on.
    with HttpSink() as sink:
        sink.hold("/slow")
        going = [run_start(version=slow(team, sink.url), input={"n": 100 + i}, actor=SETUP)
                 for i in range(6)]
        wait_for(lambda: sink.arrived >= 2, timeout=60)

        # Seven days after the split by the sweep's clock: what finished before it is due.
        monkeypatch.setattr(clock, "_source", lambda: split + timedelta(days=7))
        result = retention_sweep(batch=2, budget_s=120, collect_artifacts=False)
        monkeypatch.undo()

        gone = [r.id for r in old] + [released_run.id]
        assert not Run.objects.filter(id__in=gone).exists()
        assert not StepRun.objects.filter(run_id__in=gone).exists()
        assert not Event.objects.filter(run_id__in=gone).exists()
        assert not StepAttempt.objects.filter(step__run_id__in=gone).exists()
        assert result.batches >= 4 and result.complete  # eight runs, two per transaction
        assert result.deleted["orchestrator.Run"] == len(gone)
        assert result.deleted["orchestrator.StepRun"] == 4 * len(gone)
        kept = [held_run, kept_by_workflow, kept_by_hold_on_team, kept_without_policy, waiting]
        assert Run.objects.filter(id__in=[r.id for r in kept]).count() == len(kept)
        assert StepRun.objects.filter(run_id=held_run.id).count() == 4
        unfinished = Run.objects.filter(id__in=[r.id for r in going]).exclude(state__in=RUN_TERMINAL)
        assert unfinished.count() == len(going)

        # The runs that were going finish, whole; the waiting run carries on when signalled.
        sink.release("/slow")
        for run in going:
            done = wait_for_run(run.id, states=("completed",), timeout=60)
            assert done.steps.count() == 3 and done.output is not None
    signal_send(run_id=waiting.id, name="go", payload={}, key="go-1", actor=SETUP)
    assert wait_for_run(waiting.id, states=("completed",), timeout=60).state == "completed"

    # One ledger entry for the sweep, with its counts; the chain verifies.
    swept = new_entries().get(action="retention.swept")
    assert json.loads(swept.payload)["deleted"]["orchestrator.Run"] == len(gone)
    assert swept.actor == "service:retention" and swept.outcome == "complete"
    wait_for(lambda: new_entries().filter(sequence__isnull=True).count() == 0, timeout=10)
    call_command("audit_verify", "--allow-missing-checkpoint")  # other tests' entries
    assert "audit ledger: OK" in capsys.readouterr().out

    # Nothing is left due: a second sweep deletes nothing.
    monkeypatch.setattr(clock, "_source", lambda: split + timedelta(days=7))
    again = retention_sweep(batch=2, budget_s=120, collect_artifacts=False)
    assert not again.deleted and again.complete
