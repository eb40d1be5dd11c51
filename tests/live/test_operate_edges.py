"""The run page's operator controls at their edges: who is offered which, what each control's
confirmation says, the service each one calls and the words it answers with, and the steps and
methods that are refused (tests/live/test_pages.py has the common paths)."""
import uuid

import pytest
from django.contrib.messages import get_messages
from django.db import transaction
from django.urls import reverse

from orchestrator.engine.selectors import lock_run
from orchestrator.engine.services.budget_gate import run_pause_for_budget
from orchestrator.engine.services.runs import run_cancel, run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Event, Role, Run, StepRun
from tests.factories import SETUP, TeamFactory, member

from .conftest import GATED
from .test_pages import paused_run, signed_in

pytestmark = pytest.mark.django_db


def gated_run(team, actor=SETUP) -> Run:
    version, _ = workflow_save(team=team, definition=GATED, actor=SETUP)
    return run_start(version=version, input={}, actor=actor)


def controls(client, run) -> dict:
    return client.get(reverse("admin:orchestrator_run_state", args=[run.id])).json()["controls"]


def said(response) -> list[str]:
    """The messages the response leaves for the next page."""
    return [str(message) for message in get_messages(response.wsgi_request)]


def live(run) -> str:
    return reverse("admin:orchestrator_run_live", args=[run.id])


def test_the_member_who_started_a_run_is_offered_its_cancel_and_another_member_is_not(client, team):
    starter = member(team, "starter", role=Role.MEMBER, staff=True)
    other = member(team, "other", role=Role.MEMBER, staff=True)
    run = gated_run(team, actor=starter)

    assert controls(signed_in(client, starter), run) == {"cancel": f"{live(run)}operate/cancel/"}
    assert controls(signed_in(client, other), run) == {}


def test_a_paused_run_s_controls_are_its_own_operation_urls(client, team, operator):
    run = paused_run(team)
    step = run.steps.get(name="call")
    offered = controls(signed_in(client, operator), run)
    assert offered == {"cancel": f"{live(run)}operate/cancel/",
                       "resume": f"{live(run)}operate/resume/",
                       "retry": {"call": f"{live(run)}operate/retry/?step={step.id}"},
                       "skip": {"call": f"{live(run)}operate/skip/?step={step.id}"}}


def test_skipping_asks_first_then_skips_through_the_service_and_says_so(client, team, operator):
    run = paused_run(team)
    signed_in(client, operator)
    url = controls(client, run)["skip"]["call"]

    asked = client.get(url)
    page = asked.content.decode()
    assert asked.context["title"] == "Skip step call?"
    assert "<h1>Skip step call?</h1>" in page
    assert "The run goes on without this failed step" in page
    assert "step <strong>call</strong> is" in page
    assert f'<a href="{live(run)}" class="button cancel-link">' in page
    assert f"{run.version.workflow.name} {run.id}</a>" in page  # the breadcrumb names the run
    assert 'name="csrfmiddlewaretoken"' in page
    assert "retry-warning" not in page and 'value="Yes, skip"' in page
    assert run.steps.get(name="call").state == "failed"  # asking changed nothing

    done = client.post(url)
    assert done.status_code == 302 and done["Location"] == live(run)
    assert said(done) == ["Step call skipped."]
    call = run.steps.get(name="call")
    assert call.state == "skipped"
    assert Event.objects.get(run=run, step=call, kind="step.skipped").actor == "user:operator"


def test_retrying_says_which_step_is_queued_again(client, team, operator):
    run = paused_run(team)
    signed_in(client, operator)

    done = client.post(controls(client, run)["retry"]["call"])

    assert said(done) == ["Step call queued again."]
    assert done["Location"] == live(run)


def test_resuming_a_run_paused_without_a_failed_step_goes_through_the_service(client, team, operator):
    run = gated_run(team)
    with transaction.atomic():
        run_pause_for_budget(lock_run(run.id), {"reason": "over budget"})
    signed_in(client, operator)
    url = controls(client, run)["resume"]

    asked = client.get(url).content.decode()
    assert "<h1>Resume this run?</h1>" in asked
    assert "The paused run goes on from where it stopped." in asked
    assert "; step <strong>" not in asked  # no step is named for a run's operation

    done = client.post(url)
    assert said(done) == ["Resumed."]
    assert Run.objects.get(id=run.id).state != "paused"
    assert Event.objects.get(run=run, kind="run.running", actor="user:operator")


def test_resuming_a_run_whose_step_still_failed_is_refused_in_the_services_words(client, team, operator):
    run = paused_run(team)
    signed_in(client, operator)

    refused = client.post(controls(client, run)["resume"])

    assert refused.status_code == 302 and refused["Location"] == live(run)
    assert said(refused) == ["the run has failed steps: retry or skip them"]
    assert Run.objects.get(id=run.id).state == "paused"


def test_cancelling_from_the_page_records_why_and_says_so(client, team, operator):
    run = gated_run(team)
    signed_in(client, operator)

    done = client.post(controls(client, run)["cancel"])

    assert said(done) == ["Cancel requested."]
    assert done["Location"] == live(run)
    cancelling = Event.objects.get(run=run, kind="run.cancelling")
    assert cancelling.payload == {"reason": "cancelled from the run page"}


def test_a_step_of_another_run_or_no_step_at_all_is_not_found(client, team, operator):
    """The step of a retry or skip is looked for in the run of the URL only: another run's step,
    even one of a team the person cannot see, is neither shown nor operated on."""
    run = paused_run(team)
    elsewhere = paused_run(TeamFactory(slug="other"))
    foreign = elsewhere.steps.get(name="call")
    signed_in(client, operator)
    base = f"{live(run)}operate/"
    for operation in ("retry", "skip"):
        for query in (f"?step={foreign.id}", "", "?step=", "?step=call", "?step=%C2%B2", "?step=1.5", "?step=-1",
                      f"?step={10**30}"):
            response = client.get(f"{base}{operation}/{query}")
            assert response.status_code == 404, (operation, query)
            assert client.post(f"{base}{operation}/{query}").status_code == 404, (operation, query)
    assert StepRun.objects.get(id=foreign.id).state == "failed"


def test_with_debug_on_each_page_not_found_says_what_was_not_found(client, team, operator, settings):
    """A 404's words reach a person only through Django's page for DEBUG (the one a developer
    reads): the run, the step and the operation each named."""
    settings.DEBUG = True
    run = paused_run(team)
    signed_in(client, operator)
    missing_run = live(run).replace(str(run.id), str(uuid.uuid4()))
    pages = {f"{missing_run}operate/cancel/": "no such run, or not one of your teams&#x27;",
             f"{live(run)}operate/retry/?step=call": "no such step in this run",
             f"{live(run)}operate/delete/": "delete"}
    for url, words in pages.items():
        response = client.get(url)
        assert response.status_code == 404, url
        assert f'<pre class="exception_value">{words}</pre>' in response.content.decode(), url


def test_an_unknown_operation_is_not_found(client, team, operator):
    run = gated_run(team)
    signed_in(client, operator)
    assert client.get(f"{live(run)}operate/delete/").status_code == 404
    assert client.post(f"{live(run)}operate/delete/").status_code == 404


def test_an_operation_answers_only_get_and_post(client, team, operator):
    run = gated_run(team)
    signed_in(client, operator)

    refused = client.put(f"{live(run)}operate/cancel/")

    assert refused.status_code == 405 and refused["Allow"] == "GET, POST"
    assert Run.objects.get(id=run.id).state == run.state


def test_an_operation_on_a_run_that_has_ended_is_refused_in_the_services_words(client, team, operator):
    run = gated_run(team)
    run_cancel(run_id=run.id, actor=SETUP)
    ended = Run.objects.get(id=run.id)
    assert ended.state == "cancelled"
    signed_in(client, operator)

    refused = client.post(f"{live(run)}operate/cancel/")

    assert refused.status_code == 302 and refused["Location"] == live(run)
    assert said(refused) == [f"run {run.id} has already ended (cancelled)"]
