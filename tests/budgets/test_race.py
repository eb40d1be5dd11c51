"""Two processes racing for the last of a budget: exactly one reservation passes.

Two runs of one team each want one call; the team's daily limit has room for one. Each
real process locks its own run (different rows: the run lock alone serializes nothing here) and
reserves, holding its transaction open a while after reading what is committed, so a
read-then-write check would let both through. Only the lock on the team's limit row (PostgreSQL,
`select_for_update`) or SQLite's IMMEDIATE transactions keep the second out. Runs on whichever
backend the session uses (DATABASE_URL: PostgreSQL; else the embedded SQLite).
"""
import subprocess
import sys
from decimal import Decimal

import pytest

from budgets.models import Reservation
from budgets.services import budget_limit_create, committed_sum
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from tests.factories import SETUP
from tests.integration.conftest import ROOT, worker_env

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

RACER = """
import os, sys, time
import django
django.setup()
from django.db import transaction
from budgets.services import budget_reserve
from orchestrator.models import StepRun
from orchestrator.engine.selectors import definition_of, lock_run

step_id, go = int(sys.argv[1]), sys.argv[2]
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.001)
with transaction.atomic():
    step = StepRun.objects.get(id=step_id)
    run = lock_run(step.run_id)
    definition, graph = definition_of(run)
    outcome = budget_reserve(run=run, step=step, spec=graph.steps[step.name], definition=definition,
                             attempt=2)
    time.sleep(0.5)  # what it read stays the truth only if nobody else could write meanwhile
print(outcome.denial.level if outcome.denial else "reserved", flush=True)
"""


def race(script: str, ids: list[int], tmp_path, **env) -> list[str]:
    """Run `script` in one real process per id, let them go at once, and return what each
    printed last, sorted."""
    go = tmp_path / "go"
    env = {**worker_env(), "DJANGO_SETTINGS_MODULE": "orchestrator.settings", **env}
    racers = [subprocess.Popen([sys.executable, "-c", script, str(i), str(go)], cwd=ROOT, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for i in ids]
    try:
        for racer in racers:
            assert racer.stdout.readline().strip() == "ready", racer.stderr.read()
        go.touch()
        return sorted(racer.communicate(timeout=60)[0].strip() for racer in racers)
    finally:
        for racer in racers:
            racer.kill()


def test_two_processes_racing_for_the_last_reservation_cannot_both_pass(team, settings, tmp_path):
    settings.STEPWISE_DEFAULT_STEP_COST_USD = "0.10"
    # The model step waits behind a gate nobody decides: no worker of the session (another
    # test's may be running) takes it and settles what it holds while the racers race.
    version, _ = workflow_save(team=team, definition={
        "name": "racer", "input_schema": {"type": "object"},
        "steps": [{"name": "hold", "type": "human_gate", "approvers": "support_leads"},
                  {"name": "think", "type": "agent", "model": "fast", "prompt": "hi",
                   "output_schema": {"type": "object"}, "after": ["hold"]}]}, actor=SETUP)
    steps = [run_start(version=version, input={}, actor=SETUP).steps.get(name="think")
             for _ in range(2)]
    # Nothing is held yet; the day's limit has room for one call of 0.10.
    assert committed_sum(Reservation.objects.filter(team=team)) == Decimal("0")
    budget_limit_create(team=team, actor=SETUP, daily_usd=Decimal("0.10"))

    outcomes = race(RACER, [step.id for step in steps], tmp_path, STEPWISE_DEFAULT_STEP_COST_USD="0.10")

    assert outcomes == ["reserved", "team.day"]
    assert Reservation.objects.filter(attempt=2).count() == 1
    assert committed_sum(Reservation.objects.filter(team=team)) == Decimal("0.10")


STARTER = """
import os, sys, time
import django
django.setup()
from django.db import transaction
from orchestrator.engine.authz import System
from orchestrator.engine.errors import BudgetExceeded
from orchestrator.models import WorkflowVersion
from orchestrator.engine.services.runs import run_start

version_id, go = int(sys.argv[1]), sys.argv[2]
version = WorkflowVersion.objects.get(id=version_id)
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.001)
with transaction.atomic():
    try:
        run_start(version=version, input={}, actor=System("racer"))
        outcome = "started"
    except BudgetExceeded as refused:
        outcome = refused.detail["level"]
    time.sleep(0.5)  # the count it read stays the truth only if nobody else could start a run
print(outcome, flush=True)
"""


def test_two_processes_racing_for_the_last_concurrent_run_cannot_both_start(team, tmp_path):
    """The team's cap has room for one more run; two processes start one each at once. The
    admission counts the unfinished runs with the team's limit row locked (PostgreSQL; SQLite's
    IMMEDIATE transactions), so the second waits for the first to commit, counts it, and is
    refused."""
    version, _ = workflow_save(team=team, definition={
        "name": "starter", "input_schema": {"type": "object"},
        "steps": [{"name": "hold", "type": "human_gate", "approvers": "support_leads"}]}, actor=SETUP)
    budget_limit_create(team=team, actor=SETUP, max_concurrent_runs=1)

    outcomes = race(STARTER, [version.id, version.id], tmp_path)

    assert outcomes == ["started", "team.concurrent_runs"]
    assert version.runs.count() == 1
