"""Measurements made in the bench process itself, with no worker running.

They drive one chain through the same step services a worker calls (claim, execute, succeed)
to count SQL statements and time the engine's own work per step, and they price a fresh
database connection. Nothing here sends a message that anything consumes: the dispatches the
services make on commit stay in the broker, which is deleted with the backend's scratch state.
"""
from __future__ import annotations

import base64
import time
from collections import Counter

from .stats import summary


def _step_through(run, step_id: int, *, spy=None) -> None:
    """Do on this process what a worker does with one step: claim, execute, succeed.

    `spy(phase)` is a context manager entered around each phase (claim, execute, succeed).
    """
    from contextlib import nullcontext

    from audit.services import external_call_authorize
    from budgets.services import cost_of
    from orchestrator.engine.executors import ExecContext, execute
    from orchestrator.engine.services.kinds import worker as services

    spy = spy or (lambda phase: nullcontext())
    with spy("claim"):
        claim = services.step_claim(step_id=step_id, worker="bench")
    with spy("execute"):
        result = execute(claim.spec, claim.step_input,
                         ExecContext(str(run.id), claim.workflow, claim.spec["name"],
                                     claim.attempt, claim.idempotency_key, step_id=step_id,
                                     authorize=external_call_authorize, price=cost_of))
    with spy("succeed"):
        services.step_succeed(step_id=step_id, attempt=claim.attempt, output=result.output,
                              usage=services.Usage(), worker="bench")


def _step_ids(run) -> list[int]:
    from orchestrator.models import StepRun

    return list(StepRun.objects.filter(run=run).order_by("position").values_list("id", flat=True))


def service_time_per_step(version, *, runs: int = 3) -> dict:
    """Wall time of claim + execute + succeed of one (not last) step, in this process.

    The engine's own cost per step, database included, with no broker hop and no other load:
    one worker process cannot go faster than 1000 / p50 steps per second.
    """
    from orchestrator.engine.authz import System
    from orchestrator.engine.services.runs import run_start

    times = []
    for _ in range(runs):
        run = run_start(version=version, input={}, actor=System("bench"))
        ids = _step_ids(run)
        for step_id in ids[:-1]:
            t0 = time.perf_counter()
            _step_through(run, step_id)
            times.append((time.perf_counter() - t0) * 1000)
        _step_through(run, ids[-1])
    return summary(times)


def carried_service_time_per_step(version, *, runs: int = 3) -> dict:
    """Wall time per step of a whole chain run from its first step's message, in this process:
    `step_execute` with a carry (worker.Carry), as the worker's task calls it, so every step
    after the first is claimed in the transaction that completed the one before it and run
    with no claim transaction and no broker hop. One sample per run (its steps' mean)."""
    times = [_carried_run_ms_per_step(version, {}) for _ in range(runs + 1)]
    return summary(times[1:])  # the first warms the per-process caches


def python_calls_per_carried_step(version, *, runs: int = 3) -> dict:
    """Python function calls (cProfile's count, C functions included) per step of a carried
    chain, the run's start counted with its steps: the engine's CPU per step in a unit the
    machine's speed does not move, so two trees can be compared on a noisy machine."""
    import cProfile
    import pstats

    _carried_chain(version)  # warms the per-process caches and compiled statements
    profile = cProfile.Profile()
    steps = 0
    profile.enable()
    try:
        for _ in range(runs):
            steps += _carried_chain(version)
    finally:
        profile.disable()
    return {"runs": runs, "steps": steps, "calls_per_step": round(pstats.Stats(profile).total_calls / steps)}


def round_trips(fn) -> tuple[int, object]:
    """(the round trips to PostgreSQL `fn()` made on this thread's connection, what it returned),
    counted by libpq's own protocol trace: every exchange after which the client waits ends
    with the server's ReadyForQuery (one per simple query such as BEGIN or COMMIT, one per
    Sync: a statement sent alone, or a pipeline of them sent together)."""
    import tempfile

    from django.db import connection
    from psycopg import pq

    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    with tempfile.TemporaryFile() as trace:
        pgconn.trace(trace.fileno())
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            result = fn()
        finally:
            pgconn.untrace()
        trace.seek(0)
        lines = trace.read().decode(errors="replace").splitlines()
    return sum(1 for line in lines if line.startswith("B\t") and "\tReadyForQuery" in line), result


def round_trips_per_carried_step(version, *, runs: int = 3) -> dict | None:
    """Round trips to the database per step of a chain carried from its first message (its
    run's start included), the statements already prepared; None on SQLite (no server)."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return None
    _carried_chain(version)  # warm: the statements prepared
    trips = steps = 0
    for _ in range(runs):
        made, count = round_trips(lambda: _carried_chain(version))
        trips, steps = trips + made, steps + count
    return {"runs": runs, "steps": steps, "round_trips_per_step": round(trips / steps, 1)}


def _carried_chain(version) -> int:
    """Start a run and drive it from its first step's message with a carry, as a worker's task
    does; its number of steps."""
    from orchestrator.engine.authz import System
    from orchestrator.engine.services.kinds import worker as services
    from orchestrator.engine.services.runs import run_start

    run = run_start(version=version, input={}, actor=System("bench"))
    ids = _step_ids(run)
    services.step_execute(step_id=ids[0], worker="bench",
                          carry=services.Carry("tools", len(ids), time.monotonic() + 3600))
    return len(ids)


def _carried_run_ms_per_step(version, run_input: dict) -> float:
    """Start a run and drive it from its first step's message with a carry, as a worker's task
    does; the wall time of that, per step, in ms."""
    from orchestrator.engine.authz import System
    from orchestrator.engine.services.kinds import worker as services
    from orchestrator.engine.services.runs import run_start

    run = run_start(version=version, input=run_input, actor=System("bench"))
    ids = _step_ids(run)
    carry = services.Carry("tools", len(ids), time.monotonic() + 3600)
    t0 = time.perf_counter()
    services.step_execute(step_id=ids[0], worker="bench", carry=carry)
    return (time.perf_counter() - t0) * 1000 / len(ids)


def attestation_cost_per_step(version, *, runs: int = 5) -> dict:
    """What attestation adds to a step (docs/audit.md#attestation), against the step's carried
    service time measured in the same process just before: per step, the worker's record (the
    hashes of the input, the definition's step and the output, one Ed25519 signature) and the
    scheduler's checks of the outputs the next step reads (every upstream step's output hashed
    again; a record's signature verified once per process, and not at all by the process that
    signed it), timed on the real rows of the chains just run; and one signature's verify, the
    cost a process pays the first time it reads a record another process signed. Medians over
    the chains' steps; `share` is their sum over the service time."""
    from orchestrator.engine.attestation import attestation_problem, known_key
    from orchestrator.engine.authz import System
    from orchestrator.engine.hashing import canonical_json
    from orchestrator.engine.selectors import spec_of
    from orchestrator.engine.services.kinds import worker as services
    from orchestrator.engine.services.runs import run_start
    from orchestrator.models import StepRun

    service = carried_service_time_per_step(version, runs=runs)
    sign, check, verify = [], [], []
    for _ in range(runs):
        run = run_start(version=version, input={}, actor=System("bench"))
        ids = _step_ids(run)
        services.step_execute(step_id=ids[0], worker="bench",
                              carry=services.Carry("tools", len(ids), time.monotonic() + 3600))
        steps = list(StepRun.objects.filter(run=run).order_by("position"))
        for n, step in enumerate(steps):
            claim = services.Claim(step.id, step.attempts, run.id, "bench", spec_of(run, step.name),
                                   step.input or {}, "key")
            t0 = time.perf_counter()
            signed = services.Trace(claim).record(step_id=step.id, attempt=step.attempts,
                                                  worker="bench", output=step.output,
                                                  usage=services.Usage())
            sign.append((time.perf_counter() - t0) * 1e6)
            # The next step's start reads every step up to this one, each checked.
            t0 = time.perf_counter()
            for upstream in steps[:n + 1]:
                assert attestation_problem(step_id=upstream.id, output=upstream.output,
                                           attestation=upstream.attestation) is None
            check.append((time.perf_counter() - t0) * 1e6)
            public = known_key(signed["key"]).public
            message = canonical_json(signed["record"]).encode("ascii")
            raw = base64.b64decode(signed["sig"])
            t0 = time.perf_counter()
            public.verify(raw, message)
            verify.append((time.perf_counter() - t0) * 1e6)
    per_step_us = summary(sign)["p50"] + summary(check)["p50"]
    return {"sign_us": summary(sign), "checks_of_upstream_us": summary(check),
            "verify_us": summary(verify), "service_ms": service,
            "per_step_us": round(per_step_us, 1),
            "share": round(per_step_us / (service["p50"] * 1000), 4)}


def large_values(team, *, steps: int = 5, value_kb: int = 256, runs: int = 3) -> dict:
    """A chain whose every step outputs a value of `value_kb` KB (a document read and passed
    on), run from its first message in this process, with large values in the row and as
    artifacts (orchestrator.engine.artifacts). Each step's input holds every upstream output, so in
    the row a run stores them again and again; as artifacts, once each.

    Per mode: the database's growth per run, the artifact storage's, and the wall time per
    step. Every run's document is its own, so nothing is shared across runs.
    """
    import random
    import string

    from django.conf import settings
    from django.test.utils import override_settings

    from orchestrator.engine.authz import System
    from orchestrator.engine.services.workflows import workflow_save

    from .scale import database_bytes

    rng = random.Random(16)

    version, _ = workflow_save(team=team, actor=System("bench"), definition={
        "name": "bench-large", "input_schema": {"type": "object"},
        "steps": [{"name": f"s{i}", "type": "tool", "tool": "core.echo",
                   "params": {"text": "{{ input.document }} / " + f"s{i}"},
                   **({"after": [f"s{i - 1}"]} if i else {})} for i in range(steps)]})

    def artifact_bytes() -> int:
        root = settings.STEPWISE_ARTIFACTS_DIR
        return sum(p.stat().st_size for p in root.rglob("*.json")) if root.exists() else 0

    def document() -> str:
        # Words of random letters: text that PostgreSQL's TOAST cannot compress away, as a
        # repeated sentence would be (a real document compresses 2-3 x; this is the worst case).
        words, size = [], 0
        while size < value_kb * 1024:
            words.append("".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 10))))
            size += len(words[-1]) + 1
        return " ".join(words)

    def one_run() -> float:
        return _carried_run_ms_per_step(version, {"document": document()})

    modes = {}
    for mode, limit in (("in_row", 0), ("artifacts", settings.STEPWISE_ARTIFACT_BYTES)):
        with override_settings(STEPWISE_ARTIFACT_BYTES=limit):
            one_run()  # warm
            db0, files0 = database_bytes(), artifact_bytes()
            times = [one_run() for _ in range(runs)]
            modes[mode] = {
                "database_kb_per_run": round((database_bytes() - db0) / runs / 1024),
                "artifact_kb_per_run": round((artifact_bytes() - files0) / runs / 1024),
                "ms_per_step": summary(times),
            }
    return {"steps": steps, "value_kb": value_kb, "runs": runs,
            "threshold_bytes": settings.STEPWISE_ARTIFACT_BYTES, **modes}


def queries_per_step(version) -> dict:
    """Drive one chain through the step services in this process, counting SQL statements.

    claim = step_claim, the worker's first transaction; execute = whatever the executor
    queries; succeed = step_succeed, which commits the output and advances the run (enqueues
    the next step) in the same transaction. The lease heartbeat thread a worker runs
    around the executor is left out: it writes only every STEPWISE_LEASE_S / 3 seconds. Run
    with no worker consuming, so nothing races; the messages it dispatches are left in the
    broker and deleted with it.
    """
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from orchestrator.engine.authz import System
    from orchestrator.engine.services.runs import run_start

    # Warm what a process does once, not per step: its definition cache, and the registration
    # of the key it signs with (made with its first step's output).
    warm = run_start(version=version, input={}, actor=System("bench"))
    _step_through(warm, _step_ids(warm)[0])
    with CaptureQueriesContext(connection) as started:
        run = run_start(version=version, input={}, actor=System("bench"))
    phases = ("claim", "execute", "succeed")
    per_step: list[dict[str, list[str]]] = []
    for step_id in _step_ids(run):
        captured: dict[str, CaptureQueriesContext] = {}

        def spy(phase, captured=captured):
            captured[phase] = CaptureQueriesContext(connection)
            return captured[phase]

        _step_through(run, step_id, spy=spy)
        per_step.append({p: [q["sql"] for q in captured[p].captured_queries] for p in phases})

    middle = per_step[:-1] or per_step  # the last step completes the run instead
    counts = {p: sum(_data(step[p]) for step in middle) / len(middle) for p in phases}
    begins = sum(1 for step in middle for p in phases for q in step[p] if _kind(q) == "BEGIN")
    return {
        "vendor": connection.vendor,
        "run_start": _data([q["sql"] for q in started.captured_queries]),
        "per_step": {**counts, "total": sum(counts.values()),
                     # Django sends BEGIN itself on both backends, so it can be counted
                     "transactions": begins / len(middle)},
        "last_step": sum(_data(q) for q in per_step[-1].values()),
        "by_kind": dict(Counter(_kind(q) for step in middle for p in phases for q in step[p]
                                if _kind(q) not in TX_CONTROL)),
        "sample_step": {p: [q[:600] for q in per_step[len(middle) // 2][p]] for p in phases},
        "note": "SELECT/INSERT/UPDATE/DELETE statements; BEGIN/COMMIT/SAVEPOINT not counted",
    }


TX_CONTROL = {"BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE"}


def _kind(sql: str) -> str:
    return sql.split(None, 1)[0].upper() if sql else "?"


def _data(statements: list[str]) -> int:
    return sum(1 for q in statements if _kind(q) not in TX_CONTROL)


def db_sessions() -> int | None:
    """Connections ever opened to the bench database (PostgreSQL's pg_stat_database)."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
        return cursor.fetchone()[0]


def db_connect_ms(samples: int = 20) -> dict:
    """What opening a fresh database connection costs from this process (close, reconnect,
    SELECT 1): the price Celery's Django fixup makes every task pay when it closes the
    connection around each task."""
    from django.db import connection

    times = []
    for _ in range(samples):
        connection.close()
        t0 = time.perf_counter()
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        times.append((time.perf_counter() - t0) * 1000)
    return summary(times)


def api_start_statements(token: str, workflow: str) -> dict:
    """SQL statements of one POST /api/v1/workflows/{workflow}/runs/, through Django's test
    client in this process (the view, run_start and the response serializer)."""
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    # A development host name: the embedded default answers to loopback names only.
    client = Client(HTTP_AUTHORIZATION=f"Token {token}", HTTP_HOST="localhost")
    with CaptureQueriesContext(connection) as captured:
        response = client.post(f"/api/v1/workflows/{workflow}/runs/", {"input": {}},
                               content_type="application/json")
    statements = [q["sql"] for q in captured.captured_queries]
    return {"status": response.status_code, "statements": _data(statements),
            "sql": [q[:300] for q in statements]}
