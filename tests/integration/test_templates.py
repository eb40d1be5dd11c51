"""Every template of the gallery runs to completion through real worker processes, on the
scripted provider, from its sample input: saved from the gallery (`template_instantiate`), started
as a person would start it — the event-driven one fired through its trigger — and any approval it
asks for decided by a reviewer. The moderation template's three bands and both risk tiers, and the
revise loop's iterations as step runs, are checked too."""
import pytest
from rest_framework.authtoken.models import Token

from approvals.models import ApprovalRequest, InputTask
from orchestrator.engine.gallery import template_named, templates
from orchestrator.engine.services.gallery import template_instantiate
from orchestrator.engine.services.kinds.human_gate import approval_grant
from orchestrator.engine.services.kinds.human_input import input_answer
from orchestrator.engine.services.runs import run_start
from orchestrator.models import Run, StepRun
from stepwise_client import Stepwise, StepwiseError
from stepwise_client.__main__ import main as client_main
from stepwise_client.builder import Workflow
from tests.factories import member
from triggers.services.config import trigger_create
from triggers.services.firing import trigger_fire_api

from .conftest import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
ENDED = ("completed", "failed", "cancelled", "timed_out", "paused")


@pytest.fixture
def people(team):
    editor = member(team, "editor")
    reviewer = member(team, "reviewer", role="member",
                      groups=("support_leads", "moderators", "moderation_leads", "clerks"))
    return editor, reviewer


# What a person answers each template's input task with.
ANSWERS = {"ask_iban": {"iban": "DE89370400440532013000", "source": "vendor master data"}}


def run_through(run: Run, reviewer) -> Run:
    """Wait for the run to end, approving each approval and answering each input task it waits
    for on the way."""
    def settled():
        current = Run.objects.get(id=run.id)
        if current.state in ENDED:
            return current
        return (ApprovalRequest.objects.filter(run_id=run.id, state="pending").first()
                or InputTask.objects.filter(run_id=run.id, state="open").first())

    while True:
        try:
            found = wait_for(settled, timeout=60)
        except AssertionError:
            raise AssertionError([(s.name, s.state, s.error) for s in run.steps.all()]) from None
        if isinstance(found, Run):
            return found
        if isinstance(found, InputTask):
            input_answer(task_id=found.id, user=reviewer, answer=ANSWERS[found.step.name])
            continue
        approval_grant(approval_id=found.id, user=reviewer, proposal_hash=found.proposal_hash,
                       note="ok")


def start(template: str, team, editor, text_input: dict | None = None) -> Run:
    version, _ = template_instantiate(template=template, team=team, actor=editor)
    return run_start(version=version, input=text_input or template_named(template).sample_input,
                     actor=editor)


@pytest.mark.parametrize("template", [t.name for t in templates() if not t.trigger])
def test_each_template_runs_to_completion_from_its_sample_input(workers, team, people, template):
    editor, reviewer = people
    run = run_through(start(template, team, editor), reviewer)
    assert run.state == "completed", (run.error, [(s.name, s.state, s.error) for s in run.steps.all()])


def test_the_event_driven_template_runs_when_its_trigger_fires(workers, team, people):
    editor, reviewer = people
    template = template_named("incident-alert")
    template_instantiate(template=template.name, team=team, actor=editor)
    trigger, _ = trigger_create(team=team, kind="api", name="monitoring", workflow=template.name,
                                actor=editor, input_template=template.trigger["input_template"])
    outcome = trigger_fire_api(trigger_id=trigger.id, key="alert-A-9", actor=editor, payload={
        "id": "A-9", "service": "checkout", "severity": "critical", "text": "p99 above 2 s"})
    run = run_through(Run.objects.get(id=outcome.run.id), reviewer)
    assert run.state == "completed"
    states = dict(run.steps.values_list("name", "state"))
    assert (states["page"], states["ticket"]) == ("completed", "skipped")


def test_the_order_template_waits_for_its_payment_and_a_correlated_confirmation_ships_it(
        workers, team, people):
    editor, reviewer = people
    template = template_named("order-payment")
    run = start(template.name, team, editor)
    wait_for(lambda: run.steps.filter(name="payment", state="waiting").exists(), timeout=60)
    trigger, _ = trigger_create(team=team, kind="api", name="payments", workflow=template.name,
                                actor=editor, correlate="payload.order_id",
                                input_template=template.trigger["input_template"])
    outcome = trigger_fire_api(trigger_id=trigger.id, key="pay-O-1001", actor=editor,
                               payload={"order_id": "O-1001", "amount": 42.5})
    assert (outcome.status, outcome.run.id) == ("signalled", run.id)
    run = run_through(Run.objects.get(id=run.id), reviewer)
    assert run.state == "completed"
    states = dict(run.steps.values_list("name", "state"))
    assert (states["ship"], states["release_stock"]) == ("completed", "skipped")
    assert run.steps.get(name="payment").output == {"order_id": "O-1001", "amount": 42.5}


def test_the_revise_loop_shows_each_iteration_as_its_steps(workers, team, people):
    editor, reviewer = people
    run = run_through(start("revise-until-approved", team, editor), reviewer)
    assert run.state == "completed"
    names = set(StepRun.objects.filter(run=run).values_list("name", flat=True))
    assert names == {"write", "draft[1]", "critique[1]", "draft[2]", "critique[2]", "publish"}
    write = run.steps.get(name="write")
    assert write.output["iterations"] == 2
    assert run.steps.get(name="publish").output["text"].startswith("Draft 2:")


@pytest.mark.parametrize(("text", "ran", "skipped", "gates"), [
    ("Thanks for the write-up.", {"publish"}, {"review", "enforce", "apply"}, 0),
    ("You idiot, that is wrong.", {"review", "publish"}, {"enforce", "apply"}, 1),  # uncertain band
    ("buy now at cheap.example", {"enforce", "apply"}, {"publish", "review", "approve_enforcement"}, 0),
    ("buy now again at cheap.example", {"enforce", "approve_enforcement", "apply"}, {"publish"}, 1),
])
def test_moderation_takes_the_band_and_the_risk_tier_its_scores_give(workers, team, people, text,
                                                                     ran, skipped, gates):
    editor, reviewer = people
    run = run_through(start("content-moderation", team, editor,
                            {"content_id": "P-1", "author": "jo", "text": text}), reviewer)
    assert run.state == "completed"
    states = dict(run.steps.values_list("name", "state"))
    assert all(states[n] == "completed" for n in ran), states
    assert all(states[n] == "skipped" for n in skipped), states
    assert ApprovalRequest.objects.filter(run_id=run.id).count() == gates


def test_the_client_saves_a_workflow_written_in_python(live_server, team, people, monkeypatch, capsys):
    editor, _ = people
    wf = Workflow("from-python", input_schema={"type": "object"})
    wf.tool("echo", tool="core.echo", params={"hello": "world"})
    # The server's first request warms it (URLs, schemas, templates): on a loaded machine that
    # takes longer than the client's default timeout, which this test is not about.
    with Stepwise(live_server.url, token=Token.objects.create(user=editor).key,
                  timeout=120) as stepwise:
        saved = stepwise.save_workflow(wf)
        assert (saved["workflow"], saved["number"], saved["created"]) == ("from-python", 1, True)
        assert stepwise.save_workflow(wf.to_dict())["created"] is False
        broken = Workflow("from-python", input_schema={"type": "object"})
        broken.tool("echo", tool="core.echo", after=["nowhere"])
        with pytest.raises(StepwiseError) as refused:
            stepwise.save_workflow(broken)
    assert refused.value.status == 400
    assert refused.value.errors[0]["path"] == "steps[0].after[0]"

    token = Token.objects.get(user=editor).key
    monkeypatch.setenv("STEPWISE_URL", live_server.url)
    monkeypatch.setenv("STEPWISE_TOKEN", token)
    assert client_main(["save", "examples.python.lead_routing:workflow"]) == 0
    assert "workflow lead-routing v1" in capsys.readouterr().out
    assert client_main(["save", "tests.definitions.test_builder:BROKEN"]) == 1
    assert "steps[0].after[0]: unknown step 'missing'" in capsys.readouterr().err
