"""Human input on the whole stack: real worker processes, the real broker and database, and the
API served by a real server. The gallery's missing-field template runs until its clerk's task,
holding no worker; the clerk answers through the Python client and the run resumes on the
workers with the answer, or abstains and the run takes the abstain branch. A document that has
its IBAN never asks."""
import pytest
from rest_framework.authtoken.models import Token

from approvals.models import InputTask
from orchestrator.engine.gallery import template_named
from orchestrator.engine.services.gallery import template_instantiate
from orchestrator.engine.services.runs import run_start
from orchestrator.models import Run, StepRun
from stepwise_client import Stepwise, StepwiseError
from tests.factories import member

from .conftest import wait_for_run

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

IBAN = "DE89370400440532013000"


@pytest.fixture
def clerk(team):
    return member(team, "clerk", role="member", groups=("clerks",))


def started(team, text: str | None = None) -> Run:
    editor = member(team, "editor")
    version, _ = template_instantiate(template="missing-field", team=team, actor=editor)
    sample = dict(template_named("missing-field").sample_input)
    return run_start(version=version, input={**sample, **({"text": text} if text else {})},
                     actor=editor)


def outputs(run: Run) -> dict:
    return dict(StepRun.objects.filter(run=run).values_list("name", "output"))


def test_a_run_waits_for_a_clerk_then_resumes_on_the_workers_with_the_answer(
        workers, live_server, team, clerk):
    run = started(team)
    waiting = wait_for_run(run.id, states=("waiting", "completed", "failed"), timeout=60)
    assert waiting.state == "waiting"
    assert StepRun.objects.get(run=run, name="ask_iban").queue == ""  # no worker holds it

    with Stepwise(live_server.url, token=Token.objects.create(user=clerk).key) as stepwise:
        [task] = stepwise.input_tasks(str(run.id))
        assert task.step == "ask_iban" and task.form["required"] == ["iban"]
        assert "Payable within 30 days" in task.data["evidence"][0]["value"]
        with pytest.raises(StepwiseError) as refused:
            stepwise.answer(task, {"iban": "not an iban"})
        assert refused.value.status == 400
        assert {e["path"] for e in refused.value.errors} == {"answer.iban"}  # too short, no pattern
        assert stepwise.answer(task, {"iban": IBAN}).state == "answered"
        with pytest.raises(StepwiseError) as stale:
            stepwise.answer(task, {"iban": IBAN})
        assert stale.value.status == 409

    done = wait_for_run(run.id, states=("completed", "failed"), timeout=60)
    assert done.state == "completed", done.error
    stored = outputs(run)["store"]
    assert stored["iban"] == IBAN and stored["given_by"] == "clerk"
    assert dict(run.steps.values_list("name", "state"))["manual_handling"] == "skipped"


def test_an_abstention_takes_the_manual_branch(workers, live_server, team, clerk):
    run = started(team)
    wait_for_run(run.id, states=("waiting",), timeout=60)
    with Stepwise(live_server.url, token=Token.objects.create(user=clerk).key) as stepwise:
        [task] = stepwise.input_tasks(str(run.id))
        stepwise.answer(task, abstain=True, note="not in the vendor records")
    done = wait_for_run(run.id, states=("completed", "failed"), timeout=60)
    assert done.state == "completed", done.error
    states = dict(run.steps.values_list("name", "state"))
    assert states["manual_handling"] == "completed" and states["store"] == "skipped"
    assert InputTask.objects.get(run=run).state == "abstained"


def test_a_document_with_its_iban_never_asks(workers, team):
    run = started(team, text=f"Invoice INV-2291 from Acme Ltd. Pay to IBAN {IBAN} within 30 days.")
    done = wait_for_run(run.id, states=("completed", "failed"), timeout=60)
    assert done.state == "completed", done.error
    assert outputs(run)["store_found"]["iban"] == IBAN
    assert not InputTask.objects.filter(run=run).exists()
