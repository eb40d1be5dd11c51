"""The run page, its JSON state, its operator controls and the operations page, through the
admin (server side; tests/browser/test_live.py watches them update in a browser)."""
import pytest
from django.urls import reverse

from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Event, Role, Run
from tests.factories import SETUP, TeamFactory, example_definition, member

pytestmark = pytest.mark.django_db

TICKET = {"ticket_id": "T-1", "customer_email": "a@example.com", "body": "Where is my parcel?"}


@pytest.fixture
def run(team, requester):
    version, _ = workflow_save(team=team, definition=example_definition("support"), actor=SETUP)
    return run_start(version=version, input=TICKET, actor=requester)


def signed_in(client, user):
    client.force_login(user)
    return client


def test_the_run_state_counts_progress_and_lists_each_step_with_its_dag_edges(client, run, operator):
    state = signed_in(client, operator).get(reverse("admin:orchestrator_run_state", args=[run.id])).json()
    assert state["state"] == run.state
    names = [step["name"] for step in state["steps"]]
    assert names == list(run.steps.order_by("position").values_list("name", flat=True))
    assert state["progress"]["steps_total"] == len(names)
    assert state["progress"]["steps_done"] == 0
    by_name = {step["name"]: step for step in state["steps"]}
    assert by_name["draft"]["after"] == ["research", "fetch_history"]  # edges of the DAG, from the pinned definition
    assert state["last_event"] == Event.objects.filter(run=run).order_by("-id").first().id
    assert state["controls"] == {"cancel": reverse("admin:orchestrator_run_live", args=[run.id]) + "operate/cancel/"}


def test_the_run_page_and_its_state_are_not_found_for_another_teams_staff(client, run):
    stranger = member(TeamFactory(slug="other"), "stranger", role=Role.OWNER, staff=True)
    signed_in(client, stranger)
    assert client.get(reverse("admin:orchestrator_run_live", args=[run.id])).status_code == 404
    assert client.get(reverse("admin:orchestrator_run_state", args=[run.id])).status_code == 404


def test_cancel_from_the_run_page_asks_first_then_goes_through_the_service(client, run, operator):
    signed_in(client, operator)
    url = reverse("admin:orchestrator_run_operate", args=[run.id, "cancel"])
    page = client.get(url)
    assert b"Yes, cancel" in page.content
    assert Run.objects.get(id=run.id).state == run.state  # asking changed nothing
    client.post(url)
    cancelled = Event.objects.filter(run=run, kind="run.cancelling").get()
    assert cancelled.actor == "user:operator"  # audited under the person's name


def test_a_member_who_may_not_cancel_is_refused_by_the_service(client, run, team):
    viewer = member(team, "viewer", role=Role.MEMBER, staff=True)
    signed_in(client, viewer)
    response = client.post(reverse("admin:orchestrator_run_operate", args=[run.id, "cancel"]))
    assert response.status_code == 403
    assert not Event.objects.filter(run=run, kind__startswith="run.cancel").exists()


def test_the_operations_page_counts_runs_by_state_and_shows_queues_to_operators(client, run, operator, team):
    state = signed_in(client, operator).get(reverse("admin:orchestrator_operations_state")).json()
    assert state["runs_by_state"] == {run.state: 1}
    assert {q["name"] for q in state["queues"]} >= {"orchestrator", "tools"}
    fast = next(d for d in state["dependencies"] if d["dependency"] == "model:fast")
    assert set(fast) == {"dependency", "calls_this_second", "rate_limit", "breaker_open_s", "failures"}
    assert state["teams_today"][0]["team"] == team.slug and state["teams_today"][0]["started"] == 1
    viewer = member(team, "viewer", role=Role.MEMBER, staff=True)
    state = signed_in(client, viewer).get(reverse("admin:orchestrator_operations_state")).json()
    assert state["queues"] is None and state["workers"] is None and state["dependencies"] is None
    assert state["runs_by_state"] == {run.state: 1}


def test_the_api_run_detail_carries_progress_and_its_newest_event(api, run):
    body = api.get(f"/api/v1/runs/{run.id}/").json()
    assert body["progress"]["steps_total"] == run.steps.count()
    assert body["progress"]["steps_done"] == 0
    assert body["last_event"] == Event.objects.filter(run=run).order_by("-id").first().id


def test_long_polling_answers_at_once_when_the_run_has_moved_on(api, run):
    newest = Event.objects.filter(run=run).order_by("-id").first().id
    body = api.get(f"/api/v1/runs/{run.id}/?wait_for_change={newest - 1}&timeout=15").json()
    assert body["last_event"] == newest


def test_one_person_s_long_polls_are_bounded_and_others_are_still_served(
        api, run, requester, approver_api, settings):
    """Each long-poll holds a server thread while it waits: the person's one past
    STEPWISE_LONG_POLLS_PER_PERSON is answered 429 at once; another person's, and the person's
    plain reads, are served."""
    from orchestrator.web.progress import long_poll_slot  # noqa: PLC0415 - the slots the view takes

    settings.STEPWISE_LONG_POLLS_PER_PERSON = 3
    newest = Event.objects.filter(run=run).order_by("-id").first().id
    poll = f"/api/v1/runs/{run.id}/?wait_for_change={newest}&timeout=0"
    with long_poll_slot(requester.pk), long_poll_slot(requester.pk), long_poll_slot(requester.pk):
        refused = api.get(poll)  # three of this person's long-polls are waiting
        assert refused.status_code == 429, refused.content
        assert "STEPWISE_LONG_POLLS_PER_PERSON" in refused.json()["errors"][0]["message"]
        assert refused["Retry-After"]
        assert api.get(f"/api/v1/runs/{run.id}/").status_code == 200
        assert api.get("/api/v1/workflows/").status_code == 200
        other = approver_api.get(poll)
        assert other.status_code == 200 and other.json()["last_event"] == newest
    assert api.get(poll).status_code == 200  # the slots are given back when a poll answers


def test_long_polling_refuses_a_malformed_event_id(api, run):
    assert api.get(f"/api/v1/runs/{run.id}/?wait_for_change=soon").status_code == 400
    for query in ("timeout=null", "timeout=-1", "timeout=16", "timeout=nan", "wait_for_change=-1",
                  "wait_for_change=1&wait_for_change=2", "wait_for_change=1&timeout=1&timeout=2"):
        refused = api.get(f"/api/v1/runs/{run.id}/?{query}")
        assert refused.status_code == 400, query
        assert refused.json()["errors"][0]["path"] in query, query


def paused_run(team):
    """A run paused by its failed first step (on_error: pause)."""
    from orchestrator.engine.retry import StepError
    from orchestrator.engine.services.kinds.worker import Usage, step_claim, step_fail

    definition = {"name": "ops", "input_schema": {"type": "object"}, "on_error": "pause",
                  "steps": [{"name": "call", "type": "tool", "tool": "core.echo"},
                            {"name": "after", "type": "tool", "tool": "core.echo", "after": ["call"]}]}
    version, _ = workflow_save(team=team, definition=definition, actor=SETUP)
    run = run_start(version=version, input={}, actor=SETUP)
    step = run.steps.get(name="call")
    claim = step_claim(step_id=step.id, worker="test")
    step_fail(step_id=step.id, attempt=claim.attempt, error=StepError("permanent", "the remote said no"),
              usage=Usage(), worker="test")
    return Run.objects.get(id=run.id)


def test_a_paused_run_offers_retry_and_skip_of_its_failed_step_and_retry_goes_through_the_service(
        client, team, operator):
    run = paused_run(team)
    signed_in(client, operator)
    state = client.get(reverse("admin:orchestrator_run_state", args=[run.id])).json()
    assert state["state"] == "paused"
    assert set(state["controls"]) == {"cancel", "resume", "retry", "skip"}
    assert set(state["controls"]["retry"]) == {"call"}  # only the failed step
    failed = next(step for step in state["steps"] if step["name"] == "call")
    assert failed["error"]["message"] == "the remote said no" and failed["failed_attempts"] == 1

    client.post(state["controls"]["retry"]["call"])
    assert Run.objects.get(id=run.id).state == "running"
    assert run.steps.get(name="call").state == "queued"
    assert Event.objects.filter(run=run, actor="user:operator").exists()  # audited as the person


def test_retrying_a_step_that_failed_with_a_permanent_error_warns_before_confirming(
        client, team, operator):
    run = paused_run(team)  # its step failed with a permanent error
    signed_in(client, operator)
    retry = client.get(reverse("admin:orchestrator_run_state", args=[run.id])).json()["controls"]["retry"]["call"]

    page = client.get(retry).content.decode()

    assert 'class="errornote retry-warning"' in page
    assert "failed with a permanent error (the remote said no)" in page
    assert 'value="Yes, retry anyway"' in page


def test_a_transient_error_is_retried_without_a_warning():
    from orchestrator.models import StepRun
    from orchestrator.web.live.views import retry_warning
    assert retry_warning(StepRun(error={"class": "transient", "message": "503"})) == ""
    assert "a policy error" in retry_warning(StepRun(error={"class": "policy", "message": "no"}))


def test_a_member_sees_no_operator_controls_on_a_paused_run(client, team):
    run = paused_run(team)
    viewer = member(team, "viewer", role=Role.MEMBER, staff=True)
    state = signed_in(client, viewer).get(reverse("admin:orchestrator_run_state", args=[run.id])).json()
    assert state["controls"] == {}
