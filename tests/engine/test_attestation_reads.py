"""Attestation (docs/audit.md#attestation): every output the scheduler reads to decide something
is checked before it is read, not only the inputs of the steps it makes ready — a `when`
condition reading a step two or more upstream, a loop's `until` verdict reading its iteration's
body steps, a map's join reading its items (each stored with a record of its own). A tampered
one pauses the run with class `attestation`; a fork refuses to carry (and sign anew) one, and a
compensation reading one undoes nothing. And the record of a
worker's attempt hashes each external call's request and its response. Runs are driven in this
process through the services a worker calls."""
import json
import threading
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from audit.verification import outputs_check
from orchestrator.engine import attestation
from orchestrator.engine.attestation import output_digest
from orchestrator.engine.errors import NotAllowed
from orchestrator.engine.hashing import digest_of
from orchestrator.engine.services.compensation import run_compensate
from orchestrator.engine.services.forks import run_fork
from orchestrator.engine.services.kinds import map_step
from orchestrator.engine.services.kinds.worker import (
    Usage,
    step_claim,
    step_execute,
    step_succeed,
)
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Event, MapItem, Run, StepRun
from tests.factories import SETUP
from tests.support.http_sink import HttpSink

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fresh_keys(settings):
    settings.STEPWISE_ATTESTATION_KEY_CACHE_S = 0
    attestation.keys_forget()
    yield
    attestation.keys_forget()


def start(team, name: str, steps: list[dict]) -> Run:
    version, _ = workflow_save(team=team, actor=SETUP, definition={
        "name": name, "input_schema": {"type": "object"}, "steps": steps})
    return run_start(version=version, input={"topic": "tides"}, actor=SETUP)


def finish(run: Run, name: str, output: dict) -> None:
    step = run.steps.get(name=name)
    assert step.state == "queued", (name, step.state)
    claim = step_claim(step_id=step.id, worker="w1")
    assert step_succeed(step_id=step.id, attempt=claim.attempt, output=output,
                        usage=Usage(cost_usd=Decimal(0)), worker="w1")


def states(run: Run) -> dict[str, str]:
    return dict(StepRun.objects.filter(run=run).values_list("name", "state"))


def assert_paused_for(run: Run, name: str) -> None:
    run.refresh_from_db()
    assert run.state == "paused", run.state
    assert run.error["class"] == "attestation" and name in run.error["steps"], run.error
    assert run.error["steps"][name].startswith("the output does not match its attestation")
    assert Event.objects.filter(run=run, kind="step.attestation_invalid", step__name=name).exists()


def test_a_when_condition_reading_an_edited_output_two_steps_upstream_pauses_the_run(team):
    run = start(team, "when-upstream", [
        {"name": "check", "type": "tool", "tool": "core.echo"},
        {"name": "fetch", "type": "tool", "tool": "core.echo", "after": ["check"]},
        {"name": "send", "type": "tool", "tool": "core.echo", "after": ["fetch"],
         "when": "steps.check.output.go == true"},
    ])
    finish(run, "check", {"go": True})
    # `check` is read as `fetch` starts; edited after, it is read again by `send`'s condition.
    StepRun.objects.filter(run=run, name="check").update(output={"go": False})

    finish(run, "fetch", {"page": 1})

    assert_paused_for(run, "check")
    assert states(run)["send"] == "blocked"  # neither skipped nor started on the edited output


def test_a_loops_until_verdict_reading_an_edited_body_output_pauses_the_run(team):
    run = start(team, "loop-verdict", [
        {"name": "refine", "type": "loop", "max_iterations": 3,
         "input": {"topic": "{{ input.topic }}"},
         "until": "steps.critique.output.approved == true && steps.draft.output.final == true",
         "body": [{"name": "draft", "type": "tool", "tool": "core.echo"},
                  {"name": "critique", "type": "tool", "tool": "core.echo", "after": ["draft"]}]},
        {"name": "publish", "type": "tool", "tool": "core.echo", "after": ["refine"]},
    ])
    finish(run, "draft[1]", {"final": False})
    StepRun.objects.filter(run=run, name="draft[1]").update(output={"final": True})

    finish(run, "critique[1]", {"approved": True})

    assert_paused_for(run, "draft[1]")
    assert states(run)["refine"] == "waiting" and states(run)["publish"] == "blocked"


def test_an_iteration_reading_an_edited_output_of_the_previous_iteration_pauses_the_run(team):
    run = start(team, "loop-previous", [
        {"name": "refine", "type": "loop", "max_iterations": 3,
         "input": {"topic": "{{ input.topic }}"},
         "until": "steps.critique.output.approved == true",
         "body": [{"name": "draft", "type": "tool", "tool": "core.echo",
                   "params": {"before": "{{ iteration.previous.critique.output.note }}"}},
                  {"name": "critique", "type": "tool", "tool": "core.echo", "after": ["draft"]}]},
    ])
    finish(run, "draft[1]", {"text": "one"})
    finish(run, "critique[1]", {"approved": False, "note": "shorter"})
    assert states(run)["draft[2]"] == "queued"
    StepRun.objects.filter(run=run, name="critique[1]").update(output={"approved": True, "note": "x"})

    finish(run, "draft[2]", {"text": "two"})  # `critique[2]` reads iteration 1 as it starts

    assert_paused_for(run, "critique[1]")
    assert states(run)["critique[2]"] == "blocked"


# --- what the record holds of each external call ----------------------------------------------


@pytest.fixture
def api():
    """A local HTTP API answering every request with a JSON body."""
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            body = json.dumps({"path": self.path, "ok": True}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_GET

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.mark.parametrize("side_effect", [False, True])
def test_a_tool_calls_request_and_response_are_hashed_in_the_record(team, api, side_effect):
    params = {"method": "POST" if side_effect else "GET", "url": f"{api}/orders/7"}
    run = start(team, "tool-call", [{"name": "fetch", "type": "tool", "tool": "http.request",
                                     "params": params, "side_effect": side_effect}])
    step = run.steps.get(name="fetch")

    step_execute(step_id=step.id, worker="w1")

    step.refresh_from_db()
    assert step.state == "completed" and step.output["body"] == {"path": "/orders/7", "ok": True}
    record = step.attestation["record"]
    [call] = record["calls"]
    assert (call["kind"], call["target"]) == ("tool", "http.request")
    assert call["request"] == digest_of(params)
    # The tool's answer is the step's output here: the two hashes are one.
    assert call["response"] == record["output"] == output_digest(step.output)


# --- map items --------------------------------------------------------------------------------


def start_fan(team, url: str, items: int = 2) -> StepRun:
    version, _ = workflow_save(team=team, actor=SETUP, definition={
        "name": "fan", "input_schema": {"type": "object"},
        "steps": [{"name": "each", "type": "map", "over": "input.items", "item": {
                       "type": "tool", "tool": "http.request",
                       "params": {"method": "GET", "url": url + "/item/{{ item }}"}}},
                  {"name": "after", "type": "tool", "tool": "core.echo", "after": ["each"]}]})
    run = run_start(version=version, input={"items": list(range(items))}, actor=SETUP)
    step = run.steps.get(name="each")
    for index in range(items):
        assert map_step.map_item_run(step_id=step.id, index=index).verdict == map_step.DONE
    return step


def test_each_map_item_is_stored_with_a_signed_record_of_its_call_and_the_join_reads_it(team, api):
    step = start_fan(team, api)
    item = MapItem.objects.get(step=step, index=1)

    record = item.attestation["record"]
    assert (record["step"], record["item"], record["kind"]) == (step.id, 1, "map_item")
    [call] = record["calls"]
    assert call["request"] == digest_of({"method": "GET", "url": f"{api}/item/1"})
    assert call["response"] == record["output"] == output_digest(item.output)
    assert attestation.attestation_problem(step_id=step.id, output=item.output,
                                           attestation=item.attestation, item=1) is None

    assert outputs_check(run_id=step.run_id) == []
    assert map_step.map_join(step_id=step.id)
    assert states(step.run)["each"] == "completed" and states(step.run)["after"] == "queued"


@pytest.mark.parametrize(("tamper", "problem"), [
    (lambda items: {"output": {**items[1].output, "status": 500}},
     "the output does not match its attestation"),
    (lambda items: {"output": items[0].output, "attestation": items[0].attestation},
     "the attestation is of item 0"),
    (lambda items: {"attestation": None}, "no attestation"),
])
def test_a_join_reading_an_edited_item_output_pauses_the_run(team, api, tamper, problem):
    step = start_fan(team, api)
    items = list(MapItem.objects.filter(step=step).order_by("index"))
    MapItem.objects.filter(id=items[1].id).update(**tamper(items))

    assert not map_step.map_join(step_id=step.id)

    run = Run.objects.get(id=step.run_id)
    assert run.state == "paused" and run.error["class"] == "attestation", run.error
    assert run.error["steps"]["each"].startswith(f"item 1: {problem}"), run.error
    assert states(run)["each"] == "waiting" and states(run)["after"] == "blocked"
    [flag] = Event.objects.filter(run=run, kind="step.attestation_invalid")
    assert flag.step_id == step.id
    [said] = outputs_check(run_id=run.id)  # audit_verify says the same
    assert f"step 'each' item 1 (id {step.id}): {problem}" in said


# --- forks ------------------------------------------------------------------------------------


def test_a_fork_refuses_to_carry_an_output_that_fails_its_attestation(team):
    """A fork signs what it carries anew: an edited output would come out of it signed."""
    run = start(team, "forked", [
        {"name": "research", "type": "tool", "tool": "core.echo"},
        {"name": "draft", "type": "tool", "tool": "core.echo", "after": ["research"]}])
    finish(run, "research", {"notes": "n1"})
    finish(run, "draft", {"text": "d1"})
    StepRun.objects.filter(run=run, name="research").update(output={"notes": "forged"})
    runs_before = Run.objects.count()

    with pytest.raises(NotAllowed) as refused:
        run_fork(run_id=run.id, step="draft", actor=SETUP)

    [problem] = refused.value.problems
    assert problem["path"] == "steps.research"
    assert problem["message"].startswith("the output does not match its attestation")
    assert Run.objects.count() == runs_before
    StepRun.objects.filter(run=run, name="research").update(output={"notes": "n1"})  # repaired
    fork = run_fork(run_id=run.id, step="draft", actor=SETUP)
    assert fork.steps.get(name="research").output == {"notes": "n1"}


# --- compensation -----------------------------------------------------------------------------


def test_a_compensation_reading_an_edited_output_undoes_nothing_and_fails_for_a_person(team):
    with HttpSink() as sink:
        sink.fail_next(1, 422, path="/ship")
        post = {"type": "tool", "tool": "http.request", "side_effect": True}
        run = start(team, "saga", [
            {**post, "name": "pay", "params": {"method": "POST", "url": f"{sink.url}/pay"},
             "compensate": {"tool": "http.request", "params": {
                 "method": "POST", "url": f"{sink.url}/refund",
                 "json": {"payment": "{{ steps.pay.output.status }}"}}}},
            {**post, "name": "ship", "after": ["pay"],
             "params": {"method": "POST", "url": f"{sink.url}/ship"}}])
        step_execute(step_id=run.steps.get(name="pay").id, worker="w1")
        StepRun.objects.filter(run=run, name="pay").update(output={"status": 999})
        step_execute(step_id=run.steps.get(name="ship").id, worker="w1")
        assert Run.objects.get(id=run.id).state == "compensating"

        run_compensate(run_id=run.id)

        run.refresh_from_db()
        assert run.state == "compensation_failed"
        assert "attestation: step 'pay': the output does not match" in str(run.error)
        assert [r["path"] for r in sink.requests] == ["/pay", "/ship"]  # no refund was sent
        assert Event.objects.filter(run=run, step__name="pay",
                                    kind="step.attestation_invalid").exists()
