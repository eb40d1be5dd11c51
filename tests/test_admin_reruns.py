"""The run list's bulk re-run: "Re-run selected runs…" and "Re-run all runs in this view…" lead to
a confirmation page that picks the version and carries the batch's key (a double submit is one
batch), then to the batch's progress page; all through `runs_rerun`, which checks run.start."""
import re

import pytest
from django.urls import reverse

from orchestrator.engine.services.reruns import rerun_advance, runs_rerun
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Rerun, Role
from tests.factories import SETUP, member
from tests.support.reruns import echo_definition, failed_runs, run_to_end

pytestmark = pytest.mark.django_db
LIST = "/admin/orchestrator/run/"
RERUN = "/admin/orchestrator/run/rerun/"


@pytest.fixture
def versions(team):
    broken, _ = workflow_save(team=team, definition=echo_definition(fixed=False), actor=SETUP)
    fixed, _ = workflow_save(team=team, definition=echo_definition(fixed=True), actor=SETUP)
    return broken, fixed


@pytest.fixture
def operator_client(client, team):
    client.force_login(member(team, "operator", role=Role.OPERATOR, staff=True))
    return client


def hidden(page: str, name: str) -> str:
    return re.search(rf'name="{name}" value="([^"]*)"', page).group(1)


def test_selected_runs_are_confirmed_then_rerun_once_however_often_submitted(operator_client, versions):
    broken, fixed = versions
    sources = failed_runs(broken, 3)
    chosen = [str(r.id) for r in sources[:2]]

    confirm = operator_client.post(LIST, {"action": "rerun_runs", "_selected_action": chosen})

    page = confirm.content.decode()
    assert confirm.status_code == 200 and "Re-run 2 runs" in page
    assert '<option value="2" selected>v2 (published)' in page
    assert set(hidden(page, "runs").split(",")) == set(chosen)
    form = {"runs": hidden(page, "runs"), "key": hidden(page, "key"), "version": "2"}
    first = operator_client.post(RERUN, form)
    second = operator_client.post(RERUN, form)

    rerun = Rerun.objects.get()
    progress = reverse("admin:orchestrator_run_rerun_progress", args=[rerun.id])
    assert first.status_code == second.status_code == 302 and first.url == second.url == progress
    assert (rerun.total, rerun.version, rerun.actor) == (2, fixed, "user:operator")
    running = operator_client.get(progress).content.decode()
    assert 'http-equiv="refresh"' in running and running.count("not started yet") == 2

    rerun_advance(rerun_id=rerun.id)
    done = operator_client.get(progress).content.decode()
    assert 'http-equiv="refresh"' not in done
    for item in rerun.items.all():
        assert reverse("admin:orchestrator_run_live", args=[item.new_run_id]) in done


def test_all_runs_in_the_view_are_offered_for_a_rerun(operator_client, versions):
    broken, _ = versions
    failed_runs(broken, 2)
    run_to_end(run_start(version=versions[1], input={"ticket": "ok"}, actor=SETUP))  # completed

    listing = operator_client.get(LIST, {"state__exact": "failed"}).content.decode()
    assert f'href="{RERUN}?state__exact=failed" id="rerun-matching"' in listing
    page = operator_client.get(RERUN, {"state__exact": "failed"}).content.decode()

    assert "Re-run 2 runs of triage" in page
    assert len(hidden(page, "runs").split(",")) == 2


def test_runs_of_several_workflows_are_sent_back_to_the_list(operator_client, versions, team):
    other, _ = workflow_save(team=team, definition=echo_definition(fixed=False, name="other"), actor=SETUP)
    ids = [str(failed_runs(versions[0], 1)[0].id), str(failed_runs(other, 1)[0].id)]

    answer = operator_client.post(LIST, {"action": "rerun_runs", "_selected_action": ids}, follow=True)

    assert "re-run one workflow&#x27;s runs at a time" in answer.content.decode()
    assert not Rerun.objects.exists()


def test_a_version_the_workflow_lacks_is_shown_on_the_confirmation(operator_client, versions):
    ids = ",".join(str(r.id) for r in failed_runs(versions[0], 1))

    answer = operator_client.post(RERUN, {"runs": ids, "key": "k", "version": "7"})

    assert answer.status_code == 400 and "has no version 7" in answer.content.decode()
    assert not Rerun.objects.exists()


def test_another_teams_person_sees_no_batch_and_reaches_no_run(client, versions, outsider, team):
    sources = failed_runs(versions[0], 1)
    batch = runs_rerun(run_ids=[sources[0].id], version=versions[1], key="k",
                       actor=member(team, "operator", role=Role.OPERATOR))
    outsider.is_staff = True
    outsider.save()
    client.force_login(outsider)

    answer = client.post(RERUN, {"runs": str(sources[0].id), "key": "k2", "version": "2"}, follow=True)

    assert "none of these runs is one of your teams" in answer.content.decode()
    assert Rerun.objects.count() == 1
    progress = reverse("admin:orchestrator_run_rerun_progress", args=[batch.id])
    assert client.get(progress).status_code == 404
