"""A sandboxed run (`Run.sandbox`: orchestrator/engine/sandbox.py) reaches no side-effecting
tool, no person and no callback: each side-effecting call is answered from the sandbox through
the effect ledger (and recorded as `step.sandboxed`), each gate decided and each input answered
at once by `service:evaluation`. Reads still reach the world. A bad sandbox is refused at start.

Runs are driven in this process, service by service, as workers would (the test transaction
never commits, so nothing is consumed from the broker); a local HTTP sink stands in for the
remote a side-effecting step would call, and counts what reaches it.
"""
import pytest

from alerts.models import Alert
from approvals.authority import inbox, on_the_way
from approvals.models import ApprovalRequest, ApprovalState, InputTask
from examples.tools import refunds_path
from notifications.models import Notification
from orchestrator.engine.errors import InputInvalid
from orchestrator.engine.services.kinds.sub_workflow import child_run_start
from orchestrator.engine.services.kinds.worker import step_execute
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Effect, Event, Run, StepRun
from tests.factories import SETUP, example_definition
from tests.support.http_sink import HttpSink

pytestmark = pytest.mark.django_db

SANDBOX = {"purpose": "evaluation", "responses": {}, "decisions": {}}
PAID = {"status": 201, "body": {"payment": "p-1"}}


@pytest.fixture
def sink():
    with HttpSink() as sink:
        yield sink


def save(team, *steps, name="sandboxed", **definition):
    version, _ = workflow_save(team=team, definition={
        "name": name, "input_schema": {"type": "object"}, "steps": list(steps), **definition},
        actor=SETUP)
    return version


def pay(sink, **extra) -> dict:
    return {"name": "pay", "type": "tool", "tool": "http.request", "side_effect": True,
            "retry": {"max_attempts": 1},
            "params": {"method": "POST", "url": f"{sink.url}/pay", "json": {"amount": 10}},
            **extra}


def drive(run: Run, *, rounds: int = 20) -> Run:
    """Run every queued step of `run` as a worker would, until none is left."""
    for _ in range(rounds):
        queued = list(StepRun.objects.filter(run=run, state="queued").values_list("id", flat=True))
        if not queued:
            break
        for step_id in queued:
            step_execute(step_id=step_id, worker="test")
    return Run.objects.get(pk=run.pk)


def steps(run: Run) -> dict[str, StepRun]:
    return {s.name: s for s in StepRun.objects.filter(run=run)}


def sandboxed_events(run: Run) -> list[dict]:
    return [e.payload for e in Event.objects.filter(run=run, kind="step.sandboxed").order_by("id")]


# --- the shape of a sandbox --------------------------------------------------------------------


@pytest.mark.parametrize("sandbox, path", [
    ("approve everything", "sandbox"),
    ({"purpose": "rehearsal"}, "sandbox.purpose"),
    ({"responses": ["pay"]}, "sandbox.responses"),
    ({"decisions": {"approve": "maybe"}}, "sandbox.decisions.approve"),
    ({"decisions": "approve"}, "sandbox.decisions"),
    ({"purpose": "shadow", "answers": {}}, "sandbox.answers"),
    ({"responses": {"pay": float("nan")}}, "sandbox.responses.pay"),
])
def test_a_sandbox_of_the_wrong_shape_is_refused_by_path_and_nothing_is_created(team, sink, sandbox, path):
    version = save(team, pay(sink))

    with pytest.raises(InputInvalid) as refused:
        run_start(version=version, input={}, actor=SETUP, sandbox=sandbox)

    assert path in [p["path"] for p in refused.value.problems]
    assert not Run.objects.exists()


def test_an_unknown_capacity_and_a_sandboxed_callback_are_refused(team, sink):
    version = save(team, pay(sink))
    with pytest.raises(InputInvalid) as refused:
        run_start(version=version, input={}, actor=SETUP, capacity="overnight")
    assert [p["path"] for p in refused.value.problems] == ["capacity"]
    with pytest.raises(InputInvalid) as refused:
        run_start(version=version, input={}, actor=SETUP, sandbox=SANDBOX,
                  callback_url=f"{sink.url}/hook", callback_secret="s" * 32)
    assert [p["path"] for p in refused.value.problems] == ["callback_url"]
    assert not Run.objects.exists()


def test_the_run_keeps_its_sandbox_and_its_start_records_what_answers(team, sink):
    sandbox = {"purpose": "shadow", "responses": {"pay": PAID}, "decisions": {"approve": "reject"}}
    run = run_start(version=save(team, pay(sink)), input={}, actor=SETUP, sandbox=sandbox,
                    capacity="evaluation")

    run = Run.objects.get(pk=run.pk)
    assert (run.sandbox, run.capacity) == (sandbox, "evaluation")
    created = Event.objects.get(run=run, kind="run.created").payload
    assert created["capacity"] == "evaluation"
    assert created["sandbox"] == {"purpose": "shadow", "responses": ["pay"],
                                  "decisions": {"approve": "reject"}}


# --- side-effecting tools ----------------------------------------------------------------------


def test_the_sink_is_reached_by_the_same_run_unsandboxed(team, sink):
    """The control: without a sandbox the step does reach the sink, so its silence below is
    the sandbox's doing."""
    run = drive(run_start(version=save(team, pay(sink)), input={}, actor=SETUP))

    assert run.state == "completed"
    assert len(sink.requests) == 1
    assert steps(run)["pay"].output["status"] == 200
    assert sandboxed_events(run) == []


def test_a_sandboxed_side_effect_completes_with_its_declared_response_and_reaches_nothing(team, sink):
    run = run_start(version=save(team, pay(sink)), input={}, actor=SETUP,
                    sandbox={**SANDBOX, "responses": {"pay": PAID}})

    run = drive(run)

    assert run.state == "completed", run.error
    assert sink.arrived == 0
    step = steps(run)["pay"]
    assert step.output == PAID
    key = f"{run.id}:pay:default"
    assert sandboxed_events(run) == [{
        "tool": "http.request", "response_declared": True, "key": key, "action": "default",
        "params": {"method": "POST", "url": f"{sink.url}/pay", "json": {"amount": 10}}}]
    # Through the effect ledger like a live call: once, under its key.
    effect = Effect.objects.get(key=key)
    assert (effect.status, effect.result) == ("succeeded", PAID)


def test_an_undeclared_side_effect_says_what_it_would_have_called(team, sink):
    run = drive(run_start(version=save(team, pay(sink)), input={}, actor=SETUP, sandbox=SANDBOX))

    assert run.state == "completed"
    assert sink.arrived == 0
    params = {"method": "POST", "url": f"{sink.url}/pay", "json": {"amount": 10}}
    assert steps(run)["pay"].output == {"sandboxed": True, "tool": "http.request", "params": params}
    assert [e["response_declared"] for e in sandboxed_events(run)] == [False]


def test_a_declared_response_its_schema_refuses_fails_the_step_saying_why(team, sink):
    schema = {"type": "object", "required": ["status"], "properties": {"status": {"type": "integer"}}}
    run = run_start(version=save(team, pay(sink, output_schema=schema)), input={}, actor=SETUP,
                    sandbox={**SANDBOX, "responses": {"pay": {"status": "paid"}}})

    run = drive(run)

    assert run.state == "failed"
    error = steps(run)["pay"].error
    assert error["class"] == "validation"
    assert error["message"].startswith("sandbox.responses.pay: output does not match output_schema")
    assert sink.arrived == 0


def test_a_read_still_reaches_the_world_in_a_sandboxed_run(team, sink):
    read = {"name": "look", "type": "tool", "tool": "http.request",
            "params": {"method": "POST", "url": f"{sink.url}/lookup"}}
    run = drive(run_start(version=save(team, read, pay(sink, after=["look"])), input={},
                          actor=SETUP, sandbox=SANDBOX))

    assert run.state == "completed"
    assert [r["path"] for r in sink.requests] == ["/lookup"]
    assert [e["params"]["url"] for e in sandboxed_events(run)] == [f"{sink.url}/pay"]


def test_a_map_s_side_effecting_items_are_answered_by_the_sandbox(team, sink):
    from orchestrator.engine.services.kinds import map_step

    each = {"name": "each", "type": "map", "over": "input.items", "item": {
        "type": "tool", "tool": "http.request", "side_effect": True, "retry": {"max_attempts": 1},
        "params": {"method": "POST", "url": f"{sink.url}/item", "json": {"n": "{{ item }}"}}}}
    run = run_start(version=save(team, each), input={"items": [1, 2]}, actor=SETUP,
                    sandbox={**SANDBOX, "responses": {"each": {"status": 202, "body": None}}})
    step = steps(run)["each"]

    for index in (0, 1):
        assert map_step.map_item_run(step_id=step.id, index=index).verdict == map_step.DONE
    assert map_step.map_join(step_id=step.id)

    assert sink.arrived == 0
    assert StepRun.objects.get(pk=step.pk).output == [{"status": 202, "body": None}] * 2
    assert sorted(e["key"] for e in sandboxed_events(run)) == [
        f"{run.id}:each:item-0", f"{run.id}:each:item-1"]


def test_a_sandboxed_run_that_fails_compensates_in_the_sandbox(team, sink):
    from orchestrator.engine.services.compensation import run_compensate

    undo = {"tool": "http.request", "params": {"method": "POST", "url": f"{sink.url}/refund"}}
    fail = {"name": "ship", "type": "tool", "tool": "http.request", "after": ["pay"],
            "retry": {"max_attempts": 1},
            "params": {"method": "POST", "url": f"{sink.url}/ship"}}
    sink.refuse("/ship", 422)
    run = drive(run_start(version=save(team, pay(sink, compensate=undo), fail), input={},
                          actor=SETUP, sandbox=SANDBOX))
    assert run.state == "compensating"

    assert run_compensate(run_id=run.id)

    assert Run.objects.get(pk=run.pk).state == "failed"
    assert [r["path"] for r in sink.requests] == ["/ship"]  # a read: it was let through
    assert [(e["action"], e["params"]["url"]) for e in sandboxed_events(run)] == [
        ("default", f"{sink.url}/pay"), ("compensate", f"{sink.url}/refund")]


# --- gates and inputs ------------------------------------------------------------------------


def refund_run(team, message: str, **sandbox) -> Run:
    version, _ = workflow_save(team=team, definition=example_definition("refund-proposal"),
                               actor=SETUP)
    return run_start(version=version, input={"order_id": "ORD-1002", "message": message},
                     actor=SETUP, sandbox={**SANDBOX, **sandbox}, capacity="evaluation")


def test_an_approved_gate_decides_at_once_and_the_step_after_it_reads_its_output(team, approver):
    notified = Notification.objects.count()
    refunds = refunds_path().read_text() if refunds_path().exists() else ""

    run = drive(refund_run(team, "My parcel never arrived."))

    assert run.state == "completed", run.error
    gate, refund = steps(run)["approve"], steps(run)["refund"]
    assert gate.started_at is not None  # it would have asked
    assert gate.output["approved"] is True and gate.output["decided_by"] == "evaluation"
    assert gate.output["proposal"]["params"] == {"order_id": "ORD-1002", "amount_usd": 1200.0}
    # The refund's params come from steps.approve.output.proposal: the gate's own output.
    assert refund.output == {"sandboxed": True, "tool": "shop.refund", "params": {
        "order_id": "ORD-1002", "amount_usd": "1200.0",
        "proposal_hash": gate.output["proposal_hash"]}}
    approval = ApprovalRequest.objects.get(run=run)
    assert (approval.state, approval.decided_by) == (ApprovalState.APPROVED, None)
    assert [(e.kind, e.actor) for e in Event.objects.filter(run=run, kind__startswith="approval.")
            .order_by("id")] == [("approval.requested", "service:stepwise"),
                                 ("approval.approved", "service:evaluation")]
    assert Event.objects.get(step=gate, kind="step.completed").actor == "service:evaluation"
    assert Notification.objects.count() == notified
    assert not inbox(approver).exists() and on_the_way(approver) == 0
    assert (refunds_path().read_text() if refunds_path().exists() else "") == refunds


def test_a_rejected_gate_fails_as_a_rejection_and_nothing_after_it_runs(team):
    run = drive(refund_run(team, "My parcel never arrived.", decisions={"approve": "reject"}))

    assert run.state == "failed"
    gate = steps(run)["approve"]
    assert gate.started_at is not None
    assert gate.error["class"] == "rejected"
    assert "sandbox.decisions.approve" in gate.error["message"]
    assert ApprovalRequest.objects.get(run=run).state == ApprovalState.REJECTED
    assert steps(run)["refund"].state in ("cancelled", "skipped", "blocked")
    assert sandboxed_events(run) == []
    assert not Alert.objects.filter(run=run).exists()


def test_a_gate_the_risk_rules_skip_asks_nobody_and_the_reply_is_sandboxed(team):
    run = drive(refund_run(team, "Just wanted to say hi."))

    assert run.state == "completed"
    assert steps(run)["approve"].state == "skipped"
    assert not ApprovalRequest.objects.filter(run=run).exists()
    assert [e["tool"] for e in sandboxed_events(run)] == ["email.send"]


FORM = {"type": "object", "required": ["label"], "properties": {"label": {"type": "string"}}}


def ask(team):
    return save(team, {"name": "label", "type": "human_input", "group": "support_leads",
                       "form": FORM, "deadline_s": 3600},
                {"name": "echo", "type": "tool", "tool": "core.echo", "after": ["label"],
                 "params": {"label": "{{ steps.label.output.answer.label }}"}}, name="asked")


def test_a_human_input_is_answered_from_the_sandbox_and_no_task_is_opened(team):
    run = drive(run_start(version=ask(team), input={}, actor=SETUP,
                          sandbox={**SANDBOX, "responses": {"label": {"label": "refund"}}}))

    assert run.state == "completed", run.error
    label = steps(run)["label"]
    assert label.started_at is not None
    assert label.output == {"answer": {"label": "refund"}, "answered_by": "evaluation",
                            "abstained": False}
    assert steps(run)["echo"].output == {"label": "refund"}
    assert not InputTask.objects.filter(run=run).exists()


@pytest.mark.parametrize("responses, message", [
    ({}, "declares no answer"),
    ({"label": {"colour": "red"}}, "does not fit the form"),
])
def test_a_human_input_without_a_fitting_answer_fails_saying_why(team, responses, message):
    run = drive(run_start(version=ask(team), input={}, actor=SETUP,
                          sandbox={**SANDBOX, "responses": responses}))

    assert run.state == "failed"
    error = steps(run)["label"].error
    assert error["class"] == "validation" and message in error["message"]
    assert not InputTask.objects.filter(run=run).exists()


# --- children ---------------------------------------------------------------------------------


def test_a_child_run_has_its_parent_s_capacity_and_sandbox(team, sink):
    save(team, pay(sink), name="child")
    parent = run_start(version=save(team, {"name": "call", "type": "sub_workflow",
                                           "workflow": "child", "input": {}}, name="parent"),
                       input={}, actor=SETUP, capacity="evaluation",
                       sandbox={**SANDBOX, "responses": {"pay": PAID}})
    call = steps(parent)["call"]

    assert child_run_start(parent_step_id=call.id)

    child = Run.objects.get(parent_step=call)
    assert (child.capacity, child.sandbox) == ("evaluation", parent.sandbox)
    assert steps(child)["pay"].queue == "tools.evaluation"
    child = drive(child)
    assert child.state == "completed" and steps(child)["pay"].output == PAID
    assert sink.arrived == 0


# --- nobody is told -----------------------------------------------------------------------------


def test_a_gate_of_a_sandboxed_run_is_never_on_its_way_to_anyone(team, approver):
    live = refund_run(team, "My parcel never arrived.")
    Run.objects.filter(pk=live.pk).update(sandbox=None)  # the control: the same run, live
    assert on_the_way(approver) == 1

    Run.objects.filter(pk=live.pk).update(sandbox=SANDBOX)

    assert on_the_way(approver) == 0


@pytest.mark.parametrize("sandbox, alerted", [(None, True), (SANDBOX, False)])
def test_a_sandboxed_run_that_fails_raises_no_alert(team, settings, move_clock, sandbox, alerted):
    from alerts.detection import alerts_scan_events

    settings.STEPWISE_ALERTS_SETTLE_S = 0
    broken = {"name": "broken", "type": "tool", "tool": "core.echo", "retry": {"max_attempts": 1},
              "output_schema": {"type": "object", "required": ["never"]}}
    run = drive(run_start(version=save(team, broken), input={}, actor=SETUP, sandbox=sandbox))
    assert run.state == "failed"
    move_clock(1)

    alerts_scan_events()

    # The control, live: its dead letter and its failure are each an alert.
    assert Alert.objects.filter(run=run).exists() is alerted


def test_the_audit_timeline_says_what_the_sandbox_answered(team):
    from audit.timeline import run_timeline

    run = drive(refund_run(team, "My parcel never arrived."))

    texts = [line.text for line in run_timeline(run.id).lines]
    assert any("would have been requested from group support_leads; the run's sandbox decides"
               in text for text in texts)
    assert any(text.startswith("Approved by service:evaluation") for text in texts)
    assert (f"Sandboxed: shop.refund was not called; answered with no response declared "
            f"(key {run.id}:refund:default).") in texts


def test_a_large_declared_response_is_kept_as_an_artifact_and_answers_whole(team, sink, settings):
    big = {"status": 200, "body": "x" * (settings.STEPWISE_ARTIFACT_BYTES + 1)}
    run = run_start(version=save(team, pay(sink)), input={}, actor=SETUP,
                    sandbox={**SANDBOX, "responses": {"pay": big}})

    from orchestrator.engine.artifacts import MARKER
    from tests.engine.test_artifacts import raw

    stored = raw(Run, "sandbox", run.pk)
    assert MARKER in stored and len(stored) < 1000  # a reference in the row
    assert Run.objects.get(pk=run.pk).sandbox["responses"]["pay"] == big
    assert steps(drive(run))["pay"].output == big
    assert sink.arrived == 0
