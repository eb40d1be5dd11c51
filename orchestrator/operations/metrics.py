"""Prometheus metrics (docs/operations.md#metrics): what every process counts, and what the
database says at scrape time.

Counters and histograms are updated where things happen — a worker's step (duration,
scheduling latency, tokens and cost by model), the outbox (retries, dead letters: `observe_event`,
called by `orchestrator.engine.events` after commit) and alerts — in whichever process that is. They
are prometheus-client metrics in multiprocess mode: each process writes its values to files under
PROMETHEUS_MULTIPROC_DIR (set in the settings before this module is imported, var/prometheus/ by
default), so the prefork children of every Celery worker and the web process all count, and
`/metrics` adds them up. The gauges — runs by state, queue depth and oldest age per queue,
pending approvals and their age, open alerts — are read from the database when scraped
(`DatabaseCollector`), so they are right whichever process changed them.

Reads only; the scrape is protected (`orchestrator.web.api.metrics`).
"""
import os
from pathlib import Path

from django.db.models import Count, Min
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily

from alerts.models import Alert, AlertState
from approvals.models import ApprovalRequest, ApprovalState
from orchestrator.engine.clock import now
from orchestrator.engine.states import RunState, StepState
from orchestrator.models import Run, StepRun

from .queues import capacity_of_queue

STEP_DURATION = Histogram(
    "stepwise_step_duration_seconds", "How long a worker step's executor ran.",
    ["kind", "queue", "outcome"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600))
# Summed over the processes alive at the scrape: a killed worker's steps stop counting with it.
EXECUTING = Gauge("stepwise_steps_executing", "Worker steps whose executor is running now.",
                  ["kind", "queue"], multiprocess_mode="livesum")
SCHEDULING_LATENCY = Histogram(
    "stepwise_step_scheduling_latency_seconds", "From a step queued to a worker claiming it.",
    ["queue"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300))
RETRIES = Counter("stepwise_step_retries", "Step attempts that failed and will be retried.",
                  ["error_class"])
DEAD_LETTERS = Counter("stepwise_dead_letters", "Work dead-lettered (failed for good).",
                       ["error_class"])
TOKENS = Counter("stepwise_model_tokens", "Tokens spent, by model and direction.",
                 ["model", "direction"])
COST = Counter("stepwise_model_cost_usd", "Money spent on model calls, by model.", ["model"])
ALERTS = Counter("stepwise_alerts_raised", "Alerts raised, by rule and severity.",
                 ["rule", "severity"])


def observe_event(kind: str, payload: dict) -> None:
    """Count what an outbox event reports (after its transaction committed)."""
    payload = payload if isinstance(payload, dict) else {}
    if kind == "step.retrying":
        RETRIES.labels(payload.get("class", "unknown")).inc()
    elif kind == "step.dead_lettered":
        DEAD_LETTERS.labels(payload.get("class", "unknown")).inc()


def observe_usage(*, model: str, tokens_in: int, tokens_out: int, cost_usd) -> None:
    if not (tokens_in or tokens_out or cost_usd):
        return
    model = model or "unknown"
    TOKENS.labels(model, "in").inc(tokens_in)
    TOKENS.labels(model, "out").inc(tokens_out)
    COST.labels(model).inc(float(cost_usd))


class DatabaseCollector:
    """The gauges read from the database at each scrape."""

    def collect(self):
        at = now()
        runs = GaugeMetricFamily("stepwise_runs", "Runs by state.", labels=["state"])
        counts = dict(Run.objects.values_list("state").annotate(n=Count("id")).order_by())
        for state in Run._meta.get_field("state").choices:
            runs.add_metric([state[0]], counts.get(state[0], 0))
        yield runs

        depth = GaugeMetricFamily("stepwise_queue_depth", "Steps queued and not yet claimed.",
                                  labels=["queue", "capacity"])
        oldest = GaugeMetricFamily("stepwise_queue_oldest_age_seconds",
                                   "How long the oldest queued step has waited.", labels=["queue", "capacity"])
        for row in (StepRun.objects.filter(state=StepState.QUEUED).values("queue")
                    .annotate(n=Count("id"), first=Min("queued_at")).order_by("queue")):
            labels = [row["queue"], capacity_of_queue(row["queue"])]
            depth.add_metric(labels, row["n"])
            waited = (at - row["first"]).total_seconds() if row["first"] else 0
            oldest.add_metric(labels, max(waited, 0))
        yield depth
        yield oldest
        yield GaugeMetricFamily("stepwise_runs_held", "Runs held behind their concurrency key.",
                                value=Run.objects.filter(state=RunState.PENDING).exclude(concurrency_key="").count())

        pending = ApprovalRequest.objects.filter(state=ApprovalState.PENDING).aggregate(
            n=Count("id"), first=Min("requested_at"))
        yield GaugeMetricFamily("stepwise_approvals_pending", "Approval requests waiting.",
                                value=pending["n"])
        yield GaugeMetricFamily(
            "stepwise_approval_oldest_age_seconds", "How long the oldest pending request waited.",
            value=max((at - pending["first"]).total_seconds(), 0) if pending["first"] else 0)

        open_alerts = GaugeMetricFamily("stepwise_alerts_open", "Alerts not resolved yet.",
                                        labels=["rule", "severity"])
        for rule, severity, n in (Alert.objects.exclude(state=AlertState.RESOLVED)
                                  .values_list("rule", "severity").annotate(n=Count("id"))
                                  .order_by()):
            open_alerts.add_metric([rule, severity], n)
        yield open_alerts


def dependency_families(readings) -> list[GaugeMetricFamily]:
    """How hard each model and rate-limited tool is pressed, shared by every worker, from
    `limits.saturation_of`'s readings (the caller reads them: this layer is below the limits)."""
    calls = GaugeMetricFamily("stepwise_dependency_calls_per_second",
                              "Calls started to the dependency in the current second.", labels=["dependency"])
    limit = GaugeMetricFamily("stepwise_dependency_rate_limit",
                              "Calls a second the dependency is allowed (STEPWISE_RATE_LIMITS).",
                              labels=["dependency"])
    open_s = GaugeMetricFamily("stepwise_dependency_breaker_open_seconds",
                               "How long the dependency's circuit breaker stays open (0: closed).",
                               labels=["dependency"])
    failures = GaugeMetricFamily("stepwise_dependency_failures",
                                 "Consecutive transient failures counted toward opening its breaker.",
                                 labels=["dependency"])
    for reading in readings:
        calls.add_metric([reading.dependency], reading.calls_this_second)
        if reading.rate_limit is not None:
            limit.add_metric([reading.dependency], reading.rate_limit)
        open_s.add_metric([reading.dependency], reading.breaker_open_s)
        failures.add_metric([reading.dependency], reading.failures)
    return [calls, limit, open_s, failures]


def quota_families(usage) -> list[GaugeMetricFamily]:
    """What each capacity class holds of each dependency's quota, from `quotas.quota_usage`'s
    readings (the caller reads them)."""
    calls = GaugeMetricFamily("stepwise_quota_calls_in_flight",
                              "Calls of the dependency the class holds a slot for now.",
                              labels=["dependency", "capacity"])
    tokens = GaugeMetricFamily("stepwise_quota_tokens_this_minute",
                               "Tokens of the dependency the class reserved or used this minute.",
                               labels=["dependency", "capacity"])
    calls_limit = GaugeMetricFamily("stepwise_quota_concurrent_limit",
                                    "Calls of the dependency allowed in flight (STEPWISE_QUOTAS).",
                                    labels=["dependency"])
    tokens_limit = GaugeMetricFamily("stepwise_quota_tokens_per_minute_limit",
                                     "Tokens of the dependency allowed a minute (STEPWISE_QUOTAS).",
                                     labels=["dependency"])
    limited = set()
    for reading in usage:
        calls.add_metric([reading.dependency, reading.capacity], reading.calls)
        tokens.add_metric([reading.dependency, reading.capacity], reading.tokens)
        if reading.dependency not in limited:
            limited.add(reading.dependency)
            if reading.calls_limit is not None:
                calls_limit.add_metric([reading.dependency], reading.calls_limit)
            if reading.tokens_limit is not None:
                tokens_limit.add_metric([reading.dependency], reading.tokens_limit)
    return [calls, tokens, calls_limit, tokens_limit]


class _Families:
    def __init__(self, read):
        self.read = read

    def collect(self):
        yield from self.read()


def metrics_text(*extra) -> bytes:
    """Every process's counters and histograms, the database's gauges, and the families each
    of `extra` (a function) gives at the scrape, in the text format."""
    _forget_dead_processes()
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    registry.register(DatabaseCollector())
    for read in extra:
        registry.register(_Families(read))
    return generate_latest(registry)


def process_start() -> None:
    """Drop the live gauges a dead process with this process's pid left behind; call it as a
    worker process starts, before it runs a step. Pids are reused (32,768 of them by default),
    and prometheus-client opens this process's files by pid: a new process given the pid of a
    worker killed mid-step would read that worker's `stepwise_steps_executing` back as its own
    starting value and count its step forever. Counters and histograms are left: they are
    sums, and a reused file only goes on adding to them."""
    multiprocess.mark_process_dead(os.getpid())


def _forget_dead_processes() -> None:
    """Drop the live gauges (`stepwise_steps_executing`) of processes that are gone, a worker
    killed mid-step included, so they stop counting: prometheus-client leaves that to us."""
    for path in Path(os.environ["PROMETHEUS_MULTIPROC_DIR"]).glob("gauge_live*_*.db"):
        pid = int(path.stem.rsplit("_", 1)[1])
        if not _alive(pid):
            multiprocess.mark_process_dead(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's
    try:  # killed and not yet reaped: a zombie runs nothing
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True  # no /proc here: trust the signal
