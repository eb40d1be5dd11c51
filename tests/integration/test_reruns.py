"""Bulk re-runs through real Celery worker processes: fifty failed runs re-run with one key asked
twice start fifty new runs, which complete on the chosen version; a team's cap on unfinished runs
refuses the sources past it, each with the reason, and the batch goes on; another team's person
reaches none of the runs; a person who lost run.start before the worker started is refused for
every source."""
import pytest
from django.db import transaction

from budgets.models import BudgetLimit
from orchestrator.engine.services.reruns import runs_rerun
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Rerun, Role, Run, TeamMembership
from tests.conftest import client_for
from tests.factories import SETUP, member
from tests.support.reruns import echo_definition

from .conftest import wait_for, wait_for_run

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
ENDED = ("completed", "failed", "cancelled", "timed_out")


def failed_sources(team, count: int):
    """`count` runs of a broken v1, failed on the workers, and the fixed v2."""
    broken, _ = workflow_save(team=team, definition=echo_definition(fixed=False), actor=SETUP)
    fixed, _ = workflow_save(team=team, definition=echo_definition(fixed=True), actor=SETUP)
    runs = [run_start(version=broken, input={"ticket": f"T-{i}"}, actor=SETUP) for i in range(count)]
    for run in runs:
        assert wait_for_run(run.id, states=ENDED, timeout=120).state == "failed"
    return runs, fixed


def done(rerun_id, timeout: float = 180) -> Rerun:
    return wait_for(lambda: Rerun.objects.filter(pk=rerun_id, state="done").first(), timeout=timeout,
                    interval=0.2)


def test_fifty_failed_runs_rerun_with_one_key_clicked_twice_start_fifty(workers, team):
    sources, fixed = failed_sources(team, 50)
    operator = client_for(member(team, "operator", role=Role.OPERATOR))
    body = {"filter": {"workflow": "triage", "state": ["failed"]}, "version": fixed.number}

    first = operator.post("/api/v1/runs/rerun/", body, format="json", HTTP_IDEMPOTENCY_KEY="fix-forward")
    second = operator.post("/api/v1/runs/rerun/", body, format="json", HTTP_IDEMPOTENCY_KEY="fix-forward")

    assert (first.status_code, second.status_code) == (202, 200), (first.json(), second.json())
    assert first.json()["id"] == second.json()["id"] and first.json()["total"] == 50
    rerun = done(first.json()["id"])
    assert (rerun.total, rerun.started, rerun.refused) == (50, 50, 0)
    new_runs = Run.objects.filter(trigger="rerun")
    assert new_runs.count() == 50 and set(new_runs.values_list("version", flat=True)) == {fixed.id}
    assert {item.source_run_id for item in rerun.items.all()} == {r.id for r in sources}
    for run in new_runs:
        assert wait_for_run(run.id, states=ENDED, timeout=120).state == "completed"
    assert {r.input["ticket"] for r in new_runs} == {r.input["ticket"] for r in sources}
    progress = operator.get(f"/api/v1/reruns/{rerun.id}/").json()
    assert (progress["state"], progress["started"], progress["pending"]) == ("done", 50, 0)
    # Asked again once it is done: the same batch, nothing started.
    assert operator.post("/api/v1/runs/rerun/", body, format="json",
                         HTTP_IDEMPOTENCY_KEY="fix-forward").json()["id"] == rerun.id
    assert Run.objects.filter(trigger="rerun").count() == 50


def test_a_cap_on_unfinished_runs_refuses_the_sources_past_it_each_with_the_reason(workers, team):
    sources, _ = failed_sources(team, 4)
    holding = echo_definition(fixed=True)  # v3: its runs wait for a signal, so they stay unfinished
    holding["steps"].append({"name": "hold", "type": "wait", "signal": "go", "after": ["echo"],
                             "timeout_s": 600})
    waiting, _ = workflow_save(team=team, definition=holding, actor=SETUP)
    BudgetLimit.objects.create(team=team, max_concurrent_runs=2)
    requester = member(team, "requester", role=Role.EDITOR)

    rerun = done(runs_rerun(run_ids=[r.id for r in sources], version=waiting, actor=requester,
                            key="capped").id)

    assert (rerun.started, rerun.refused) == (2, 2)
    refused = list(rerun.items.filter(outcome="refused"))
    assert all(item.reason.startswith("team 'support' has 2 unfinished runs; its limit is 2")
               for item in refused), [item.reason for item in refused]
    assert Run.objects.filter(version=waiting).count() == 2


def test_another_teams_person_reaches_none_of_the_runs(workers, team, outsider):
    sources, fixed = failed_sources(team, 2)
    theirs = client_for(outsider)

    by_runs = theirs.post("/api/v1/runs/rerun/", {"runs": [str(r.id) for r in sources], "version": 2},
                          format="json", HTTP_IDEMPOTENCY_KEY="theirs")
    by_filter = theirs.post("/api/v1/runs/rerun/", {"filter": {"workflow": "triage", "team": "support"},
                                                    "version": 2},
                            format="json", HTTP_IDEMPOTENCY_KEY="theirs")

    assert (by_runs.status_code, by_filter.status_code) == (400, 400)
    assert not Rerun.objects.exists() and not Run.objects.filter(version=fixed).exists()


def test_a_person_without_run_start_when_the_worker_starts_is_refused_for_every_source(workers, team):
    sources, fixed = failed_sources(team, 3)
    leaving = member(team, "leaving", role=Role.MEMBER)

    with transaction.atomic():  # the worker's message leaves once both are committed
        rerun = runs_rerun(run_ids=[r.id for r in sources], version=fixed, actor=leaving, key="gone")
        TeamMembership.objects.filter(user=leaving).delete()
    rerun = done(rerun.id)

    assert (rerun.started, rerun.refused) == (0, 3)
    assert {item.reason for item in rerun.items.all()} == {
        "user:leaving may not run.start in team 'support' (docs/permissions.md)"}
    assert not Run.objects.filter(version=fixed).exists()
