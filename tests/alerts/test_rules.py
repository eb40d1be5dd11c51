"""Each alert rule fires once for its condition and never again for the same run.

Runs are driven in this process through the services a worker calls, with the engine's clock
under the test's control (`move_clock`); `alerts_scan` is what beat sends every few seconds.
Scanning twice, or seeing the condition again (a second failure, a later event), raises nothing
new: the alert's key is unique.
"""
from decimal import Decimal

import pytest
from django.core import mail

from alerts.detection import alerts_scan
from alerts.models import Alert, AlertRule
from alerts.rules import RuleKind
from alerts.services import alert_raise, rule_for
from notifications.models import Notification
from orchestrator.engine.retry import StepError
from orchestrator.engine.services import reaper
from orchestrator.engine.services.kinds.worker import Usage, step_claim, step_fail, step_succeed
from orchestrator.engine.services.operators import step_retry
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Event, Role, Run
from tests.factories import SETUP, member

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_settle(settings):
    settings.STEPWISE_ALERTS_SETTLE_S = 0
    settings.STEPWISE_NOTIFY_WEBHOOK_URL = ""


@pytest.fixture
def owner(team):
    return member(team, "boss", role=Role.OWNER)


def start(team, *steps, **definition):
    version, _ = workflow_save(team=team, definition={
        "name": definition.pop("name", "watched"), "input_schema": {"type": "object"},
        "steps": list(steps), **definition}, actor=SETUP)
    return run_start(version=version, input={}, actor=SETUP)


def echo(name="work", **extra):
    return {"name": name, "type": "tool", "tool": "core.echo", **extra}


def fail(run: Run, name="work", error_class="permanent", message="boom"):
    step = run.steps.get(name=name)
    claim = step_claim(step_id=step.id, worker="test")
    step_fail(step_id=step.id, attempt=claim.attempt, error=StepError(error_class, message),
              usage=Usage(), worker="test")


def succeed(run: Run, name="work", cost="0"):
    step = run.steps.get(name=name)
    claim = step_claim(step_id=step.id, worker="test")
    step_succeed(step_id=step.id, attempt=claim.attempt, output={},
                 usage=Usage(cost_usd=Decimal(cost)), worker="test")


def alerts(rule: RuleKind) -> list[Alert]:
    return list(Alert.objects.filter(rule=rule))


def test_a_failed_run_raises_one_alert_mailed_to_owners_and_operators(team, owner, operator,
                                                                      requester):
    run = start(team, echo())
    fail(run)
    alerts_scan()
    alerts_scan()
    [alert] = alerts(RuleKind.RUN_FAILED)
    assert alert.run_id == run.id and alert.key == f"run.failed:{run.id}"
    note = Notification.objects.get(kind="alert.run.failed")
    assert note.recipients == sorted([owner.email, operator.email])  # not the editor
    assert "boom" in note.body and str(run.id) in note.body


def test_a_dead_letter_raises_its_own_alert_once(team):
    run = start(team, echo())
    fail(run)
    alerts_scan()
    [alert] = alerts(RuleKind.DEAD_LETTER)
    assert alert.key == f"dead_letter.created:{run.id}:work"


def test_a_paused_run_says_why_once_even_when_paused_again(team, operator):
    run = start(team, echo(), on_error="pause")
    fail(run)
    alerts_scan()
    [alert] = alerts(RuleKind.RUN_PAUSED)
    assert "boom" in alert.body
    step_retry(step_id=run.steps.get(name="work").id, actor=operator)
    fail(run)  # paused again for the same step: the same condition
    assert Run.objects.get(pk=run.pk).state == "paused"
    alerts_scan()
    assert len(alerts(RuleKind.RUN_PAUSED)) == 1


def test_a_step_retried_more_than_the_threshold_raises_once(team, move_clock):
    run = start(team, echo(retry={"max_attempts": 8, "base_s": 1, "jitter": False}))
    for attempt in range(1, 6):
        fail(run, error_class="transient")
        alerts_scan()
        assert len(alerts(RuleKind.STEP_RETRIED)) == (1 if attempt > 3 else 0), attempt
        move_clock(attempt * 100)
        reaper.reap()  # the retry is due: queued again


def test_a_workflow_rule_overrides_the_team_rule_which_overrides_the_default(team):
    run = start(team, echo())
    workflow = run.version.workflow
    assert rule_for(RuleKind.STEP_RETRIED, team=team).threshold == 3
    AlertRule.objects.create(kind=RuleKind.STEP_RETRIED, team=team, threshold=1)
    AlertRule.objects.create(kind=RuleKind.STEP_RETRIED, team=team, workflow=workflow, enabled=False)
    assert rule_for(RuleKind.STEP_RETRIED, team=team).threshold == 1
    assert rule_for(RuleKind.STEP_RETRIED, team=team, workflow_id=workflow.id).enabled is False


def test_a_rule_turned_off_for_the_team_raises_nothing(team):
    AlertRule.objects.create(kind=RuleKind.RUN_FAILED, team=team, enabled=False)
    fail(start(team, echo()))
    alerts_scan()
    assert alerts(RuleKind.RUN_FAILED) == [] and len(alerts(RuleKind.DEAD_LETTER)) == 1


def test_an_open_circuit_breaker_raises_once_per_dependency_and_run(team):
    run = start(team, echo(retry={"max_attempts": 5, "base_s": 1, "jitter": False}))
    fail(run, error_class="transient", message="circuit open for tool:core.echo")
    alerts_scan()
    [alert] = alerts(RuleKind.BREAKER_OPENED)
    assert alert.key == f"breaker.opened:{run.id}:tool:core.echo"


def test_a_budget_denial_raises_a_budget_alert_not_a_pause_alert(team):
    run = start(team, {"name": "think", "type": "agent", "model": "fast", "prompt": "hi",
                      "output_schema": {"type": "object"}},
                budget={"max_cost_usd": 0.01})
    assert Run.objects.get(pk=run.pk).state == "paused"
    alerts_scan()
    [alert] = alerts(RuleKind.BUDGET_DENIED)
    assert "budget" in alert.body and alerts(RuleKind.RUN_PAUSED) == []


def test_a_budget_denial_is_alerted_from_the_gates_outbox_event_once(team):
    """The budget gate records its denial as a `budget.denied` event, with the level and the
    figures, once however often it refuses; the alert is raised when the scan reads the event."""
    run = start(team, {"name": "think", "type": "agent", "model": "fast", "prompt": "hi",
                       "output_schema": {"type": "object"}},
                budget={"max_cost_usd": 0.01})
    [event] = Event.objects.filter(run=run, kind="budget.denied")
    assert event.payload["level"] == "run" and "would exceed" in event.payload["message"]
    assert alerts(RuleKind.BUDGET_DENIED) == []  # nothing is raised before the scan reads it
    alerts_scan()
    [alert] = alerts(RuleKind.BUDGET_DENIED)
    assert alert.key == f"budget.denied:{event.payload['key']}"
    assert alert.subject == "Budget stopped a step: watched (run)"
    assert event.payload["message"] in alert.body


def test_a_reservation_past_the_warning_share_of_the_budget_raises_one_alert(team):
    """The budget gate records it as a `budget.warning` event, with the level and the figures;
    alert detection raises it once."""
    run = start(team, {"name": "think", "type": "agent", "model": "fast", "prompt": "hi",
                       "output_schema": {"type": "object"}},
                budget={"max_cost_usd": 0.12})  # the default estimate, $0.10, is 83 % of it
    alerts_scan()
    alerts_scan()
    [alert] = alerts(RuleKind.BUDGET_WARNING)
    assert alert.run_id == run.id and "warning threshold" in alert.subject
    assert "$0.12" in alert.body


def test_a_run_without_progress_is_stuck_once(team, move_clock):
    run = start(team, echo())
    move_clock(899)
    alerts_scan()
    assert alerts(RuleKind.RUN_STUCK) == []
    move_clock(901)
    alerts_scan()
    reaper.reap()  # the reaper's own run.stuck event is the same condition
    move_clock(2000)
    alerts_scan()
    [alert] = alerts(RuleKind.RUN_STUCK)
    assert alert.run_id == run.id


def test_a_deadline_is_at_risk_then_breached_each_once(team, move_clock):
    run = start(team, echo(), budget={"max_duration_s": 100})
    move_clock(79)
    alerts_scan()
    assert alerts(RuleKind.DEADLINE_AT_RISK) == []
    move_clock(81)
    alerts_scan()
    alerts_scan()
    assert len(alerts(RuleKind.DEADLINE_AT_RISK)) == 1 and alerts(RuleKind.DEADLINE_BREACHED) == []
    move_clock(101)
    alerts_scan()
    reaper.reap()  # times the run out: its run.timed_out event is the same breach
    alerts_scan()
    [alert] = alerts(RuleKind.DEADLINE_BREACHED)
    assert alert.run_id == run.id


def test_a_step_waiting_in_its_queue_too_long_raises_once(team, move_clock):
    run = start(team, echo())
    move_clock(299)
    alerts_scan()
    assert alerts(RuleKind.QUEUE_AGE) == []
    move_clock(301)
    alerts_scan()
    move_clock(600)
    alerts_scan()
    [alert] = alerts(RuleKind.QUEUE_AGE)
    assert alert.key == f"queue.age:{run.id}:tools"


def test_the_scan_resumes_after_the_last_event_it_handled(team):
    fail(start(team, echo()))
    alerts_scan()
    Alert.objects.all().delete()  # were the events read again, they would raise again
    alerts_scan()
    assert not Alert.objects.exists()


def test_alert_raise_is_the_one_entry_for_other_code(team, owner):
    first = alert_raise("budget.warning", team=team, key="budget.warning:team:support:2026-11",
                        subject="Team support spent 80% of its monthly budget", body="Spent $80 of $100.")
    again = alert_raise("budget.warning", team=team, key="budget.warning:team:support:2026-11",
                        subject="Team support spent 80% of its monthly budget", body="Spent $81 of $100.")
    assert first is not None and again is None
    assert Notification.objects.filter(kind="alert.budget.warning").count() == 1
    with pytest.raises(ValueError):
        alert_raise("run.failed", team=team, key="x", subject=" ", body="b")
    assert mail.outbox == []  # delivered by a worker after commit, not here


def test_a_run_a_reviewer_rejected_pages_no_one(team, requester, owner, operator):
    from orchestrator.engine.services.kinds.human_gate import approval_reject
    from tests.approvals.conftest import support_gate
    lead = member(team, "lead", role=Role.MEMBER, groups=("support_leads",))
    approval = support_gate(team, requester)
    approval_reject(approval_id=approval.id, user=lead, proposal_hash=approval.proposal_hash,
                    note="Wrong tone for this customer.")
    assert Run.objects.get(pk=approval.run_id).state == "failed"

    alerts_scan()

    assert not Alert.objects.exists()  # a "no" is a decision, not an incident
    assert not Notification.objects.filter(kind__startswith="alert.").exists()


def test_a_gate_rejected_by_its_deadline_still_alerts(team, requester, owner, move_clock):
    from tests.approvals.conftest import support_gate
    approval = support_gate(team, requester, changes={"escalation": [], "on_deadline": "reject"})
    move_clock(4 * 3600 + 1)
    reaper.reap()
    assert Run.objects.get(pk=approval.run_id).state == "failed"

    alerts_scan()

    [alert] = alerts(RuleKind.RUN_FAILED)  # nobody decided: operators hear of it
    assert "approval deadline passed" in alert.body



def test_an_alert_leads_to_the_runs_live_page_in_one_click(team, owner, operator):
    from django.test import Client
    run = start(team, echo())
    fail(run)
    alerts_scan()
    live = f"/admin/orchestrator/run/{run.id}/live/"

    note = Notification.objects.get(kind="alert.run.failed")
    assert note.link.endswith(live)  # the e-mail's link: the failing step, with its error
    client = Client()
    client.force_login(operator)
    assert f'<a href="{live}">live page</a>' in client.get("/admin/alerts/alert/").content.decode()
