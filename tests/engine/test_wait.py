"""Wait steps and signals (docs/definitions.md, "wait"): a run waits, holding no worker, for a
named signal whose payload — checked against the step's schema — becomes the step's output;
a signal sent before the step waits is buffered (bounded) or refused as the step says; a key
sent again changes nothing; the reaper times a wait out once and fails, continues or routes as
`on_timeout` says. Runs are driven in this process through the services a worker, the API and
the reaper call, on the engine's clock (`move_clock`)."""

from decimal import Decimal

import pytest

from audit.models import AuditEntry
from orchestrator.engine.definitions.limits import MAX_BUFFERED_SIGNALS
from orchestrator.engine.errors import Forbidden, IdempotencyConflict, InputInvalid, NotAllowed
from orchestrator.engine.services import reaper
from orchestrator.engine.services.kinds.worker import Usage, step_claim, step_succeed
from orchestrator.engine.services.runs import run_cancel, run_start
from orchestrator.engine.services.signals import signal_send
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Event, Run, Signal
from orchestrator.web.progress import run_snapshot
from tests.factories import SETUP

pytestmark = pytest.mark.django_db

SCHEMA = {"type": "object", "required": ["amount"], "properties": {"amount": {"type": "number"}}}


def start(team, *, before=False, **wait) -> Run:
    """An order: `place` (a tool, only with `before`), then `pay` waits for signal `paid`;
    `ship` runs on the signal, `cancel` on a timeout routed to it."""
    place = [{"name": "place", "type": "tool", "tool": "core.echo", "params": {"x": 1}}]
    version, _ = workflow_save(team=team, actor=SETUP, definition={
        "name": "order", "input_schema": {"type": "object"},
        "steps": [*(place if before else []),
                  {"name": "pay", "type": "wait", "signal": "paid", "schema": SCHEMA,
                   "timeout_s": 60, **({"after": ["place"]} if before else {}), **wait},
                  {"name": "ship", "type": "tool", "tool": "core.echo", "after": ["pay"],
                   "params": {"amount": "{{ steps.pay.output.amount }}"}},
                  {"name": "cancel", "type": "tool", "tool": "core.echo", "after": ["pay"],
                   "params": {"x": 1}}]})
    return run_start(version=version, input={"order": "A-1"}, actor=SETUP)


def finish(run: Run, name: str) -> None:
    step = run.steps.get(name=name)
    claim = step_claim(step_id=step.id, worker="test")
    step_succeed(step_id=step.id, attempt=claim.attempt, output={"ok": True},
                 usage=Usage(cost_usd=Decimal(0)), worker="test")


def states(run: Run) -> dict[str, str]:
    return dict(run.steps.values_list("name", "state"))


def send(run, requester, key="k1", payload=None, name="paid"):
    return signal_send(run_id=run.id, name=name, payload={"amount": 5} if payload is None else payload,
                       key=key, actor=requester)


def test_a_signal_completes_the_waiting_step_with_its_payload_and_the_run_moves_on(team, requester):
    run = start(team, on_timeout="cancel")
    pay = run.steps.get(name="pay")
    assert states(run)["pay"] == "waiting" and pay.queue == ""
    assert Run.objects.get(id=run.id).state == "waiting"

    outcome = send(run, requester)

    pay.refresh_from_db()
    assert (outcome.status, outcome.duplicate) == ("consumed", False)
    assert (pay.state, pay.output) == ("completed", {"amount": 5})
    assert states(run) == {"pay": "completed", "ship": "queued", "cancel": "skipped"}
    assert run.steps.get(name="ship").input["steps"]["pay"]["output"] == {"amount": 5}
    assert Signal.objects.get(run=run).step_id == pay.id
    event = Event.objects.get(run=run, step=pay, kind="step.completed")
    assert (event.actor, event.payload["signal"], event.payload["key"]) == ("user:requester", "paid", "k1")
    assert AuditEntry.objects.filter(subject_id=str(pay.id), action="step.completed",
                                     actor="user:requester").count() == 1


def test_the_same_key_sent_again_returns_the_first_result_and_changes_nothing(team, requester):
    run = start(team)
    first = send(run, requester)
    again = send(run, requester)

    assert again.duplicate and again.signal.id == first.signal.id and again.status == "consumed"
    assert Event.objects.filter(run=run, step__name="pay", kind="step.completed").count() == 1
    with pytest.raises(IdempotencyConflict):
        send(run, requester, payload={"amount": 6})
    with pytest.raises(NotAllowed, match="no step of run .* waits for signal 'paid' any more"):
        send(run, requester, key="k2")  # the one wait for it has completed


def test_a_payload_that_fails_the_schema_is_refused_with_its_path_and_nothing_consumed(team, requester):
    run = start(team)
    with pytest.raises(InputInvalid) as refused:
        send(run, requester, payload={"amount": "five"})
    assert refused.value.problems == [{"path": "payload.amount", "message": "'five' is not of type 'number'"}]
    with pytest.raises(InputInvalid) as refused:
        send(run, requester, payload={})
    assert refused.value.problems[0]["path"] == "payload"
    assert states(run)["pay"] == "waiting" and not Signal.objects.filter(run=run).exists()


def test_a_signal_no_step_waits_for_or_to_an_ended_run_is_refused(team, requester):
    run = start(team)
    with pytest.raises(NotAllowed, match="no step of run .* waits for signal 'refund'"):
        send(run, requester, name="refund")
    run_cancel(run_id=run.id, actor=SETUP)
    with pytest.raises(NotAllowed, match="has ended"):
        send(run, requester)
    assert not Signal.objects.filter(run=run).exists()


def test_someone_outside_the_team_may_not_signal(team, outsider):
    run = start(team)
    with pytest.raises(Forbidden, match="may not run.signal"):
        send(run, outsider)
    assert states(run)["pay"] == "waiting"


def test_a_signal_sent_before_the_wait_is_buffered_and_consumed_when_it_starts(team, requester):
    run = start(team, before=True, on_timeout="cancel")
    assert states(run)["pay"] == "blocked"

    outcome = send(run, requester)
    assert outcome.status == "buffered" and outcome.signal.step_id is None
    assert Event.objects.filter(run=run, kind="signal.buffered").count() == 1
    finish(run, "place")

    pay = run.steps.get(name="pay")
    assert (pay.state, pay.output) == ("completed", {"amount": 5})
    assert states(run) == {"place": "completed", "pay": "completed", "ship": "queued",
                           "cancel": "skipped"}
    outcome.signal.refresh_from_db()
    assert (outcome.signal.state, outcome.signal.step_id) == ("consumed", pay.id)


def test_the_oldest_buffered_signal_is_consumed_first(team, requester):
    run = start(team, before=True)
    send(run, requester, key="first", payload={"amount": 1})
    send(run, requester, key="second", payload={"amount": 2})
    finish(run, "place")
    assert run.steps.get(name="pay").output == {"amount": 1}
    assert Signal.objects.get(run=run, key="second").state == "buffered"


def test_a_step_that_refuses_early_signals_refuses_one_sent_before_it_waits(team, requester):
    run = start(team, before=True, early_signals="refuse")
    with pytest.raises(NotAllowed, match="early_signals: refuse"):
        send(run, requester)
    assert not Signal.objects.filter(run=run).exists()


def test_a_run_buffers_a_bounded_number_of_signals(team, requester):
    run = start(team, before=True)
    for index in range(MAX_BUFFERED_SIGNALS):
        send(run, requester, key=f"k{index}")
    with pytest.raises(NotAllowed, match=f"at most {MAX_BUFFERED_SIGNALS}"):
        send(run, requester, key="one-too-many")
    assert Signal.objects.filter(run=run).count() == MAX_BUFFERED_SIGNALS


@pytest.mark.parametrize(("on_timeout", "pay", "after"), [
    ("fail", ("timed_out", None), {"ship": "cancelled", "cancel": "cancelled"}),
    ("continue", ("completed", {"timed_out": True}), {"ship": "queued", "cancel": "queued"}),
    ("cancel", ("timed_out", None), {"ship": "skipped", "cancel": "queued"}),
])
def test_the_reaper_times_a_wait_out_once_as_on_timeout_says(team, move_clock, on_timeout, pay, after):
    run = start(team, on_timeout=on_timeout)
    move_clock(59)
    assert reaper.reap()["timed_out"] == 0
    move_clock(61)

    assert reaper.reap()["timed_out"] == 1
    assert reaper.reap()["timed_out"] == 0
    step = run.steps.get(name="pay")
    assert (step.state, step.output) == pay
    assert {n: s for n, s in states(run).items() if n != "pay"} == after
    ended = Event.objects.filter(run=run, step=step, kind__in=["step.completed", "step.timed_out"])
    assert ended.count() == 1
    if on_timeout != "continue":
        assert step.error["class"] == "timeout"
        assert step.error["message"] == "no signal 'paid' within 60 s"
    run.refresh_from_db()
    assert run.state == ("failed" if on_timeout == "fail" else "running")


def test_a_signal_after_the_timeout_is_refused_and_a_sweep_after_the_signal_does_nothing(
        team, requester, move_clock):
    timed_out = start(team)
    signalled = start(team)
    send(signalled, requester)
    move_clock(61)
    assert reaper.reap()["timed_out"] == 1
    with pytest.raises(NotAllowed):
        send(timed_out, requester)
    assert states(signalled)["pay"] == "completed"


def test_a_correlation_key_is_rendered_when_the_wait_starts(team):
    run = start(team, correlation_key="order-{{ input.order }}")
    assert run.steps.get(name="pay").correlation_key == "order-A-1"
    failed = start(team, correlation_key="{{ input.missing }}")
    pay = failed.steps.get(name="pay")
    assert pay.state == "failed" and pay.error["class"] == "permanent"
    assert "correlation_key could not be rendered" in pay.error["message"]


def test_the_run_page_says_what_the_run_waits_for_and_until_when(team):
    from orchestrator.engine.selectors import runs_with_version

    run = start(team)
    pay = run.steps.get(name="pay")
    snapshot = run_snapshot(runs_with_version().get(id=run.id))
    assert snapshot["signals"] == [{"step": "pay", "signal": "paid", "until": pay.deadline_at}]
    send(run, SETUP)
    assert run_snapshot(runs_with_version().get(id=run.id))["signals"] == []  # it no longer waits


@pytest.mark.django_db(transaction=True)
def test_sweeps_and_signals_racing_on_separate_connections_end_a_wait_once(team, requester, move_clock):
    """Two reaper sweeps and two sends of the same signal, each on a connection of its own at
    once, past the deadline: the run lock and the state re-check let exactly one of them end
    the step, whichever it is, and the others change nothing."""
    import threading

    from django.db import connection

    run = start(team)
    pay = run.steps.get(name="pay")
    move_clock(61)
    barrier = threading.Barrier(4)
    results, errors = [], []

    def sweep():
        try:
            barrier.wait()
            results.append(("sweep", reaper.reap()["timed_out"]))
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)
        finally:
            connection.close()

    def signal():
        try:
            barrier.wait()
            results.append(("signal", send(run, requester, key="same").status))
        except NotAllowed:
            results.append(("signal", "refused"))
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=f) for f in (sweep, sweep, signal, signal)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert not errors, errors
    pay.refresh_from_db()
    ended = Event.objects.filter(run=run, step=pay, kind__in=["step.completed", "step.timed_out"])
    assert ended.count() == 1, results
    if pay.state == "completed":  # a send came first: its key answered the other send
        assert sorted(r for k, r in results if k == "signal") == ["consumed", "consumed"]
        assert sum(r for k, r in results if k == "sweep") == 0
    else:
        assert pay.state == "timed_out"
        assert sum(r for k, r in results if k == "sweep") == 1
        assert sorted(r for k, r in results if k == "signal") == ["refused", "refused"]


def test_the_admin_lists_a_team_s_signals_to_its_members_only(team, requester, operator, outsider, client):
    run = start(team, before=True)
    signal = send(run, requester).signal
    client.force_login(operator)
    listed = client.get("/admin/orchestrator/signal/")
    assert listed.status_code == 200 and f"/admin/orchestrator/signal/{signal.id}/change/" in listed.content.decode()
    page = client.get(f"/admin/orchestrator/signal/{signal.id}/change/").content.decode()
    assert "buffered" in page and "user:requester" in page
    outsider.is_staff = True
    outsider.save()
    client.force_login(outsider)
    assert f"/admin/orchestrator/signal/{signal.id}/change/" not in client.get(
        "/admin/orchestrator/signal/").content.decode()
