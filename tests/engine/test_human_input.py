"""Human input steps (docs/definitions.md, "human_input"): a run waits, holding no worker, for a
person of a group (or its assignee) to fill in a form. The answer is checked against the form's
schema, by who may answer it, and against the run's current state (a stale task is refused);
an abstention is an answer the definition routes on; the reaper escalates once and then expires
the task. Runs are driven in this process through the services a worker and the reaper call, on
the engine's clock (`move_clock`).
"""

import json
from datetime import timedelta

import pytest
from django.db import transaction

from approvals.models import InputTask
from audit.models import AuditEntry
from audit.timeline import explain
from orchestrator.engine.errors import Forbidden, InputInvalid, NotAllowed
from orchestrator.engine.services import reaper
from orchestrator.engine.services.kinds import handler_for
from orchestrator.engine.services.kinds.human_input import input_answer
from orchestrator.engine.services.runs import run_cancel, run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Event, Run
from orchestrator.web.progress import run_snapshot
from tests.factories import SETUP, member

pytestmark = pytest.mark.django_db

FORM = {
    "type": "object",
    "required": ["iban"],
    "properties": {
        "iban": {"type": "string", "minLength": 5, "title": "IBAN"},
        "amount": {"type": "integer", "minimum": 0},
        "currency": {"enum": ["EUR", "USD"]},
    },
}


def start(team, *, actor=SETUP, **ask) -> Run:
    version, _ = workflow_save(
        team=team,
        definition={
            "name": "invoices",
            "input_schema": {"type": "object", "required": ["vendor"],
                             "properties": {"vendor": {"type": "string"}}},
            "steps": [
                {"name": "ask", "type": "human_input", "group": "clerks", "form": FORM,
                 "instructions": "Find the IBAN of {{ input.vendor }}.",
                 "evidence": {"vendor": "{{ input.vendor }}"}, **ask},
                {"name": "pay", "type": "tool", "tool": "core.echo", "after": ["ask"],
                 "when": "!steps.ask.output.abstained",
                 "params": {"iban": "{{ steps.ask.output.answer.iban }}"}},
                {"name": "handoff", "type": "tool", "tool": "core.echo", "after": ["ask"],
                 "when": "steps.ask.output.abstained"},
            ],
        },
        actor=SETUP,
    )
    return run_start(version=version, input={"vendor": "ACME"}, actor=actor)


def task_of(run: Run) -> InputTask:
    return InputTask.objects.get(run=run, state="open")


def states(run: Run) -> dict[str, str]:
    return dict(run.steps.values_list("name", "state"))


@pytest.fixture
def clerk(team):
    return member(team, "clerk", groups=("clerks",))


def test_the_run_waits_with_an_open_task_holding_the_rendered_evidence(team):
    run = start(team, deadline_s=600)
    task = task_of(run)
    ask = run.steps.get(name="ask")

    assert states(run) == {"ask": "waiting", "pay": "blocked", "handoff": "blocked"}
    assert Run.objects.get(id=run.id).state == "waiting"
    assert ask.queue == ""
    assert task.group == "clerks" and task.version_id == run.version_id
    assert task.instructions == "Find the IBAN of ACME."
    assert task.evidence == [{"name": "vendor", "value": "ACME"}]
    assert task.deadline_at == ask.started_at + timedelta(seconds=600)
    assert Event.objects.filter(run=run, kind="input.requested", payload__task=task.id).exists()


def test_an_answer_completes_the_step_records_its_answerer_and_the_run_moves_on(team, clerk):
    run = start(team)
    task = input_answer(task_id=task_of(run).id, user=clerk,
                        answer={"iban": "DE0012345", "currency": "EUR"}, note="from the PDF")

    task.refresh_from_db()
    assert task.state == "answered" and task.answered_by == clerk and task.note == "from the PDF"
    ask = run.steps.get(name="ask")
    assert ask.output == {"answer": {"iban": "DE0012345", "currency": "EUR"},
                          "answered_by": "clerk", "abstained": False}
    assert states(run) == {"ask": "completed", "pay": "queued", "handoff": "skipped"}
    answered = Event.objects.get(run=run, kind="input.answered", payload__task=task.id)
    assert answered.actor == "user:clerk"
    assert answered.payload["answered_by"] == "clerk"


def test_an_abstention_routes_to_the_abstain_branch(team, clerk):
    run = start(team, allow_abstain=True)
    input_answer(task_id=task_of(run).id, user=clerk, abstain=True, note="no idea")

    ask = run.steps.get(name="ask")
    assert ask.output == {"answer": {}, "answered_by": "clerk", "abstained": True}
    assert InputTask.objects.get(run=run).state == "abstained"
    assert states(run) == {"ask": "completed", "pay": "skipped", "handoff": "queued"}


def test_abstaining_where_the_step_does_not_allow_it_is_refused(team, clerk):
    run = start(team)
    with pytest.raises(InputInvalid) as refused:
        input_answer(task_id=task_of(run).id, user=clerk, abstain=True)
    assert refused.value.problems == [{"path": "abstain", "message": "not allowed by this step"}]
    assert states(run)["ask"] == "waiting"


def test_an_answer_the_form_rejects_is_refused_naming_each_field(team, clerk):
    run = start(team)
    task = task_of(run)
    with pytest.raises(InputInvalid) as refused:
        input_answer(task_id=task.id, user=clerk,
                     answer={"amount": -3, "currency": "GBP", "extra": 1})
    paths = {p["path"] for p in refused.value.problems}
    assert paths == {"answer.iban", "answer.amount", "answer.currency", "answer.extra"}
    assert {"path": "answer.extra", "message": "not a field of this form"} in refused.value.problems
    assert {"path": "answer.iban", "message": "this field is required"} in refused.value.problems
    assert states(run)["ask"] == "waiting" and task_of(run).state == "open"
    assert Event.objects.filter(run=run, kind="input.refused", payload__task=task.id).count() == 1


def test_someone_outside_the_group_may_not_answer(team, outsider):
    run = start(team)
    stranger = member(team, "stranger", groups=("other",))
    for user in (stranger, outsider):
        with pytest.raises(Forbidden):
            input_answer(task_id=task_of(run).id, user=user, answer={"iban": "DE0012345"})
    assert states(run)["ask"] == "waiting"


def test_with_an_assignee_only_they_may_answer(team, clerk):
    assigned = member(team, "assigned")
    run = start(team, assignee="assigned")
    with pytest.raises(Forbidden, match="assigned to assigned"):
        input_answer(task_id=task_of(run).id, user=clerk, answer={"iban": "DE0012345"})
    input_answer(task_id=task_of(run).id, user=assigned, answer={"iban": "DE0012345"})
    assert run.steps.get(name="ask").output["answered_by"] == "assigned"


def test_separation_of_duties_bars_whoever_started_the_run_when_the_step_says_so(team):
    starter = member(team, "starter", groups=("clerks",))
    run = start(team, actor=starter, separation_of_duties=True)
    with pytest.raises(Forbidden, match="separation of duties"):
        input_answer(task_id=task_of(run).id, user=starter, answer={"iban": "DE0012345"})
    assert states(run)["ask"] == "waiting"

    relaxed = start(team, actor=starter)  # the step does not ask for it
    input_answer(task_id=task_of(relaxed).id, user=starter, answer={"iban": "DE0012345"})
    assert states(relaxed)["ask"] == "completed"


def test_a_task_answered_already_is_stale(team, clerk):
    run = start(team)
    task = task_of(run)
    input_answer(task_id=task.id, user=clerk, answer={"iban": "DE0012345"})
    with pytest.raises(NotAllowed, match="answered already"):
        input_answer(task_id=task.id, user=clerk, answer={"iban": "DE0099999"})
    assert run.steps.get(name="ask").output["answer"] == {"iban": "DE0012345"}


def test_a_task_of_a_cancelled_run_is_stale_and_closed(team, clerk, operator):
    run = start(team)
    task = task_of(run)
    run_cancel(run_id=run.id, actor=operator, reason="no longer needed")
    task.refresh_from_db()
    assert task.state == "cancelled"
    with pytest.raises(NotAllowed):
        input_answer(task_id=task.id, user=clerk, answer={"iban": "DE0012345"})


def test_a_task_whose_run_is_paused_is_stale(team, clerk):
    run = start(team)
    task = task_of(run)
    Run.objects.filter(id=run.id).update(state="paused")
    with pytest.raises(NotAllowed, match="the run is paused"):
        input_answer(task_id=task.id, user=clerk, answer={"iban": "DE0012345"})
    assert InputTask.objects.get(id=task.id).state == "open"


def test_a_task_asked_on_another_version_is_stale(team, clerk):
    run = start(team)
    task = task_of(run)
    other = start(team, deadline_s=999).version  # a second version of the same workflow
    InputTask.objects.filter(id=task.id).update(version=other)
    with pytest.raises(NotAllowed, match="another version"):
        input_answer(task_id=task.id, user=clerk, answer={"iban": "DE0012345"})


def test_the_reaper_escalates_once_then_the_deadline_fails_the_step(team, clerk, move_clock):
    boss = member(team, "boss", groups=("managers",))
    run = start(team, deadline_s=100, escalate_to="managers", escalate_after_s=40)
    task = task_of(run)

    move_clock(39)
    assert reaper.reap()["timed_out"] == 0
    move_clock(41)
    assert reaper.reap()["timed_out"] == 1
    task.refresh_from_db()
    assert task.group == "managers" and task.escalation_level == 1 and task.state == "open"
    assert reaper.reap()["timed_out"] == 0  # escalated once, not on every sweep
    assert Event.objects.filter(run=run, kind="input.escalated", payload__task=task.id).count() == 1
    with pytest.raises(Forbidden):  # the first group no longer answers
        input_answer(task_id=task.id, user=clerk, answer={"iban": "DE0012345"})

    move_clock(101)
    assert reaper.reap()["timed_out"] == 1
    task.refresh_from_db()
    assert task.state == "expired"
    assert states(run)["ask"] == "timed_out"
    with pytest.raises(NotAllowed):
        input_answer(task_id=task.id, user=boss, answer={"iban": "DE0012345"})


def test_a_deadline_that_abstains_routes_like_an_abstention(team, move_clock):
    run = start(team, deadline_s=60, on_timeout="abstain")
    task = task_of(run)
    move_clock(61)
    assert reaper.reap()["timed_out"] == 1
    assert reaper.reap()["timed_out"] == 0
    task.refresh_from_db()
    assert task.state == "expired"
    assert run.steps.get(name="ask").output == {"answer": {}, "answered_by": None,
                                                "abstained": True}
    assert states(run) == {"ask": "completed", "pay": "skipped", "handoff": "queued"}


def test_the_run_page_says_what_the_run_waits_for_and_until_when(team):
    from orchestrator.engine.selectors import runs_with_version

    run = start(team)
    task = task_of(run)
    snapshot = run_snapshot(runs_with_version().get(id=run.id))
    assert snapshot["inputs"] == [{"id": task.id, "step": "ask", "group": "clerks",
                                   "assignee": "", "until": task.deadline_at}]


def test_the_ledger_records_the_answerer_and_each_refusal_scoped_to_the_run(team, clerk):
    run = start(team)
    task = task_of(run)
    stranger = member(team, "stranger")
    with pytest.raises(Forbidden):
        input_answer(task_id=task.id, user=stranger, answer={"iban": "DE0012345"})
    input_answer(task_id=task.id, user=clerk, answer={"iban": "DE0012345"})

    entries = {e.action: e for e in AuditEntry.objects.filter(run_id=run.id,
                                                             action__startswith="input.")}
    assert set(entries) == {"input.requested", "input.refused", "input.answered"}
    answered = entries["input.answered"]
    assert answered.actor == "user:clerk"
    assert explain(answered, json.loads(answered.payload)) == "Answered by user:clerk (fields: iban)."
    assert "DE0012345" not in answered.payload  # the value stays in the task
    refused = entries["input.refused"]
    assert explain(refused, json.loads(refused.payload)).startswith(
        "Refused to answer for user:stranger: you are not in the group that answers this task")


def test_an_escalation_whose_transaction_died_is_done_once_by_the_next_sweep(team, move_clock):
    run = start(team, deadline_s=100, escalate_to="managers", escalate_after_s=40)
    ask = run.steps.get(name="ask")
    move_clock(41)

    class Crash(Exception):
        pass

    with pytest.raises(Crash), transaction.atomic():  # the sweep dies before its COMMIT
        assert handler_for("human_input").time_out(step_id=ask.id, reason="step timeout elapsed")
        raise Crash
    assert task_of(run).group == "clerks"

    assert reaper.reap()["timed_out"] == 1
    # A second sweep that listed the step before the escalation moved its deadline: nothing.
    assert handler_for("human_input").time_out(step_id=ask.id, reason="again") is False
    assert reaper.reap()["timed_out"] == 0
    assert task_of(run).group == "managers"
    assert Event.objects.filter(run=run, kind="input.escalated").count() == 1
