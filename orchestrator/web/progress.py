"""How far a run has got, in real units, and the whole picture a live run page draws.

Reads only (the selectors layer): the API's run detail carries `run_progress`, the run page and
its websocket re-read `run_snapshot` each time they are nudged. Progress is counted, never
estimated: steps ended of the run's steps, map items done of each map step's items; there is no
percentage to invent.
"""
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal

from django.conf import settings
from django.db import connection
from django.db.models import Count, JSONField, OuterRef, Q, Subquery

from approvals.models import ApprovalRequest, ApprovalState, InputState, InputTask
from orchestrator.engine.attestation import attestation_problem, producer_of
from orchestrator.engine.selectors import definition_of, place_in_line
from orchestrator.engine.states import STEP_BROKEN, STEP_DONE, STEP_TERMINAL, StepKind, StepState
from orchestrator.models import Event, MapItem, Run, StepAttempt, StepRun


def _seconds(start, end) -> float | None:
    return round((end - start).total_seconds(), 3) if start and end else None


def _map_items(step_ids: list[int]) -> dict[int, tuple[int, int]]:
    rows = (MapItem.objects.filter(step_id__in=step_ids).values("step_id")
            .annotate(total=Count("id"), done=Count("id", filter=Q(done=True))))
    return {row["step_id"]: (row["done"], row["total"]) for row in rows}


def run_progress(run: Run, steps: list[StepRun] | None = None) -> dict:
    """{"steps_total", "steps_done", "steps_failed", "by_state", "map_items": [{"step", "done",
    "total"}]}: counts only. `steps` may be passed when already loaded."""
    steps = list(run.steps.all()) if steps is None else steps
    by_state: dict[str, int] = {}
    for step in steps:
        by_state[step.state] = by_state.get(step.state, 0) + 1
    maps = [s for s in steps if s.kind == StepKind.MAP]
    items = _map_items([s.id for s in maps]) if maps else {}
    return {
        "steps_total": len(steps),
        "steps_done": sum(1 for s in steps if s.state in STEP_TERMINAL),
        "steps_failed": sum(1 for s in steps if s.state in STEP_BROKEN),
        "by_state": by_state,
        "map_items": [{"step": s.name, "done": items.get(s.id, (0, 0))[0],
                       "total": items.get(s.id, (0, 0))[1]} for s in maps],
    }


def latest_event_of(run: Run) -> int:
    """The id of the run's newest outbox event (0 if none): what a page has seen."""
    return Event.objects.filter(run=run).order_by("-id").values_list("id", flat=True).first() or 0


LONG_POLL_MAX_S = 15.0  # under proxies' and the API fuzzer's 20 s request timeouts
LONG_POLL_INTERVAL_S = 0.25


class LongPollsExhausted(Exception):
    """The person already holds `STEPWISE_LONG_POLLS_PER_PERSON` long-polls in this process."""


_long_polls: dict[object, int] = {}
_long_polls_lock = threading.Lock()


@contextmanager
def long_poll_slot(person: object) -> Iterator[None]:
    """One of the few long-polls a person may hold at once in this web process: each holds a
    server thread while it waits, so one person's many cannot crowd out everyone else's
    requests. Raises LongPollsExhausted beyond `STEPWISE_LONG_POLLS_PER_PERSON`."""
    with _long_polls_lock:
        held = _long_polls.get(person, 0)
        if held >= settings.STEPWISE_LONG_POLLS_PER_PERSON:
            raise LongPollsExhausted(
                f"you already wait on {held} long-polls (STEPWISE_LONG_POLLS_PER_PERSON); "
                "wait for one to answer, or watch the run's websocket")
        _long_polls[person] = held + 1
    try:
        yield
    finally:
        with _long_polls_lock:
            if _long_polls[person] <= 1:
                del _long_polls[person]
            else:
                _long_polls[person] -= 1


def wait_for_event(run: Run, *, after: int, timeout: float) -> int:
    """Wait until `run` has an event newer than `after`, or `timeout` seconds pass; return its
    newest event id. Polls the outbox (one indexed query per interval): the long-poll of the
    API, for clients that cannot hold a websocket."""
    deadline = time.monotonic() + timeout
    while True:
        newest = latest_event_of(run)
        if newest > after or time.monotonic() >= deadline:
            return newest
        if settings.DB_POOL_MAX and not connection.in_atomic_block:
            # Pooled (the web server on PostgreSQL): give the connection back while waiting,
            # so sixteen long-polls do not hold the pool's sixteen connections.
            connection.close()
        time.sleep(min(LONG_POLL_INTERVAL_S, max(deadline - time.monotonic(), 0)))


def _attestation_of(step: StepRun) -> dict | None:
    """Who produced a completed step's output, and whether its signed record still holds (the
    check the scheduler makes before reading it: engine/attestation.py)."""
    if step.state != StepState.COMPLETED:
        return None
    producer, key = producer_of(step.attestation)
    problem = attestation_problem(step_id=step.id, output=step.output, attestation=step.attestation)
    return {"producer": producer, "key": key, "ok": problem is None, "problem": problem or ""}


def run_snapshot(run: Run) -> dict:
    """Everything the run page shows, as JSON-ready data: the run, its budget and progress, the
    DAG (nodes and edges) with each step's state, times, attempts, tokens, cost and error, and
    its pending approvals, open input tasks, sleeping steps and steps waiting for a signal.
    `run` should come from `selectors.runs_with_version()`."""
    definition, graph = definition_of(run)
    # A step whose output was reused from an earlier run's (services/results_cache.py): where
    # it came from, read in the same statement.
    reused = (StepAttempt.objects.filter(step=OuterRef("pk"), reused_from__isnull=False)
              .order_by("-number").values("reused_from")[:1])
    # The model routes the step's latest attempt tried: which answered, which failed before it.
    routes = (StepAttempt.objects.filter(step=OuterRef("pk")).order_by("-number").values("routes")[:1])
    steps = list(run.steps.order_by("position").annotate(
        attempt_records_failed=Count("attempt_records",
                                     filter=Q(attempt_records__outcome__in=("failed", "lost"))),
        reused_from=Subquery(reused, output_field=JSONField()),
        latest_routes=Subquery(routes, output_field=JSONField())))
    progress = run_progress(run, steps)
    pending = (ApprovalRequest.objects.filter(run=run, state=ApprovalState.PENDING)
               .select_related("step").order_by("id"))
    asking = [s.id for s in steps if s.kind == StepKind.HUMAN_INPUT and s.state == StepState.WAITING]
    # Read only while a step waits for input, so a run without one costs no statement more.
    inputs = (InputTask.objects.filter(step_id__in=asking, state=InputState.OPEN)
              .select_related("step").order_by("id") if asking else [])
    budget = definition.get("budget") or {}
    max_cost = budget.get("max_cost_usd")
    return {
        "id": str(run.id),
        "workflow": run.version.workflow.name,
        "version": run.version.number,
        "state": run.state,
        "created_at": run.created_at, "started_at": run.started_at, "finished_at": run.finished_at,
        "duration_s": _seconds(run.started_at, run.finished_at),
        "cost_usd": run.cost_usd,
        "budget_usd": Decimal(str(max_cost)) if max_cost is not None else None,
        "max_duration_s": budget.get("max_duration_s"),
        "deadline_at": run.deadline_at,
        "tokens_in": run.tokens_in, "tokens_out": run.tokens_out,
        "error": run.error,
        "progress": progress,
        "last_event": latest_event_of(run),
        "steps": [{
            "id": s.id, "name": s.name, "kind": s.kind, "state": s.state,
            "after": list(graph.steps[s.name].get("after", [])) if s.name in graph.steps else [],
            "attempts": s.attempts, "retries": max(s.attempts - 1, 0),
            "failed_attempts": s.attempt_records_failed,
            "started_at": s.started_at, "finished_at": s.finished_at,
            "duration_s": _seconds(s.started_at, s.finished_at),
            "tokens_in": s.tokens_in, "tokens_out": s.tokens_out, "cost_usd": s.cost_usd,
            "error": s.error, "skip_reason": s.skip_reason, "waiting_for": s.waiting_for,
            "done": s.state in STEP_DONE,
            "next_attempt_at": s.next_attempt_at, "wake_at": s.wake_at,
            "reused_from": s.reused_from,
            "routes": s.latest_routes or [],
            "attestation": _attestation_of(s),
        } for s in steps],
        "approvals": [{"id": a.id, "step": a.step.name, "approvers": a.approvers,
                       "risk_tier": a.risk_tier, "deadline_at": a.deadline_at}
                      for a in pending],
        # What else the run waits for, and until when: each open input task, each sleep step
        # still sleeping, each wait step still waiting (and the signal it waits for).
        "inputs": [{"id": t.id, "step": t.step.name, "group": t.group, "assignee": t.assignee,
                    "until": t.deadline_at} for t in inputs],
        "sleeps": [{"step": s.name, "until": s.wake_at} for s in steps
                   if s.kind == StepKind.SLEEP and s.state == StepState.WAITING],
        "signals": [{"step": s.name, "signal": graph.steps[s.name]["signal"], "until": s.deadline_at}
                    for s in steps if s.kind == StepKind.WAIT and s.state == StepState.WAITING],
        # Held behind other runs of its concurrency key: its place in line (1: next).
        "held": [{"key": run.concurrency_key, "place": place}] if (place := place_in_line(run)) else [],
    }
