"""Failure semantics through real workers: dead letters, redrive, pause, sagas, lost workers,
duplicate deliveries."""
import time
from datetime import timedelta

import pytest

from orchestrator.engine.dispatch import batch_queue_for, queue_for
from orchestrator.engine.services import reaper
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import DeadLetter, Effect, Role, Run, StepRun, WorkflowVersion
from orchestrator.tasks import compensate_run, execute_step
from tests.conftest import client_for
from tests.factories import SETUP, member
from tests.support.http_sink import HttpSink

from .conftest import LEASE_S, wait_for, wait_for_run

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
ENDED = ("completed", "failed", "cancelled", "timed_out", "compensation_failed", "paused")


def post(name, url, **extra):
    return {"name": name, "type": "tool", "tool": "http.request", "side_effect": True,
            "params": {"method": "POST", "url": url, "json": {"step": name}}, **extra}


def operator_client(team):
    return client_for(member(team, "operator", role=Role.OPERATOR))


def reap_until(predicate, timeout=30):
    """Run the reaper (as beat would) until predicate() holds."""
    def tick():
        reaper.reap()
        return predicate()
    return wait_for(tick, timeout=timeout, interval=0.3)


def test_exhausted_step_is_dead_lettered_and_redriven_by_an_operator(workers, team):
    with HttpSink() as sink:
        sink.fail_next(1, 400)
        version, _ = workflow_save(team=team, definition={
            "name": "deliver", "input_schema": {"type": "object"},
            "steps": [post("deliver", f"{sink.url}/deliver")]}, actor=SETUP)
        run = wait_for_run(run_start(version=version, input={}, actor=SETUP).id, states=ENDED)
        assert run.state == "failed"
        letter = DeadLetter.objects.get(run=run)
        assert (letter.step.name, letter.error_class, letter.attempts) == ("deliver", "permanent", 1)

        api = operator_client(team)
        listed = api.get("/api/v1/dead-letters/?status=open").json()["results"]
        assert [d["id"] for d in listed] == [letter.id]
        assert client_for(member(team, "viewer")).post(
            f"/api/v1/dead-letters/{letter.id}/redrive/").status_code == 403
        assert api.post(f"/api/v1/dead-letters/{letter.id}/redrive/").status_code == 200

        run = wait_for_run(run.id, states=("completed",))
        assert api.post(f"/api/v1/dead-letters/{letter.id}/redrive/").status_code == 409
        assert sink.effects == {f"{run.id}:deliver:default": 1}
        assert StepRun.objects.get(run=run, name="deliver").attempts == 2


def test_on_error_pause_waits_for_an_operator_who_skips_the_failed_step(workers, team):
    with HttpSink() as sink:
        sink.fail_next(1, 422)
        version, _ = workflow_save(team=team, definition={
            "name": "pausing", "input_schema": {"type": "object"}, "on_error": "pause",
            "steps": [post("enrich", f"{sink.url}/enrich"),
                      {"name": "report", "type": "tool", "tool": "core.echo", "after": ["enrich"],
                       "join": "any"}]}, actor=SETUP)
        run = wait_for_run(run_start(version=version, input={}, actor=SETUP).id, states=ENDED)
        assert run.state == "paused"
        response = operator_client(team).post(f"/api/v1/runs/{run.id}/steps/enrich/skip/")
        assert response.status_code == 202
        run = wait_for_run(run.id, states=("completed", "failed"))
        assert {s.name: s.state for s in run.steps.all()} == {"enrich": "skipped", "report": "skipped"}


@pytest.mark.parametrize("compensation_fails", [False, True])
def test_failed_run_compensates_its_effects_newest_first(workers, team, compensation_fails):
    with HttpSink() as sink:
        sink.fail_next(1, 400, path="/charge")
        if compensation_fails:
            sink.fail_next(1, 400, path="/release")
        def undo(step, path):
            return {"tool": "http.request", "params": {
                "method": "POST", "url": f"{sink.url}/{path}",
                "json": {"undo": "{{ steps." + step + ".output.status }}"}}}

        version, _ = workflow_save(team=team, definition={
            "name": "trip", "input_schema": {"type": "object"}, "steps": [
                post("reserve", f"{sink.url}/reserve", compensate=undo("reserve", "release")),
                post("hold", f"{sink.url}/hold", after=["reserve"], compensate=undo("hold", "unhold")),
                post("charge", f"{sink.url}/charge", after=["hold"])]}, actor=SETUP)
        run = wait_for_run(run_start(version=version, input={}, actor=SETUP).id,
                           states=("failed", "compensation_failed", "completed"))
        paths = [r["path"] for r in sink.requests]
        assert paths[:4] == ["/reserve", "/hold", "/charge", "/unhold"]
        if compensation_fails:
            assert run.state == "compensation_failed"
            assert run.error["compensation"]["step"] == "reserve"
        else:
            assert run.state == "failed"
            assert paths[4:] == ["/release"]
            compensations = Effect.objects.filter(run=run, action="compensate", status="succeeded")
            assert {e.step.name for e in compensations} == {"reserve", "hold"}


@pytest.mark.parametrize("saved_before_compensations_had_a_policy", [False, True])
def test_a_compensation_that_fails_transiently_is_retried_under_its_policy(
        workers, team, saved_before_compensations_had_a_policy):
    with HttpSink() as sink:
        sink.fail_next(1, 400, path="/charge")
        sink.fail_next(2, 503, path="/release")
        release = {"tool": "http.request", "params": {"method": "POST", "url": f"{sink.url}/release"}}
        version, _ = workflow_save(team=team, definition={
            "name": "flaky-undo", "input_schema": {"type": "object"}, "steps": [
                post("reserve", f"{sink.url}/reserve", compensate=release,
                     retry={"max_attempts": 3, "base_s": 0.1, "max_s": 0.2, "jitter": False}),
                post("charge", f"{sink.url}/charge", after=["reserve"])]}, actor=SETUP)
        if saved_before_compensations_had_a_policy:  # its stored normalized form has none
            normalized = version.normalized
            del normalized["steps"][0]["compensate"]["retry"]
            WorkflowVersion.objects.filter(id=version.id).update(normalized=normalized)
        run = wait_for_run(run_start(version=version, input={}, actor=SETUP).id,
                           states=("failed", "compensation_failed", "completed"))
        assert run.state == "failed", run.error
        assert [r["path"] for r in sink.requests].count("/release") == 3
        assert sink.effects[f"{run.id}:reserve:compensate"] == 1
        kinds = list(run.events.filter(kind__startswith="run.compensat").values_list("kind", flat=True))
        assert kinds == ["run.compensating", "run.compensation_retrying", "run.compensation_retrying"]


def test_duplicate_compensation_messages_never_run_a_compensation_twice_at_once(workers, team):
    """Two workers handed the same compensating run at once: one compensates, the other leaves.

    Without the run's compensation lease both would call the remote; one that reconciles by
    lookup rather than by idempotency key would then refund twice."""
    with HttpSink() as sink:
        sink.fail_next(1, 400, path="/charge")
        release = {"tool": "http.request", "params": {"method": "POST", "url": f"{sink.url}/release"}}
        version, _ = workflow_save(team=team, definition={
            "name": "double-undo", "input_schema": {"type": "object"}, "steps": [
                post("reserve", f"{sink.url}/reserve", compensate=release),
                post("charge", f"{sink.url}/charge", after=["reserve"])]}, actor=SETUP)
        # Every call takes a while - the release too, long enough for the duplicates to land. Set
        # before the run starts: set later, a quick release could end the compensation before
        # the test ever saw the run compensating.
        sink.delay_s = 1.5
        run = run_start(version=version, input={}, actor=SETUP)
        wait_for(lambda: Run.objects.filter(id=run.id, state="compensating").exists())
        for _ in range(3):
            compensate_run.apply_async((str(run.id),), queue="tools")
        run = wait_for_run(run.id, states=("failed", "compensation_failed"))
        assert run.state == "failed", run.error
        assert sink.by_key[f"{run.id}:reserve:compensate"] == 1


def test_step_of_a_killed_worker_is_retried_when_its_lease_expires(workers, team):
    with HttpSink() as sink:
        sink.hold("/think")  # the call stays unanswered until the worker has been killed
        version, _ = workflow_save(team=team, definition={
            "name": "long-think", "input_schema": {"type": "object"}, "steps": [{
                "name": "think", "type": "tool", "tool": "http.request",
                "retry": {"max_attempts": 3, "base_s": 0.1, "jitter": False},
                "params": {"method": "POST", "url": f"{sink.url}/think"}}]}, actor=SETUP)
        run = run_start(version=version, input={}, actor=SETUP)
        wait_for(lambda: sink.arrivals["/think"] == 1)
        step = StepRun.objects.get(run=run, name="think")
        first_term = step.started_at + timedelta(seconds=LEASE_S)
        # The heartbeat renews the lease past its first term while the call is in progress.
        wait_for(lambda: StepRun.objects.get(id=step.id).lease_expires_at > first_term, timeout=LEASE_S * 3)
        workers.kill()
        sink.release("/think")  # the next attempt is answered at once
        try:
            reap_until(lambda: StepRun.objects.filter(run=run, name="think", attempts=1)
                       .exclude(state="running").exists())
        finally:
            workers.start()
        run = wait_for_run(run.id, states=("completed", "failed"))
        assert run.state == "completed"
        attempts = list(StepRun.objects.get(run=run, name="think").attempt_records.values_list("outcome", flat=True))
        assert attempts == ["lost", "succeeded"]


def test_duplicate_deliveries_do_nothing_for_work_already_claimed_or_done(workers, team):
    with HttpSink() as sink:
        version, _ = workflow_save(team=team, definition={
            "name": "dupes", "input_schema": {"type": "object"},
            "steps": [post("pay", f"{sink.url}/pay")]}, actor=SETUP)
        run = run_start(version=version, input={}, actor=SETUP)
        step = StepRun.objects.get(run=run, name="pay")
        for _ in range(3):  # the broker delivers the same message again, out of order
            execute_step.apply_async((step.id,), queue="tools")
        run = wait_for_run(run.id, states=("completed", "failed"))
        for _ in range(2):  # and again after the work is done
            execute_step.apply_async((step.id,), queue="tools")
        time.sleep(1)
        assert run.state == "completed"
        assert StepRun.objects.get(id=step.id).attempts == 1
        assert len(sink.requests) == 1 and sink.effects == {f"{run.id}:pay:default": 1}
        assert Run.objects.get(id=run.id).state == "completed"


def test_a_failing_dependency_stops_being_called_once_its_breaker_opens(workers, team):
    with HttpSink() as sink:
        sink.fail_next(100, 503)
        version, _ = workflow_save(team=team, definition={
            "name": "flaky", "input_schema": {"type": "object"},
            "steps": [post("call", f"{sink.url}/flaky")]}, actor=SETUP)
        runs = []
        for _ in range(7):  # one after another, as a stream of work would arrive
            runs.append(wait_for_run(run_start(version=version, input={}, actor=SETUP).id, states=ENDED))
        assert [r.state for r in runs] == ["failed"] * 7
        assert len(sink.requests) == 5  # STEPWISE_BREAKER_FAILURES: then no more calls
        errors = [StepRun.objects.get(run=r).error["message"] for r in runs]
        assert all(e.startswith("circuit open for tool:http.request:127.0.0.1") for e in errors[5:])


def test_map_items_that_fail_transiently_are_retried_and_the_chord_joins_them(workers, team):
    with HttpSink() as sink:
        sink.fail_next(3, 503, path="/item")
        version, _ = workflow_save(team=team, definition={
            "name": "flaky-fan", "input_schema": {"type": "object"}, "steps": [{
                "name": "each", "type": "map", "over": "input.items", "item": {
                    "type": "tool", "tool": "http.request",
                    "retry": {"max_attempts": 3, "base_s": 0.1, "max_s": 0.2, "jitter": False},
                    "params": {"method": "POST", "url": f"{sink.url}/item", "json": {"n": "{{ item }}"}}}}]}, actor=SETUP)
        run = wait_for_run(run_start(version=version, input={"items": [1, 2, 3, 4]}, actor=SETUP).id,
                           states=("completed", "failed"))
        assert run.state == "completed", run.error
        assert [o["status"] for o in run.steps.get().output] == [200] * 4
        assert len(sink.requests) == 7
        assert run.events.filter(kind="step.item_retrying").count() == 3


def test_a_fan_out_keeps_to_max_parallel_and_leaves_the_shared_workers_to_another_run(workers, team):
    """One run's fan-out and another run compete for the same workers.

    The worker group runs two tasks at once (`-c 2`); the fan-out may hold one (max_parallel),
    so the other run's step gets the second worker while the fan-out still has most of its
    items to go. Without the map-item cap both workers run items and the sink sees two item
    calls at once.
    """
    items = 16
    with HttpSink() as sink:
        big, small = fan_out_and_single(team, sink, max_parallel=1)
        assert (queue_of(big, "each"), queue_of(small, "one")) == ("tools.batch", "tools")
        paths = compete(big, small, sink, items=items)
        assert sink.peak["/item"] == 1, "the fan-out ran more items at once than max_parallel"
        assert paths.index("/small") <= items // 2, paths
        assert paths.count("/item") == items


def test_a_fan_out_without_a_cap_does_not_stand_in_front_of_another_runs_step(workers, team):
    """Fair by default: the fan-out sets no max_parallel (the default, 10, is more than the two
    worker processes), so nothing holds its items back; every one of them is queued before the
    other run's step. Map items go to the batch side of the queue (tools.batch), which the same
    workers take from in turn with `tools`, so the step starts after the items already running
    and the one or two each process has reserved, not after all of them. On one queue it would
    wait behind the whole fan-out.
    """
    items = 16
    with HttpSink() as sink:
        big, small = fan_out_and_single(team, sink)
        paths = compete(big, small, sink, items=items)
        assert sink.peak["/item"] == 2, "both worker processes should have run items at once"
        assert paths.index("/small") <= 4, paths
        assert paths.count("/item") == items


def fan_out_and_single(team, sink: HttpSink, **options):
    """A map of HTTP calls to the sink's /item, and a one-step run calling its /small."""
    big, _ = workflow_save(team=team, definition={
        "name": "fanout", "input_schema": {"type": "object"}, **options,
        "steps": [{"name": "each", "type": "map", "over": "input.items", "item": {
            "type": "tool", "tool": "http.request",
            "params": {"method": "POST", "url": f"{sink.url}/item", "json": {"n": "{{ item }}"}}}}]},
        actor=SETUP)
    small, _ = workflow_save(team=team, definition={
        "name": "small", "input_schema": {"type": "object"}, "steps": [
            {"name": "one", "type": "tool", "tool": "http.request",
             "params": {"method": "POST", "url": f"{sink.url}/small"}}]}, actor=SETUP)
    return big, small


def compete(big, small, sink: HttpSink, *, items: int) -> list[str]:
    """Start the fan-out, then (its item messages all queued) the single step; wait for both to
    complete; return the sink's request paths in arrival order."""
    sink.delay_s = 0.3  # every call takes a while: a worker running it is busy
    fan_out = run_start(version=big, input={"items": list(range(items))}, actor=SETUP)
    wait_for(lambda: sink.arrivals["/item"] >= 1)
    other = run_start(version=small, input={}, actor=SETUP)
    assert wait_for_run(other.id, states=("completed", "failed")).state == "completed"
    fan_out = wait_for_run(fan_out.id, states=("completed", "failed"), timeout=120)
    assert fan_out.state == "completed", fan_out.error
    return [path for path, _ in sink.arrival_order]


def queue_of(version, step: str) -> str:
    spec = next(s for s in version.normalized["steps"] if s["name"] == step)
    return batch_queue_for(spec["item"]) if spec["type"] == "map" else queue_for(spec)
