"""Forks on real workers: an e-mail the source run sent is not sent again by a fork, counted at
a local SMTP server (tests/support/smtp_sink.py), unless the fork asks for it by name; a fork
with an input that fails the schema is a 400 with its path, and starts nothing."""
import json

import pytest
from django.conf import settings

from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Effect, Event, Role, Run, StepRun
from tests.conftest import client_for
from tests.factories import SETUP, member
from tests.support.smtp_sink import SmtpSink

from .conftest import wait_for_run

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

NOTIFY = {
    "name": "notify",
    "input_schema": {"type": "object", "required": ["order"],
                     "properties": {"order": {"type": "string", "pattern": "^A-[0-9]+$"}}},
    "steps": [
        {"name": "compose", "type": "tool", "tool": "core.echo",
         "params": {"subject": "Order {{ input.order }} shipped"}},
        {"name": "email", "type": "tool", "tool": "mail.send", "side_effect": True,
         "after": ["compose"],
         "params": {"connection": "relay", "to": ["ann@example.com"],
                    "subject": "{{ steps.compose.output.subject }}", "body": "On its way."}},
        {"name": "record", "type": "tool", "tool": "core.echo", "after": ["email"],
         "params": {"sent": "{{ steps.email.output.message_id }}"}},
    ],
}


@pytest.fixture(scope="module")
def smtp(workers):
    """A local SMTP server, the workers' "relay" mail connection pointing at it."""
    with SmtpSink() as sink:
        connections = {**settings.STEPWISE_CONNECTIONS,
                       "relay": {"kind": "mail", "host": "127.0.0.1", "port": sink.port,
                                 "from_email": "stepwise@example.com",
                                 "allowed_domains": ["example.com"]}}
        before = dict(workers.env)
        workers.stop()
        workers.env["STEPWISE_CONNECTIONS"] = json.dumps(connections)
        workers.start()
        saved, settings.STEPWISE_CONNECTIONS = settings.STEPWISE_CONNECTIONS, connections
        yield sink
        settings.STEPWISE_CONNECTIONS = saved
        # Left stopped with the session's environment: the next test that asks for the
        # workers starts them (tests/conftest.py), and one that does not never waits for them.
        workers.stop()
        workers.env.clear()
        workers.env.update(before)


@pytest.fixture
def requester(team):
    return member(team, "requester", role=Role.MEMBER)


@pytest.fixture
def source(team, requester, smtp) -> Run:
    """A completed run of NOTIFY: one e-mail sent."""
    version, _ = workflow_save(team=team, definition=NOTIFY, actor=SETUP)
    sent = len(smtp.messages)
    run = wait_for_run(run_start(version=version, input={"order": "A-1"}, actor=requester).id,
                       states=("completed", "failed"), timeout=60)
    assert run.state == "completed", run.error
    assert len(smtp.messages) == sent + 1
    return run


def fork(api, source: Run, **body) -> Run:
    response = api.post(f"/api/v1/runs/{source.id}/fork/", body, format="json")
    assert response.status_code == 202, response.json()
    run = wait_for_run(response.json()["id"], states=("completed", "failed"), timeout=60)
    assert run.state == "completed", run.error
    return run


def test_a_fork_does_not_send_the_email_its_source_sent(source, requester, smtp):
    api = client_for(requester)
    sent = len(smtp.messages)

    rerun = fork(api, source, step="compose")  # the e-mail step runs again, the ledger answers
    after = fork(api, source, step="record")  # the e-mail step is carried over

    assert len(smtp.messages) == sent
    email = StepRun.objects.get(run=rerun, name="email")
    assert email.state == "completed"
    assert email.output == StepRun.objects.get(run=source, name="email").output
    assert Event.objects.filter(run=rerun, step=email, kind="effect.replayed").count() == 1
    assert not Effect.objects.filter(run=rerun).exists()
    assert StepRun.objects.get(run=after, name="email").output == email.output
    assert Event.objects.filter(run=after, kind="step.carried").count() == 2


def test_a_fork_that_asks_to_repeat_the_email_sends_it_once(source, requester, smtp):
    api = client_for(requester)
    sent = len(smtp.messages)

    repeated = fork(api, source, step="compose", input={"order": "A-2"},
                    repeat_effects=["email"], reason="the customer lost it")

    assert len(smtp.messages) == sent + 1
    assert smtp.messages[-1]["Subject"] == "Order A-2 shipped"
    effect = Effect.objects.get(run=repeated)
    assert (effect.step.name, effect.status) == ("email", "succeeded")
    audit = Event.objects.get(run=repeated, kind="fork.effect_repeat")
    assert (audit.actor, audit.payload["reason"]) == ("user:requester", "the customer lost it")


def test_a_fork_whose_input_fails_the_schema_is_a_400_with_its_path(source, requester, smtp):
    response = client_for(requester).post(f"/api/v1/runs/{source.id}/fork/",
                                          {"step": "compose", "input": {"order": "B-1"}},
                                          format="json")

    assert response.status_code == 400
    assert [e["path"] for e in response.json()["errors"]] == ["input.order"]
    assert not Run.objects.filter(forked_from=source).exists()
