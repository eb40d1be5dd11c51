"""Percentiles, latency summaries, progress lines and the printed table."""
from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Iterable, Sequence


def say(message: str) -> None:
    """A progress line, tagged with the backend being measured."""
    print(f"[{os.environ.get('BENCH_BACKEND', '?')} {time.strftime('%H:%M:%S')}] {message}",
          flush=True)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation between ranks; None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summary(values: Iterable[float]) -> dict:
    """n, p50, p95, p99, min, max and mean of `values` (rounded to 0.01)."""
    data = list(values)
    out: dict = {"n": len(data)}
    for name, q in (("p50", 50), ("p95", 95), ("p99", 99)):
        out[name] = _round(percentile(data, q))
    out["min"] = _round(min(data)) if data else None
    out["max"] = _round(max(data)) if data else None
    out["mean"] = _round(sum(data) / len(data)) if data else None
    return out


def chain_latencies_ms(steps: Iterable[tuple], *, chain_length: int) -> list[float]:
    """next.started - previous.finished for consecutive steps of every complete chain.

    `steps` holds (chain key, position, started, finished) with epoch-second floats; chains
    missing a step (unfinished at the deadline) contribute only their complete pairs.
    """
    by_chain: dict[object, dict[int, tuple[float, float]]] = {}
    for key, position, started, finished in steps:
        if started is not None and finished is not None:
            by_chain.setdefault(key, {})[position] = (started, finished)
    latencies = []
    for positions in by_chain.values():
        for i in range(1, chain_length):
            if i - 1 in positions and i in positions:
                latencies.append((positions[i][0] - positions[i - 1][1]) * 1000)
    return latencies


def lags_ms(pairs: Iterable[tuple]) -> list[float]:
    """later - earlier in milliseconds for each (earlier, later) pair of aware datetimes, the
    pairs missing either left out (a step that never woke or never started)."""
    return [(later - earlier).total_seconds() * 1000 for earlier, later in pairs
            if earlier is not None and later is not None]


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a is not None and b else None


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _fmt(value) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def table(results: list[dict]) -> str:
    """The end-of-run table for every backend's result dict."""
    lines = [f"{'backend':<10}{'metric':<36}{'p50':>9}{'p95':>9}{'p99':>9}{'n':>7}"]

    def row(backend: str, metric: str, s: dict | None) -> None:
        s = s or {}
        lines.append(f"{backend:<10}{metric:<36}{_fmt(s.get('p50')):>9}{_fmt(s.get('p95')):>9}"
                     f"{_fmt(s.get('p99')):>9}{_fmt(s.get('n')):>7}")

    for r in results:
        b = r["backend"]
        if r.get("error"):
            lines.append(f"{b:<10}FAILED: {r['error']}")
        sw, fl, q, st = r.get("stepwise", {}), r.get("floor", {}), r.get("queries", {}), r.get("start", {})
        if not sw:
            continue
        row(b, "start latency (ms)", st.get("latency_ms"))
        row(b, "  of which API round trip (ms)", st.get("api_ms"))
        row(b, "floor start latency (ms)", fl.get("start_latency_ms"))
        row(b, "idle step-to-step latency (ms)", st.get("step_latency_ms"))
        row(b, "  idle: finished -> next queued (ms)", st.get("finished_to_queued_ms"))
        row(b, "  idle: queued -> started (ms)", st.get("queued_to_started_ms"))
        row(b, "floor idle step-to-step (ms)", fl.get("idle_latency_ms"))
        row(b, "loaded step-to-step latency (ms)", sw.get("latency_ms"))
        if r.get("live"):
            row(b, "commit-to-screen latency (ms)", r["live"].get("latency_ms"))
        row(b, "floor loaded step-to-step (ms)", fl.get("latency_ms"))
        scale_rows(b, r, row, lines)
        for label, a, f in (("idle", st.get("step_latency_ms"), fl.get("idle_latency_ms")),
                            ("loaded", sw.get("latency_ms"), fl.get("latency_ms"))):
            value = ratio((a or {}).get("p50"), (f or {}).get("p50"))
            lines.append(f"{b:<10}{label + ' p50 latency stepwise/floor':<36}{_fmt(value):>9}")
        sps, fps = sw.get("steps_per_s"), fl.get("steps_per_s")
        lines.append(f"{b:<10}throughput steps/s  stepwise={_fmt(sps)} floor={_fmt(fps)} "
                     f"ratio={_fmt(ratio(sps, fps))}")
        config = r.get("config", {})
        if config.get("net_delay_ms") is not None and sps:
            processes = config.get("concurrency") or 1
            lines.append(f"{b:<10}network +{_fmt(config['net_delay_ms'])} ms a round trip: "
                         f"{_fmt(sps / processes)} steps/s per worker process ({processes})")
        rounds = r.get("throughput_rounds") or []
        if len(rounds) > 1:
            ratios = [x["ratio"] for x in rounds if x["ratio"] is not None]
            each = ", ".join(f"{_fmt(x['stepwise'])}/{_fmt(x['floor'])}={_fmt(x['ratio'])}" for x in rounds)
            lines.append(f"{b:<10}throughput rounds  {each}; median ratio="
                         f"{_fmt(statistics.median(ratios) if ratios else None)}")
        if any("reference" in x for x in rounds):
            # The same rounds' floor, Stepwise on the reference store (Django's ORM API only).
            ratios = [x["reference_ratio"] for x in rounds if x.get("reference_ratio") is not None]
            each = ", ".join(f"{_fmt(x.get('reference'))}/{_fmt(x['floor'])}={_fmt(x.get('reference_ratio'))}"
                             for x in rounds)
            lines.append(f"{b:<10}reference store rounds  {each}; median ratio="
                         f"{_fmt(statistics.median(ratios) if ratios else None)}")
        lines.append(f"{b:<10}wall time (s)  stepwise={_fmt(sw.get('wall_s'))} "
                     f"floor={_fmt(fl.get('wall_s'))}  ({sw.get('steps_done', 0)}/"
                     f"{sw.get('steps_expected', 0)} and {fl.get('steps_done', 0)}/"
                     f"{fl.get('steps_expected', 0)} steps done)")
        if q:
            per = q["per_step"]
            lines.append(f"{b:<10}SQL statements per step  claim={_fmt(per['claim'])} "
                         f"execute={_fmt(per.get('execute'))} "
                         f"succeed+advance={_fmt(per['succeed'])} total={_fmt(per['total'])} "
                         f"in {_fmt(per['transactions'])} transactions")
            lines.append(f"{b:<10}SQL statements per run_start()  {q['run_start']}; "
                         f"for the last step (completes the run)  {q['last_step']}")
            if q.get("api_start"):
                lines.append(f"{b:<10}SQL statements per POST .../runs/  "
                             f"{q['api_start']['statements']} (HTTP {q['api_start']['status']})")
        if sw.get("db_connections_per_step") is not None:
            lines.append(f"{b:<10}new DB connections per step  {sw['db_connections_per_step']} "
                         f"({sw['db_connections_opened']} opened during the loaded run)")
        row(b, "in-process service time per step (ms)", r.get("service_ms"))
        row(b, "  the same, steps carried (ms)", r.get("carried_service_ms"))
        if att := r.get("attestation"):
            lines.append(attestation_line(b, att))
        if calls := r.get("python_calls"):
            lines.append(f"{b:<10}Python calls per carried step  {calls['calls_per_step']} "
                         f"({calls['steps']} steps, run starts included)")
        if trips := r.get("round_trips"):
            lines.append(f"{b:<10}DB round trips per carried step  {trips['round_trips_per_step']} "
                         f"({trips['steps']} steps, run starts included)")
        row(b, "open a DB connection + SELECT 1 (ms)", r.get("db_connect_ms"))
        if large := r.get("large_values"):
            for mode in ("in_row", "artifacts"):
                m = large[mode]
                lines.append(f"{b:<10}{large['steps']} x {large['value_kb']} KB outputs, {mode:<9}  "
                             f"database {m['database_kb_per_run']} KB/run, artifacts "
                             f"{m['artifact_kb_per_run']} KB/run, p50 {_fmt(m['ms_per_step']['p50'])} "
                             f"ms/step")
        for incident in r.get("incidents", []):
            lines.append(f"{b:<10}INCIDENT: {incident}")
        load = (r.get("config", {}).get("loadavg_start"), r.get("loadavg_end"))
        lines.append(f"{b:<10}load average (1/5/15 min)  at start={load[0]} at end={load[1]} "
                     f"on {r.get('config', {}).get('cpus')} CPUs")
        rss = r.get("rss_mb", {})
        lines.append(f"{b:<10}worker peak RSS (MB)  stepwise={_rss(rss.get('stepwise'))}; "
                     f"floor={_rss(rss.get('floor'))}")
    return "\n".join(lines)


# The API phases of `bench.measure.scale_phases`, in the order they run.
API_PHASES = ("api_load", "api_paced", "api_executing", "api_poisson")


def scale_rows(b: str, r: dict, row, lines: list[str]) -> None:
    """The rows of the scale phases (bench.scale), where they ran."""
    if r.get("api_load"):
        api = r["api_load"]
        row(b, f"API POST, {api['clients']} clients (ms)", api["latency_ms"])
        web = r.get("config", {}).get("web_processes", 1)
        lines.append(f"{b:<10}API load  {api['requests_per_s']} requests/s, statuses {api['statuses']}, "
                     f"{web} web process{'es' if web != 1 else ''}")
    if r.get("api_paced"):
        api = r["api_paced"]
        row(b, f"API POST paced at {_fmt(api['offered_per_s'])}/s (ms)", api["latency_ms"])
        lines.append(f"{b:<10}API paced  {api['requests_per_s']} requests/s, statuses {api['statuses']}")
    if r.get("api_executing"):
        api = r["api_executing"]
        row(b, f"API POST of executing runs, {api['clients']} clients (ms)", api["latency_ms"])
        lines.append(f"{b:<10}API executing  {api['requests_per_s']} requests/s, statuses "
                     f"{api['statuses']}, runs drained {_fmt(api['drained_s'])} s after")
    if r.get("api_poisson"):
        api = r["api_poisson"]
        row(b, f"API POST, Poisson at {_fmt(api['offered_per_s'])}/s, runs executing (ms)",
            api["latency_ms"])
        lines.append(f"{b:<10}API Poisson  {api['requests_per_s']} requests/s, statuses "
                     f"{api['statuses']}, runs drained {_fmt(api['drained_s'])} s after")
    if r.get("api_web_rss_mb"):
        rss, posts = r["api_web_rss_mb"], sum(r[k]["requests"] for k in API_PHASES if r.get(k))
        lines.append(f"{b:<10}API web process peak RSS  {rss['max_mb']:.0f} MB (largest of "
                     f"{rss['processes']}) after {posts} POSTs")
    if r.get("fanout"):
        fan = r["fanout"]
        row(b, f"single step's wait, {fan['items']}-item fan-out (ms)", fan["probe_wait_ms"])
        lines.append(f"{b:<10}fan-out  {fan['items']} items in {_fmt(fan['fanout_s'])} s "
                     f"({_fmt(fan['fanout_items_per_s'])} items/s), {fan['probes_during_fanout']} "
                     f"probes queued during it")
    if r.get("held"):
        held = r["held"]
        idle = (r.get("start") or {}).get("step_latency_ms") or {}
        during = (held.get("idle_while_held") or {}).get("step_latency_ms") or {}
        row(b, f"idle step-to-step, {held['held']} held (ms)", during)
        lines.append(f"{b:<10}held  {held['started']} started in {held['start_s']} s "
                     f"({held['start_runs_per_s']} runs/s), all gates open at {held['all_gates_open_s']} s; "
                     f"{held['database_bytes_per_run']} DB bytes per run; step gap p50 "
                     f"while held / idle = {_fmt(ratio(during.get('p50'), idle.get('p50')))}")
        memory = held.get("memory_while_held", {})
        lines.append(f"{b:<10}held memory (MB)  api={_rss(memory.get('api'))}; "
                     f"worker={_rss(memory.get('worker'))}; measuring process peak "
                     f"{(memory.get('measure') or {}).get('peak_mb')}")
        lines.append(f"{b:<10}released  {held['granted']} granted in {held['grant_s']} s "
                     f"({held['grants_per_s']}/s); {held['ended']} ended, drain "
                     f"{_fmt(held['drain_runs_per_s'])} runs/s over {_fmt(held['drain_s'])} s"
                     + (f"; grant failures {held['grant_failures']}" if held["grant_failures"] else ""))
    if r.get("sleeping"):
        nap = r["sleeping"]
        waiting_rows(b, r, nap, row, lines, count=nap["asleep"], word="asleep",
                     during="idle_while_asleep", memory="memory_while_asleep",
                     processes=("api", "worker", "beat"))
        row(b, "wake-up lag: sleep step done (ms)", nap["wake_lag_ms"])
        row(b, "wake-up lag: next step started (ms)", nap["next_step_lag_ms"])
        quarters = "; ".join(f"{_fmt(q['p50'])} / {_fmt(q['p99'])}"
                             for q in nap.get("wake_lag_ms_by_quarter", []))
        lines.append(f"{b:<10}wake-up lag p50 / p99 (ms) by quarter of the window  {quarters}")
        lines.append(f"{b:<10}woken  {nap['woken']} of {nap['started']} ({nap['woken_before_measured']} "
                     f"before the measurement) at {_fmt(nap['wakes_per_s'])}/s, offered "
                     f"{nap['offered_wakes_per_s']}/s over {nap['window_s']:.0f} s; reaper every "
                     f"{nap['reap_interval_s']} s, {nap['reap_batch']} a sweep; {nap['ended']} ended")
    if r.get("evaluation"):
        evaluation_rows(b, r, row, lines)
    if r.get("signalled"):
        sig = r["signalled"]
        waiting_rows(b, r, sig, row, lines, count=sig["waiting"], word="waiting",
                     during="idle_while_waiting", memory="memory_while_waiting",
                     processes=("api", "worker"))
        row(b, "signal_send (ms)", sig["signal_send_ms"])
        row(b, "signal to next step started (ms)", sig["signal_to_next_step_ms"])
        lines.append(f"{b:<10}signalled  {sig['sent']} at {_fmt(sig['signals_per_s'])}/s, offered "
                     f"{sig['offered_signals_per_s']}/s; {sig['ended']} ended"
                     + (f"; send failures {sig['send_failures']}" if sig["send_failures"] else ""))


def evaluation_rows(b: str, r: dict, row, lines: list[str]) -> None:
    """The rows of the evaluation phase: the live runs' figures during it beside the idle
    phase's, then how the evaluation ended."""
    ev = r["evaluation"]
    live = ev.get("live") or {}
    idle = r.get("start") or {}
    control = ev.get("control") or {}
    row(b, "idle step-to-step (ms)", idle.get("step_latency_ms"))
    row(b, "  live, beside the evaluation (ms)", live.get("step_latency_ms"))
    row(b, f"  control, {ev.get('control_s'):g} s before it (ms)", control.get("step_latency_ms"))
    row(b, "idle start latency (ms)", idle.get("latency_ms"))
    row(b, "  live, beside the evaluation (ms)", live.get("latency_ms"))
    row(b, "  idle: the first step's wait (ms)", idle.get("first_step_wait_ms"))
    row(b, "  live: the first step's wait (ms)", live.get("first_step_wait_ms"))
    for label, versus in (("idle", ev.get("live_vs_idle") or {}), ("control", ev.get("live_vs_control") or {})):
        lines.append(f"{b:<10}live / {label:<8} step gap p50 {_fmt(versus.get('step_latency_ms', {}).get('p50'))} x, "
                     f"p99 {_fmt(versus.get('step_latency_ms', {}).get('p99'))} x; start latency p50 "
                     f"{_fmt(versus.get('latency_ms', {}).get('p50'))} x, p99 "
                     f"{_fmt(versus.get('latency_ms', {}).get('p99'))} x; first step's wait p50 "
                     f"{_fmt(versus.get('first_step_wait_ms', {}).get('p50'))} x")
    lines.append(f"{b:<10}live runs  {live.get('runs')} over {_fmt(ev.get('live_s'))} s beside the evaluation, "
                 f"{control.get('runs')} in the control")
    workers = (f"a worker of {ev['evaluation_workers']} on the evaluation queues" if ev.get("evaluation_workers")
               else "the same worker as the live runs")
    lines.append(f"{b:<10}evaluation  {ev['state']} after {ev['runs']} of {ev['cases']} cases run "
                 f"({ev['concurrency']} at a time, on {workers}) in {_fmt(ev['duration_s'])} s, "
                 f"{_fmt(ev['case_runs_per_s'])} cases/s; runs {ev['run_states']}")
    lines.append(f"{b:<10}evaluation cost  {ev['spent_usd']} USD spent (recorded {ev['cost_usd']}) against "
                 f"a budget of {ev['budget_usd']} ({ev['cost_per_run_usd']} a run): overshoot {ev['overshoot_usd']} USD "
                 f"({_fmt(ev['overshoot_runs'])} runs); {ev['sandboxed_effects']} effects sandboxed, "
                 f"{ev['emails_reaching_the_outbox']} reached the outbox")


def waiting_rows(b: str, r: dict, phase: dict, row, lines: list[str], *, count: int, word: str,
                 during: str, memory: str, processes: tuple) -> None:
    """The rows every phase of runs waiting at once has: the other runs' step gap while they
    wait, what starting them took and cost the database, the processes' memory."""
    idle = (r.get("start") or {}).get("step_latency_ms") or {}
    gap = (phase.get(during) or {}).get("step_latency_ms") or {}
    row(b, f"idle step-to-step, {count} {word} (ms)", gap)
    lines.append(f"{b:<10}{word}  {phase['started']} started in {phase['start_s']} s "
                 f"({phase['start_runs_per_s']} runs/s); {phase['database_bytes_per_run']} DB "
                 f"bytes per run; step gap p50 while {word} / idle = "
                 f"{_fmt(ratio(gap.get('p50'), idle.get('p50')))}")
    rss = phase.get(memory, {})
    lines.append(f"{b:<10}{word} memory (MB)  "
                 + "; ".join(f"{name}={_rss(rss.get(name))}" for name in processes))


def _rss(info: dict | None) -> str:
    if not info:
        return "-"
    return (f"{info['total_mb']:.0f} total over {info['processes']} processes "
            f"(largest {info['max_mb']:.0f})")


def attestation_line(backend: str, att: dict) -> str:
    """The attestation's cost per step (bench/attestation.py), against the carried service time."""
    return (f"{backend:<10}attestation per step  sign p50={_fmt(att['sign_us']['p50'])} us, "
            f"checks of upstream outputs p50={_fmt(att['checks_of_upstream_us']['p50'])} us "
            f"(+{_fmt(att['verify_us']['p50'])} us the first time a process reads a record "
            f"another signed); "
            f"{_fmt(att['per_step_us'])} us of a {_fmt(att['service_ms']['p50'])} ms carried step "
            f"= {_fmt(att['share'] * 100)} %")
