"""The typed Python client (stepwise_client) against a live server and real workers: the
example program takes a support run through its gate; start, fire, wait, approve and cancel."""
import pytest
from rest_framework.authtoken.models import Token

from examples.support_client import handle_ticket
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Run
from stepwise_client import Stepwise, StepwiseError, WaitTimeout
from tests.factories import SETUP, example_definition, member
from triggers.services.config import trigger_create

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
INPUT = {"ticket_id": "T-1", "body": "Please refund my invoice", "customer_email": "c@example.com"}


@pytest.fixture
def stepwise(live_server, team):
    user = member(team, "bot", groups=("support_leads",))
    workflow_save(team=team, definition=example_definition("support"), actor=SETUP)
    with Stepwise(live_server.url, token=Token.objects.create(user=user).key) as client:
        yield client


@pytest.fixture
def supervisor(live_server, team):
    """A support lead who did not start the runs, so may approve them."""
    user = member(team, "supervisor", role="member", groups=("support_leads",))
    with Stepwise(live_server.url, token=Token.objects.create(user=user).key) as client:
        yield client


def test_the_example_program_takes_a_support_run_through_its_gate(workers, stepwise, supervisor):
    assert handle_ticket(stepwise, supervisor, "T-9", "Refund please", "c@example.com") == "completed"
    assert handle_ticket(stepwise, supervisor, "T-9", "Refund please", "c@example.com") == "completed"
    assert Run.objects.count() == 1  # the same ticket twice: one run (its idempotency key)


def test_start_wait_cancel_and_errors(workers, stepwise):
    run = stepwise.start("support-reply", INPUT, idempotency_key="k-1")
    assert stepwise.start("support-reply", INPUT, idempotency_key="k-1").id == run.id
    with pytest.raises(StepwiseError) as conflict:
        stepwise.start("support-reply", {**INPUT, "ticket_id": "T-2"}, idempotency_key="k-1")
    assert conflict.value.status == 409
    with pytest.raises(StepwiseError) as invalid:
        stepwise.start("support-reply", {"ticket_id": "T-3"})
    assert invalid.value.status == 400 and {e["path"] for e in invalid.value.errors} == {
        "input"}
    waiting = stepwise.wait(run.id, until={"waiting"}, timeout=60)
    with pytest.raises(WaitTimeout):
        stepwise.wait(run.id, timeout=0.5, poll=0.1)
    assert stepwise.cancel(waiting.id).state in ("cancelling", "cancelled")
    assert stepwise.wait(run.id, timeout=60).state == "cancelled"


def test_firing_a_programmatic_trigger(workers, stepwise, team):
    trigger, _ = trigger_create(team=team, kind="api", name="bot", workflow="support-reply",
                                actor=SETUP, input_template={
                                    "ticket_id": "{{ payload.id }}", "body": "{{ payload.text }}",
                                    "customer_email": "c@example.com"})
    fired = stepwise.fire(str(trigger.id), {"id": "T-5", "text": "Hi"}, idempotency_key="T-5")
    again = stepwise.fire(str(trigger.id), {"id": "T-5", "text": "Hi"}, idempotency_key="T-5")
    assert (fired.status, again.status, again.run) == ("started", "duplicate", fired.run)
    run = stepwise.wait(fired.run, until={"waiting"}, timeout=60)
    assert run.trigger == "api"
    assert run.data["started_by"]["name"] == "bot"
