"""The scale phases of issue 16, each opt-in: API submission under concurrent clients, many
runs held at once, and a fan-out competing with single steps for the same workers.

- `api_submission`: C client threads, each with its own HTTP connection, POST runs of a
  workflow whose first step is a human gate (so the worker does no work meanwhile and the
  figure is the API's own), R requests in all. Per-request latency and requests per second.
- `held_runs`: N runs of a gate-first workflow started through `run_start` in batches of
  `BATCH` per transaction (the API phase above measures the HTTP path; 10,000 requests one by
  one would measure the HTTP client). Reports the time to start them and to have every gate
  open, the database size per run, the memory of every process, the idle step-to-step gap of
  *other* runs while they are held, then approves every gate (through `approval_grant`, as the
  approvals page does) and reports the grant rate and the drain rate.
- `sleeping_runs`: N runs of a sleep-first workflow, each waking at its own time in a window
  after they have all started, with `celery beat` sending the reaper's sweeps. Reports the
  database size per waiting run, the memory of every process while they wait, the idle step
  gap of other runs meanwhile, then the wake-up lag of each (its sleep step's completion, and
  its next step's start, minus its `wake_at`) and the rate the reaper woke them at.
- `fanout`: one run maps over M items of `core.echo` while single-step runs are started one
  at a time; each probe's step wait (queued -> started) while the map is still in flight is
  what a fan-out costs other runs.
- `evaluation_beside_live`: an evaluation of N cases (issue 45) of a workflow whose runs cost
  a known amount (a scripted agent step declaring its tokens, two echo steps, a side-effecting
  email answered by the sandbox), its budget spent after a share of them, while runs of the
  bench's chain are started one at a time through the API, as in the idle phase. Reports the
  evaluation's end (state, cost against budget, cases run, rate) and the live runs' step gap
  and start latency while it ran.

Like the rest of the bench, it drives Stepwise only through its API and services and reads
its state through its models.
"""
from __future__ import annotations

import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from .procs import peak_rss
from .stats import lags_ms, say, summary

BATCH = 200
# Time between the expected end of the sleeping runs' starts and their first wake-up: the
# other runs' step gap is measured in it, with every run asleep.
WAKE_MARGIN_S = 20
GATE_GROUP = "bench_leads"
RUN_ENDED = ("completed", "failed", "cancelled", "timed_out")


def gate_definition(name: str) -> dict:
    """A human gate, then one echo step: a run that waits for a person, then finishes."""
    return {
        "name": name,
        "input_schema": {"type": "object"},
        "steps": [
            {"name": "gate", "type": "human_gate", "approvers": GATE_GROUP, "timeout_s": 86400},
            {"name": "after", "type": "tool", "tool": "core.echo", "params": {}, "after": ["gate"]},
        ],
    }


def sleep_definition(name: str) -> dict:
    """A sleep until the time in the run's input, then one echo step: a run that waits for a
    time, then finishes."""
    return {
        "name": name,
        "input_schema": {"type": "object", "required": ["wake_at"],
                         "properties": {"wake_at": {"type": "string"}}},
        "steps": [
            {"name": "nap", "type": "sleep", "until": "{{ input.wake_at }}"},
            {"name": "after", "type": "tool", "tool": "core.echo", "params": {}, "after": ["nap"]},
        ],
    }


def wait_definition(name: str) -> dict:
    """A wait for the signal `go`, then one echo step: a run that waits for an outside event,
    then finishes."""
    return {
        "name": name,
        "input_schema": {"type": "object"},
        "steps": [
            {"name": "signal", "type": "wait", "signal": "go", "timeout_s": 86400,
             "schema": {"type": "object", "required": ["k"]}},
            {"name": "after", "type": "tool", "tool": "core.echo", "params": {},
             "after": ["signal"]},
        ],
    }


def fanout_definition(name: str) -> dict:
    return {
        "name": name,
        "input_schema": {"type": "object"},
        "steps": [{"name": "each", "type": "map", "over": "input.items", "merge": "list",
                   "item": {"type": "tool", "tool": "core.echo", "params": {}}}],
    }


# The evaluation phase's agent step: the scripted model's reply declares its tokens, so every
# case run costs the same known amount at the registry's prices (budgets.services.cost_of).
EVAL_MODEL = "fast"
EVAL_TOKENS_IN, EVAL_TOKENS_OUT = 2000, 400
EVAL_OUTBOX = "bench@example.com"


def evaluation_definition(name: str) -> dict:
    """What each case of the evaluation phase runs: an agent step on the scripted model (its
    cost), two pure tool steps, and a side-effecting email, which the sandbox answers in place
    of the outbox (so no case reaches it)."""
    return {
        "name": name,
        "input_schema": {"type": "object", "required": ["k"], "properties": {"k": {"type": "integer"}}},
        "steps": [
            {"name": "draft", "type": "agent", "model": EVAL_MODEL, "timeout_s": 30,
             "prompt": "Label case {{ input.k }}.",
             "output_schema": {"type": "object", "required": ["label"],
                               "properties": {"label": {"type": "string"}}},
             "script": [{"output": {"label": "ok"}, "tokens_in": EVAL_TOKENS_IN,
                         "tokens_out": EVAL_TOKENS_OUT}]},
            {"name": "check", "type": "tool", "tool": "core.echo", "after": ["draft"],
             "params": {"label": "{{ steps.draft.output.label }}", "k": "{{ input.k }}"}},
            {"name": "shape", "type": "tool", "tool": "core.echo", "after": ["check"],
             "params": {"subject": "case {{ input.k }}: {{ steps.check.output.label }}"}},
            {"name": "notify", "type": "tool", "tool": "email.send", "side_effect": True,
             "after": ["shape"],
             "params": {"to": EVAL_OUTBOX, "subject": "{{ steps.shape.output.subject }}",
                        "body": "{{ steps.draft.output.label }}"}},
        ],
    }


def evaluation_cases(keys: range) -> list[dict]:
    """The cases keyed by `keys`, in three risk tiers; every other one declares what its email
    step answers (the rest get the sandbox's default answer)."""
    tiers = ("low", "medium", "high")
    return [{"key": f"case-{k:05d}", "input": {"k": k}, "risk_tier": tiers[k % 3],
             "expected": {"run": {"state": "completed"}, "steps": {"draft": {"output": {"label": "ok"}}}},
             **({"responses": {"notify": {"message_id": f"bench-{k}", "duplicate": False}}}
                if k % 2 == 0 else {})}
            for k in keys]


def evaluation_budget(cost_per_run, *, cases: int, share: float):
    """A budget spent after `share` of `cases` runs costing `cost_per_run` each (Decimal, to the
    cent's ten-thousandth, never below one run)."""
    from decimal import ROUND_HALF_UP, Decimal

    budget = (Decimal(cost_per_run) * cases * Decimal(str(share))).quantize(Decimal("0.000001"), ROUND_HALF_UP)
    return max(budget, Decimal(cost_per_run))


def single_definition(name: str) -> dict:
    return {"name": name, "input_schema": {"type": "object"},
            "steps": [{"name": "only", "type": "tool", "tool": "core.echo", "params": {}}]}


def make_fixtures(team_slug: str = "bench") -> dict:
    """The workflows and the approver these phases need, in the bench's team."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group

    from orchestrator.engine.services.workflows import workflow_save
    from orchestrator.models import Team

    team = Team.objects.get(slug=team_slug)
    owner = team.members.get(username="bench")
    approver = get_user_model().objects.create_user("bench-approver")
    team.members.add(approver, through_defaults={"role": "member"})
    approver.groups.add(Group.objects.get_or_create(name=GATE_GROUP)[0])
    saved = {}
    for name, definition in (("bench-api", gate_definition("bench-api")),
                             ("bench-held", gate_definition("bench-held")),
                             ("bench-sleep", sleep_definition("bench-sleep")),
                             ("bench-wait", wait_definition("bench-wait")),
                             ("bench-fanout", fanout_definition("bench-fanout")),
                             ("bench-eval", evaluation_definition("bench-eval")),
                             ("bench-single", single_definition("bench-single"))):
        saved[name], _ = workflow_save(team=team, definition=definition, actor=owner)
    return {"versions": saved, "approver": approver, "owner": owner}


# --- API submission under concurrent clients ------------------------------------------------


def due_times(start: float, *, index: int, clients: int, count: int, rate: float,
              poisson: bool) -> list[float]:
    """When client `index` of `clients` sends each of its `count` requests, for `rate` requests
    per second in all: evenly interleaved with the other clients', or (`poisson`) after gaps
    drawn from an exponential distribution of mean `clients / rate`, seeded by the client."""
    if not poisson:
        return [start + (k * clients + index) / rate for k in range(count)]
    gap = random.Random(index).expovariate
    due, at = [], start
    for _ in range(count):
        at += gap(rate / clients)
        due.append(at)
    return due


def api_submission(base_url: str, token: str, workflow: str, *, clients: int, requests: int,
                   deadline: float, rate: float | None = None, poisson: bool = False) -> dict:
    """`requests` POSTs spread over `clients` threads; latency of each, and the rate.

    Closed loop (no `rate`): each client sends its next request as soon as the last one is
    answered, so the server is saturated and the figure is its capacity. Open loop (`rate`
    requests per second in all): request k of client i is due at start + (k * clients + i) /
    rate whatever came before, and its latency counts from when it was due, so a server that
    falls behind is charged for the wait (no coordinated omission). With `poisson`, the due
    times are random instead of even: each client's gaps are exponential with mean
    clients / rate, so together the requests arrive as one Poisson stream of `rate` per second,
    as independent users' do.
    """
    import httpx

    latencies: list[float] = []
    statuses: dict[int, int] = {}
    lock = threading.Lock()
    share = [requests // clients + (1 if i < requests % clients else 0) for i in range(clients)]
    start = time.perf_counter() + 1.0  # every client connected before the first is due

    def client(index: int) -> None:
        due = due_times(start, index=index, clients=clients, count=share[index], rate=rate,
                        poisson=poisson) if rate else []
        with httpx.Client(base_url=base_url, timeout=30,
                          headers={"Authorization": f"Token {token}"}) as http:
            http.get("/api/v1/health/")  # open the connection outside the measurement
            for k in range(share[index]):
                if time.time() > deadline:
                    return
                if rate:
                    t0 = due[k]
                    time.sleep(max(t0 - time.perf_counter(), 0))
                else:
                    t0 = time.perf_counter()
                response = http.post(f"/api/v1/workflows/{workflow}/runs/", json={"input": {}})
                elapsed = (time.perf_counter() - t0) * 1000
                with lock:
                    latencies.append(elapsed)
                    statuses[response.status_code] = statuses.get(response.status_code, 0) + 1

    t0 = time.time()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))
    wall = time.time() - t0 - (1.0 if rate else 0)
    return {"clients": clients, "requests": len(latencies), "latency_ms": summary(latencies),
            "offered_per_s": rate, "arrivals": "poisson" if poisson else "even" if rate else None,
            "requests_per_s": round(len(latencies) / wall, 2) if wall > 0 else None,
            "statuses": {str(k): v for k, v in sorted(statuses.items())}, "wall_s": round(wall, 2)}


def runs_drained(workflow: str, *, deadline: float) -> float | None:
    """Wait until every run of `workflow` has ended; the seconds it took, None at the deadline."""
    from orchestrator.models import Run

    t0 = time.time()
    unfinished = Run.objects.filter(version__workflow__name=workflow).exclude(
        state__in=RUN_ENDED)
    while unfinished.exists():
        if time.time() > deadline:
            return None
        time.sleep(0.2)
    return round(time.time() - t0, 2)


# --- runs held at once ---------------------------------------------------------------------


def database_bytes() -> int:
    """The database's size as the engine sees it (PostgreSQL: on disk; SQLite: its pages)."""
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pg_database_size(current_database())")
            return cursor.fetchone()[0]
        cursor.execute("PRAGMA page_count")
        pages = cursor.fetchone()[0]
        cursor.execute("PRAGMA page_size")
        return pages * cursor.fetchone()[0]


def own_rss_mb() -> dict:
    """This measuring process's peak and current resident set, in MB."""
    fields = {}
    for line in open(f"/proc/{os.getpid()}/status").read().splitlines():
        if line.startswith(("VmHWM:", "VmRSS:")):
            name, value = line.split()[:2]
            fields[name.rstrip(":")] = round(int(value) / 1024, 1)
    return {"peak_mb": fields.get("VmHWM"), "now_mb": fields.get("VmRSS")}


def start_waiting_runs(version, *, runs: int, waiting, deadline: float, check, label: str,
                       run_input=lambda k: {}) -> dict:
    """Start `runs` runs of `version` through `run_start`, `BATCH` to a transaction, and wait
    until `waiting()` (how many of them wait now) counts them all; what they cost the database.

    The generic half of every phase whose runs wait holding no worker (a gate, a sleep): the
    runs' ids, how long starting them took, and the database's growth per run between before
    the first start and the moment they all wait. `run_input(k)` is run k's input.
    """
    from django.db import transaction

    from orchestrator.engine.authz import System
    from orchestrator.engine.services.runs import run_start

    before = database_bytes()
    t0 = time.time()
    run_ids: list = []
    while len(run_ids) < runs and time.time() < deadline:
        with transaction.atomic():
            run_ids += [run_start(version=version, input=run_input(k), actor=System("bench")).id
                        for k in range(len(run_ids), min(len(run_ids) + BATCH, runs))]
        if len(run_ids) % 2000 < BATCH:
            say(f"{label}: {len(run_ids)}/{runs} runs started")
    started = time.time()
    while waiting() < len(run_ids) and time.time() < deadline:
        check()
        time.sleep(0.5)
    all_waiting = time.time()
    size = database_bytes() - before
    return {
        "run_ids": run_ids, "runs": runs, "started": len(run_ids), "waiting": waiting(),
        "start_s": round(started - t0, 2),
        "start_runs_per_s": round(len(run_ids) / (started - t0), 1) if started > t0 else None,
        "all_waiting_s": round(all_waiting - t0, 2),
        "database_bytes_per_run": round(size / max(len(run_ids), 1)),
        "database_mb_added": round(size / 2**20, 1),
    }


def while_waiting(*, idle, processes: dict) -> dict:
    """What runs waiting cost everything else: the memory of every process in `processes`
    (a name to a process-group id) and of this one, and the other runs' step gap (`idle()`)."""
    memory = {name: peak_rss(pgid) for name, pgid in processes.items()}
    memory["measure"] = own_rss_mb()
    return {"memory": memory, "idle": idle()}


def held_runs(version, *, runs: int, approver, idle, deadline: float, check, processes: dict) -> dict:
    """Hold `runs` runs at a gate, measure, then release them all and time the drain.

    `idle()` measures the step-to-step gap of other runs (it is called while they are held);
    `processes` maps a name to a process-group id whose memory is reported.
    """
    from django.db import close_old_connections, connection

    from approvals.models import ApprovalRequest, ApprovalState
    from orchestrator.engine.authz import System
    from orchestrator.engine.errors import NotAllowed
    from orchestrator.engine.services.kinds.human_gate import approval_grant
    from orchestrator.engine.services.runs import run_cancel
    from orchestrator.models import Run

    pending = ApprovalRequest.objects.filter(run__version=version, state=ApprovalState.PENDING)
    start = start_waiting_runs(version, runs=runs, waiting=pending.count, deadline=deadline,
                               check=check, label="held")
    run_ids, held = start.pop("run_ids"), start.pop("waiting")
    say(f"held: {held} runs waiting at their gate; measuring the other runs' step gap")
    cost = while_waiting(idle=idle, processes=processes)

    say(f"held: approving {held} gates")
    ids = list(pending.values_list("id", "proposal_hash"))
    granted, failures = [], []

    # Grants stop with a third of the phase left, for the runs they released to end: the
    # phases after this one must find the workers idle, not behind a backlog of released runs.
    grants_until = time.time() + (deadline - time.time()) * 2 / 3

    def grant(chunk) -> None:
        try:
            for approval_id, proposal_hash in chunk:
                if time.time() > grants_until:
                    return
                approval_grant(approval_id=approval_id, user=approver, proposal_hash=proposal_hash)
                granted.append(time.time())
        except Exception as exc:  # reported, not raised: the drain of what was granted still counts
            failures.append(repr(exc)[:300])
        finally:
            connection.close()

    release = time.time()
    threads = 2
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(grant, [ids[i::threads] for i in range(threads)]))
    close_old_connections()
    released = time.time()
    mine = Run.objects.filter(id__in=run_ids)
    last_report = 0.0
    while mine.filter(state__in=RUN_ENDED).count() < len(granted) and time.time() < deadline:
        check()
        if time.time() - last_report > 10:
            say(f"held: {mine.filter(state__in=RUN_ENDED).count()}/{len(granted)} released runs ended")
            last_report = time.time()
        time.sleep(0.5)
    last_end = max(mine.filter(state__in=RUN_ENDED).values_list("finished_at", flat=True), default=None)
    ended = mine.filter(state__in=RUN_ENDED).count()
    drain_s = (last_end.timestamp() - release) if last_end else None
    # Whatever was released and has not ended is cancelled (its queued step's message then
    # does nothing), so that it is not measured as part of the next phase.
    left = list(mine.exclude(state__in=RUN_ENDED).exclude(state="waiting").values_list("id", flat=True))
    for run_id in left:
        try:
            run_cancel(run_id=run_id, actor=System("bench"), reason="bench: the held phase ended")
        except NotAllowed:
            pass  # it ended meanwhile
    return {
        "runs": runs, "started": len(run_ids), "held": held,
        "start_s": start["start_s"], "start_runs_per_s": start["start_runs_per_s"],
        "all_gates_open_s": start["all_waiting_s"],
        "database_bytes_per_run": start["database_bytes_per_run"],
        "database_mb_added": start["database_mb_added"],
        "memory_while_held": cost["memory"],
        "idle_while_held": cost["idle"],
        "granted": len(granted), "grant_failures": failures[:5],
        "grant_s": round(released - release, 2),
        "grants_per_s": round(len(granted) / (released - release), 1) if released > release else None,
        "ended": ended, "completed": mine.filter(state="completed").count(),
        "drain_s": round(drain_s, 2) if drain_s else None,
        "drain_runs_per_s": round(ended / drain_s, 1) if drain_s else None,
        "released_not_ended_cancelled": len(left),
    }


# --- runs asleep at once, woken by the reaper -----------------------------------------------


def wake_times(base: float, *, window_s: float, runs: int) -> list[float]:
    """`runs` wake-up times (epoch seconds) spread evenly over `window_s` from `base`, in order:
    the reaper is offered runs / window_s wake-ups a second, a stream rather than one burst."""
    return [base + window_s * k / runs for k in range(runs)]


def sleeping_runs(version, *, runs: int, window_s: float, idle, deadline: float, check,
                  processes: dict) -> dict:
    """Put `runs` runs to sleep at once, measure them waiting, then let the reaper wake them.

    Each run sleeps until its own time (`wake_times`), the first a margin after they are all
    expected to have started (from the rate a first batch started at), so that the database,
    the memory and the other runs' step gap (`idle()`) are measured with all of them asleep.
    Then each one's wake-up lag is read from its rows: its sleep step's `finished_at` and its
    next step's `started_at`, minus its `wake_at`. Needs beat sending the reaper's sweeps.
    """
    from datetime import UTC, datetime

    from django.conf import settings

    from orchestrator.engine.services import reaper
    from orchestrator.models import Run, StepRun

    def at(epoch: float) -> str:
        return datetime.fromtimestamp(epoch, UTC).isoformat()

    # A first batch, due at once (each completes as it starts): the rate runs start at here,
    # which places the window after the measured runs have all started.
    t0 = time.time()
    warm = start_waiting_runs(version, runs=BATCH, waiting=lambda: BATCH, deadline=deadline,
                              check=check, label="sleeping (first batch, due at once)",
                              run_input=lambda k: {"wake_at": at(t0)})
    rate = warm["start_runs_per_s"] or 1.0
    base = time.time() + 1.25 * runs / rate + WAKE_MARGIN_S
    times = wake_times(base, window_s=window_s, runs=runs)
    say(f"sleeping: starting {runs} runs (first batch {rate:.0f} runs/s), waking from "
        f"{base - time.time():.0f} s on over {window_s:.0f} s")

    naps = StepRun.objects.filter(run__version=version, name="nap")
    asleep = naps.filter(state="waiting", wake_at__isnull=False)
    start = start_waiting_runs(version, runs=runs, waiting=asleep.count, deadline=deadline,
                               check=check, label="sleeping",
                               run_input=lambda k: {"wake_at": at(times[k])})
    run_ids, waiting = start.pop("run_ids"), start.pop("waiting")
    say(f"sleeping: {waiting} runs asleep; measuring the other runs' step gap")
    cost = while_waiting(idle=idle, processes=processes)
    woken_early = naps.filter(run_id__in=run_ids, state="completed").count()

    mine = Run.objects.filter(id__in=run_ids)
    last_report = 0.0
    while mine.filter(state__in=RUN_ENDED).count() < len(run_ids) and time.time() < deadline:
        check()
        if time.time() - last_report > 10:
            say(f"sleeping: {naps.filter(run_id__in=run_ids, state='completed').count()} woken, "
                f"{mine.filter(state__in=RUN_ENDED).count()}/{len(run_ids)} runs ended")
            last_report = time.time()
        time.sleep(0.5)
    rows = {run_id: {"wake_at": wake_at, "woken": finished}
            for run_id, wake_at, finished in naps.filter(run_id__in=run_ids, state="completed")
            .values_list("run_id", "wake_at", "finished_at")}
    for run_id, started in StepRun.objects.filter(run_id__in=run_ids, name="after").exclude(
            started_at=None).values_list("run_id", "started_at"):
        if run_id in rows:
            rows[run_id]["next"] = started
    woken = sorted((r for r in rows.values() if r["woken"]), key=lambda r: r["wake_at"])
    wake_lag = lags_ms((r["wake_at"], r["woken"]) for r in woken)
    # The lag of each quarter of the window apart: a reaper falling behind shows as a lag that
    # grows from one quarter to the next, a slow moment of the machine as one quarter's.
    quarters = [summary(wake_lag[len(wake_lag) * q // 4:len(wake_lag) * (q + 1) // 4])
                for q in range(4)]
    next_lag = lags_ms((r["wake_at"], r["next"]) for r in woken if "next" in r)
    ended = mine.filter(state__in=RUN_ENDED).count()
    left = cancel_unended(run_ids, reason="bench: the sleeping phase ended")
    first_due = min((r["wake_at"] for r in woken), default=None)
    last_woken = max((r["woken"] for r in woken), default=None)
    span = (last_woken - first_due).total_seconds() if woken else None
    return {
        **start, "asleep": waiting, "window_s": window_s,
        "offered_wakes_per_s": round(runs / window_s, 1),
        "first_batch_runs_per_s": rate,
        "reap_interval_s": settings.CELERY_BEAT_SCHEDULE["stepwise-reap"]["schedule"],
        "reap_batch": reaper.BATCH,
        "memory_while_asleep": cost["memory"], "idle_while_asleep": cost["idle"],
        "woken_before_measured": woken_early, "woken": len(woken),
        "wake_lag_ms": summary(wake_lag), "next_step_lag_ms": summary(next_lag),
        "wake_lag_ms_by_quarter": [{"p50": q["p50"], "p99": q["p99"], "max": q["max"]}
                                   for q in quarters],
        "wakes_per_s": round(len(woken) / span, 1) if span else None,
        "ended": ended, "completed": mine.filter(state="completed").count(),
        "not_ended_cancelled": left,
    }


# --- runs waiting for a signal, then signalled ---------------------------------------------


def signalled_runs(version, *, runs: int, rate: float, idle, deadline: float, check,
                   processes: dict) -> dict:
    """Have `runs` runs wait for a signal at once, measure them waiting, then send each its
    signal through `signal_send` (as the API does), `rate` a second from two threads.

    Reported: what they cost while waiting (as `start_waiting_runs` and `while_waiting`), the
    time `signal_send` took, and each run's signal-to-next-step latency: from just before its
    signal was sent to its next step's `started_at`, read from the rows.
    """
    from datetime import UTC, datetime

    from django.db import connection

    from orchestrator.engine.authz import System
    from orchestrator.engine.services.signals import signal_send
    from orchestrator.models import Run, StepRun

    waits = StepRun.objects.filter(run__version=version, name="signal")
    waiting = waits.filter(state="waiting")
    start = start_waiting_runs(version, runs=runs, waiting=waiting.count, deadline=deadline,
                               check=check, label="signalled")
    run_ids, held = start.pop("run_ids"), start.pop("waiting")
    say(f"signalled: {held} runs waiting for their signal; measuring the other runs' step gap")
    cost = while_waiting(idle=idle, processes=processes)

    # Signals stop with a third of the phase left, for the runs they resumed to end.
    send_until = time.time() + (deadline - time.time()) * 2 / 3
    sent: dict = {}
    call_ms: list[float] = []
    failures: list[str] = []
    threads = 2
    begin = time.time()

    def send(lane: int) -> None:
        try:
            for k in range(lane, len(run_ids), threads):
                due = begin + k / rate
                if due > send_until:
                    return
                time.sleep(max(due - time.time(), 0))
                at = datetime.now(UTC)
                t = time.perf_counter()
                signal_send(run_id=run_ids[k], name="go", payload={"k": k}, key=f"bench-{k}",
                            actor=System("bench"))
                call_ms.append((time.perf_counter() - t) * 1000)
                sent[run_ids[k]] = at
        except Exception as exc:  # reported, not raised: what was sent still counts
            failures.append(repr(exc)[:300])
        finally:
            connection.close()

    say(f"signalled: sending {len(run_ids)} signals, {rate:.0f} a second")
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(send, range(threads)))
    sent_s = time.time() - begin
    mine = Run.objects.filter(id__in=list(sent))
    last_report = 0.0
    while mine.filter(state__in=RUN_ENDED).count() < len(sent) and time.time() < deadline:
        check()
        if time.time() - last_report > 10:
            say(f"signalled: {mine.filter(state__in=RUN_ENDED).count()}/{len(sent)} runs ended")
            last_report = time.time()
        time.sleep(0.5)
    nexts = dict(StepRun.objects.filter(run_id__in=list(sent), name="after")
                 .exclude(started_at=None).values_list("run_id", "started_at"))
    latency = lags_ms((at, nexts.get(run_id)) for run_id, at in sent.items())
    ended = mine.filter(state__in=RUN_ENDED).count()
    left = cancel_unended(run_ids, reason="bench: the signalled phase ended")
    return {
        **start, "waiting": held,
        "memory_while_waiting": cost["memory"], "idle_while_waiting": cost["idle"],
        "offered_signals_per_s": rate, "sent": len(sent), "send_failures": failures[:5],
        "signals_per_s": round(len(sent) / sent_s, 1) if sent_s > 0 else None,
        "signal_send_ms": summary(call_ms), "signal_to_next_step_ms": summary(latency),
        "ended": ended, "completed": mine.filter(state="completed").count(),
        "not_ended_cancelled": left,
    }


def cancel_unended(run_ids: list, *, reason: str) -> int:
    """Cancel every one of `run_ids` that has not ended (a waiting one included), so that it is
    not measured as part of the next phase; how many."""
    from orchestrator.engine.authz import System
    from orchestrator.engine.errors import NotAllowed
    from orchestrator.engine.services.runs import run_cancel
    from orchestrator.models import Run

    left = list(Run.objects.filter(id__in=run_ids).exclude(state__in=RUN_ENDED)
                .values_list("id", flat=True))
    for run_id in left:
        try:
            run_cancel(run_id=run_id, actor=System("bench"), reason=reason)
        except NotAllowed:
            pass  # it ended meanwhile
    return len(left)


# --- a fan-out and the single steps that wait behind it ------------------------------------


def fanout(base_url: str, token: str, *, items: int, probes: int, deadline: float, check) -> dict:
    """Start a run mapping over `items` items, then single-step runs one at a time while it is
    in flight: how long each single step waits between queued and started."""
    import httpx

    from orchestrator.models import Run, StepRun

    probes_seen: list[tuple[float, float, float]] = []  # (posted, queued, started), epoch s
    with httpx.Client(base_url=base_url, timeout=30,
                      headers={"Authorization": f"Token {token}"}) as http:
        t0 = time.time()
        response = http.post("/api/v1/workflows/bench-fanout/runs/",
                             json={"input": {"items": list(range(items))}})
        if response.status_code != 202:
            raise RuntimeError(f"fan-out start: HTTP {response.status_code} {response.text[:300]}")
        big = Run.objects.filter(id=response.json()["id"])
        for _ in range(probes):
            if time.time() > deadline or big.filter(state__in=RUN_ENDED).exists():
                break
            check()
            p0 = time.time()
            probe = http.post("/api/v1/workflows/bench-single/runs/", json={"input": {}}).json()["id"]
            while not Run.objects.filter(id=probe, state__in=RUN_ENDED).exists():
                if time.time() > deadline:
                    break
                check()
                time.sleep(0.01)
            row = StepRun.objects.filter(run_id=probe).values_list("queued_at", "started_at").first()
            if row and row[0] and row[1]:
                probes_seen.append((p0, row[0].timestamp(), row[1].timestamp()))
        while not big.filter(state__in=RUN_ENDED).exists() and time.time() < deadline:
            check()
            time.sleep(0.1)
        run = big.first()
        fan_end = run.finished_at.timestamp() if run.finished_at else float("inf")
        fan_s = (fan_end - t0) if run.finished_at else None
    # A probe counts if it was queued while the fan-out was still in flight, however long it
    # then waited (one that started after the fan-out ended waited behind all of it).
    during = [p for p in probes_seen if p[1] < fan_end]
    waits = [(started - queued) * 1000 for _, queued, started in during]
    starts = [(started - posted) * 1000 for posted, _, started in during]
    return {"items": items, "probes_during_fanout": len(during),
            "probe_wait_ms": summary(waits), "probe_start_latency_ms": summary(starts),
            "fanout_state": run.state, "fanout_s": round(fan_s, 2) if fan_s else None,
            "fanout_items_per_s": round(items / fan_s, 1) if fan_s else None}


# --- an evaluation beside live runs ------------------------------------------------------------


def evaluation_beside_live(version, *, owner, cases: int, concurrency: int, budget_share: float,
                           live, deadline: float, check, control_s: float = 15) -> dict:
    """Evaluate `version` over a dataset of `cases` cases with a budget spent after
    `budget_share` of them, and call `live(stop)` meanwhile: it starts live runs one at a time
    until `stop()` (the evaluation ended, or the deadline is near) and returns their figures.
    The same live runs are measured for `control_s` seconds just before, with nothing else in
    flight (`control`): on a machine others share, the idle phase's short window can catch a
    quieter or busier moment than the evaluation's, and the control is the same moment's.

    The evaluation is driven by the workers alone (each run's end advances it); this process
    only starts it and reads rows. Reported: its end (state, stop reason), its cost as it
    recorded it and as its runs spent in the end, against its budget (the overshoot: what the
    runs in flight when the budget was reached spent), the cases by state, how long it ran and
    the rate of case runs ended, the side effects answered by the sandbox against the emails
    that reached the outbox, and `live`'s figures.
    """
    from decimal import Decimal

    from django.conf import settings
    from django.db.models import Sum

    from budgets.services import cost_of
    from evaluation.evaluations import evaluation_cancel, evaluation_start
    from evaluation.limits import MAX_CASES_PER_CHANGE
    from evaluation.models import Evaluation, EvaluationCase
    from evaluation.services import dataset_cases_add, dataset_create
    from examples.tools import outbox_path
    from orchestrator.models import Event, Run

    t0 = time.time()
    dataset = dataset_create(workflow=version.workflow, name=f"bench-{int(t0)}", actor=owner)
    for first in range(0, cases, MAX_CASES_PER_CHANGE):
        dataset_cases_add(dataset=dataset, actor=owner,
                          cases=evaluation_cases(range(first, min(first + MAX_CASES_PER_CHANGE, cases))))
    dataset_s = time.time() - t0
    per_run = cost_of(settings.STEPWISE_MODELS[EVAL_MODEL], EVAL_TOKENS_IN, EVAL_TOKENS_OUT,
                      model=EVAL_MODEL)
    budget = evaluation_budget(per_run, cases=cases, share=budget_share)
    outbox = outbox_path()
    emails_before = _lines(outbox)
    say(f"evaluation: {cases} cases ({dataset_s:.1f} s to write them), {per_run:.6f} USD a run, "
        f"budget {budget} USD, {concurrency} at a time; live runs one at a time meanwhile")

    control_until = time.time() + control_s
    control = live(stop=lambda: time.time() > control_until) if control_s else None
    started = time.time()
    evaluation = evaluation_start(dataset=dataset, version=version.number, actor=owner, budget_usd=budget,
                                  concurrency=concurrency, note="bench")
    row = Evaluation.objects.filter(pk=evaluation.pk)
    ended = row.exclude(state="running")
    live_until = deadline - 0.25 * (deadline - started)  # the rest: the evaluation's end
    figures = live(stop=lambda: ended.exists() or time.time() > live_until)
    live_s = time.time() - started
    last_report = 0.0
    while not ended.exists() and time.time() < deadline:
        check()
        if time.time() - last_report > 10:
            say(f"evaluation: {EvaluationCase.objects.filter(evaluation=evaluation).exclude(run=None).count()} "
                f"cases started, {row.values_list('cost_usd', flat=True).first()} USD spent")
            last_report = time.time()
        time.sleep(0.2)
    cancelled_at_deadline = not ended.exists()
    if cancelled_at_deadline:
        evaluation_cancel(evaluation_id=evaluation.pk, actor=owner, reason="bench: the deadline")
    time.sleep(1)  # the model calls in flight when its runs were cancelled settle their cost
    evaluation.refresh_from_db()
    mine = EvaluationCase.objects.filter(evaluation=evaluation)
    runs = Run.objects.filter(evaluation_case__evaluation=evaluation)
    run_states = {state: runs.filter(state=state).count()
                  for state in runs.values_list("state", flat=True).distinct()}
    # What was spent in the end, read from the runs: a run cancelled at the stop whose model
    # call was in flight records that call's cost after the evaluation's own figure was taken.
    spent = ((runs.aggregate(total=Sum("cost_usd"))["total"] or Decimal("0"))
             + (mine.aggregate(total=Sum("grading_cost_usd"))["total"] or Decimal("0")))
    spent = spent.quantize(Decimal("0.000001"))
    duration = ((evaluation.finished_at - evaluation.created_at).total_seconds()
                if evaluation.finished_at else None)
    ran = runs.count()
    return {
        "cases": cases, "concurrency": concurrency, "dataset_write_s": round(dataset_s, 2),
        "cost_per_run_usd": str(per_run), "budget_share": budget_share, "budget_usd": str(budget),
        "state": evaluation.state, "stop_reason": evaluation.stop_reason,
        "cancelled_at_deadline": cancelled_at_deadline,
        "cost_usd": str(evaluation.cost_usd), "spent_usd": str(spent),
        "overshoot_usd": str(spent - budget),
        "overshoot_runs": round(float((spent - budget) / per_run), 2) if per_run else None,
        "case_states": {state: mine.filter(state=state).count()
                        for state in mine.values_list("state", flat=True).distinct()},
        "runs": ran, "run_states": run_states, "passed": mine.filter(passed=True).count(),
        "duration_s": round(duration, 2) if duration else None,
        "case_runs_per_s": round(ran / duration, 2) if duration else None,
        "sandboxed_effects": Event.objects.filter(run__in=runs, kind="step.sandboxed").count(),
        "emails_reaching_the_outbox": _lines(outbox) - emails_before,
        "live_s": round(live_s, 2), "live": figures, "control_s": control_s, "control": control,
    }


def _lines(path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0
