"""The reaper reads bounded batches: a sweep acts on at most `reaper.BATCH` rows of a kind, and
the sweeps after it handle the rest, so a backlog larger than a batch is worked off across calls
however long the history (each sweep's cost is bounded by its batch, not by the table)."""
import pytest

from orchestrator.engine.services import reaper
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import StepRun
from tests.factories import SETUP

pytestmark = pytest.mark.django_db


def test_more_sleepers_than_a_batch_are_all_woken_across_sweeps(team, move_clock, settings):
    settings.STEPWISE_TEAM_MAX_LIVE_RUNS = 0  # more sleepers than a team may have by default
    version, _ = workflow_save(team=team, definition={
        "name": "napper", "input_schema": {"type": "object"},
        "steps": [{"name": "nap", "type": "sleep", "for_s": 5}]}, actor=SETUP)
    backlog = reaper.BATCH + 7
    for _ in range(backlog):
        run_start(version=version, input={}, actor=SETUP)
    assert StepRun.objects.filter(name="nap", state="waiting").count() == backlog
    move_clock(6)

    woken = [reaper.reap()["woken"] for _ in range(3)]

    assert woken == [reaper.BATCH, 7, 0]
    assert not StepRun.objects.filter(name="nap", state="waiting").exists()
