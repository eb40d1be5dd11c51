"""An evaluation beside interactive runs under one provider quota (`--quota-steps N`).

A local OpenAI-compatible server in this process stands in for the provider: it answers each
chat completion after `--model-latency-ms`, and meters what a provider would (the most requests
in flight at once, the tokens of each calendar minute). Every call goes to one model entry,
`bench_quota`, under `STEPWISE_QUOTAS` (`--quota-concurrent` calls in flight), shared by the
capacity classes at their default shares (interactive 0.6, evaluation 0.2).

1. idle: runs of a one-step workflow calling the model, started one at a time through the API
   on the `interactive` class (measure.idle_runs): start latency (POST to the first step
   started) and the first step's wait, queued to started — the quota's wait included;
2. the evaluation: runs of a 20-step chain of model steps on the `evaluation` class, N steps
   in all, created at once; meanwhile the same interactive runs go on, until the evaluation
   ends or its time is up. Their figures are set beside the idle ones, with the evaluation's
   progress and what the server metered.

The agent steps run on workers of their own, started for the phase with the model and quota in
their environment: two processes on `agent.bench_quota` (interactive) and two on
`agent.bench_quota.evaluation`, as a deployment gives each class its workers.
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .stats import ratio, say

MODEL = "bench_quota"
CHAIN = 20  # model steps per evaluation run
TOKENS_IN, TOKENS_OUT = 60, 20


class ModelServer:
    """A local OpenAI-compatible chat completions endpoint that meters its callers."""

    def __init__(self, latency_s: float):
        self.latency_s = latency_s
        self.in_flight = self.most_in_flight = self.requests = 0
        self.tokens_by_minute: dict[int, int] = {}
        self._lock = threading.Lock()
        meter = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with meter._lock:
                    meter.requests += 1
                    meter.in_flight += 1
                    meter.most_in_flight = max(meter.most_in_flight, meter.in_flight)
                time.sleep(meter.latency_s)
                body = json.dumps({
                    "id": "chatcmpl-bench", "object": "chat.completion", "model": "bench",
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": '{"ok": true}'}}],
                    "usage": {"prompt_tokens": TOKENS_IN, "completion_tokens": TOKENS_OUT,
                              "total_tokens": TOKENS_IN + TOKENS_OUT}}).encode()
                with meter._lock:
                    meter.in_flight -= 1
                    minute = int(time.time() // 60)
                    meter.tokens_by_minute[minute] = (meter.tokens_by_minute.get(minute, 0)
                                                      + TOKENS_IN + TOKENS_OUT)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def quota_phase(args, *, base_url: str, token: str, env: dict, var_dir, deadline: float,
                check) -> dict:
    """Measure interactive runs idle and beside an evaluation of `args.quota_steps` model steps,
    every call under one quota. Returns the phase's figures."""
    from django.conf import settings
    from django.db import transaction

    from orchestrator.engine.authz import System
    from orchestrator.engine.services.runs import run_start
    from orchestrator.engine.services.workflows import workflow_publish, workflow_save
    from orchestrator.models import Event, Run, StepRun, Team

    from .measure import RUN_ENDED, idle_runs
    from .procs import celery_worker

    model_server = ModelServer(args.model_latency_ms / 1000)
    entry = {"provider": "openai", "base_url": model_server.url, "model_id": "bench",
             "api_key_env": "STEPWISE_BENCH_LLM_KEY", "timeout_s": 30}
    quotas = {f"model:{MODEL}": {"concurrent": args.quota_concurrent,
                                 "tokens_per_minute": args.quota_tokens_per_minute}}
    settings.STEPWISE_MODELS = {**settings.STEPWISE_MODELS, MODEL: entry}
    settings.STEPWISE_QUOTAS = quotas
    worker_env = dict(env, STEPWISE_MODELS=json.dumps(settings.STEPWISE_MODELS),
                      STEPWISE_QUOTAS=json.dumps(quotas), STEPWISE_BENCH_LLM_KEY="bench",
                      # The local model server listens on loopback: allowed explicitly, as an operator would.
                      STEPWISE_EGRESS=json.dumps({"default": {"allow_networks": ["127.0.0.0/8"],
                                                              "ports": "*"}}))
    team = Team.objects.get(slug="bench")
    owner = System("bench")
    step = {"type": "agent", "model": MODEL, "prompt": "Say ok", "max_tokens": 40,
            "output_schema": {"type": "object"}}
    live, _ = workflow_save(team=team, definition={
        "name": "bench-quota-live", "input_schema": {"type": "object"},
        "steps": [{"name": "ask", **step}]}, actor=owner)
    workflow_publish(workflow_id=live.workflow_id, number=live.number, actor=owner)
    evaluation, _ = workflow_save(team=team, definition={
        "name": "bench-quota-eval", "input_schema": {"type": "object"}, "capacity": "evaluation",
        "steps": [{"name": f"s{i}", **step, **({"after": [f"s{i - 1}"]} if i else {})}
                  for i in range(CHAIN)]}, actor=owner)

    say(f"quota: workers for model {MODEL} ({args.quota_concurrent} calls in flight at most)")
    live_workers = celery_worker("quota-live", "orchestrator", concurrency=2, env=worker_env,
                                 var_dir=var_dir, deadline=deadline, queues=f"agent.{MODEL}")
    evaluators = celery_worker("quota-eval", "orchestrator", concurrency=2, env=worker_env,
                               var_dir=var_dir, deadline=deadline,
                               queues=f"agent.{MODEL}.evaluation,orchestrator.evaluation")

    def checked() -> None:
        check()
        live_workers.check()
        evaluators.check()

    try:
        say(f"quota: idle, {args.start_runs} interactive runs one at a time")
        idle = idle_runs(base_url, token, "bench-quota-live", runs=args.start_runs, steps=1,
                         warmup=3, deadline=deadline, check=checked)
        runs = -(-args.quota_steps // CHAIN)
        say(f"quota: an evaluation of {runs} runs x {CHAIN} model steps beside interactive runs")
        t0 = time.time()
        with transaction.atomic():
            ids = [run_start(version=evaluation, input={}, actor=owner).id for _ in range(runs)]
        created = time.time() - t0
        # The interactive run in flight when the window closes must still end before the deadline.
        until = min(deadline - 30, time.time() + args.quota_window_s)
        evaluation_steps = StepRun.objects.filter(run_id__in=ids)

        def evaluation_over() -> bool:
            return (time.time() > until
                    or not Run.objects.filter(id__in=ids).exclude(state__in=RUN_ENDED).exists())

        beside = idle_runs(base_url, token, "bench-quota-live", runs=100_000, steps=1,
                           warmup=0, deadline=deadline, check=checked, stop=evaluation_over)
        while not evaluation_over():
            time.sleep(0.5)
        elapsed = time.time() - t0
        done = evaluation_steps.filter(state="completed").count()
        deferred = Event.objects.filter(run_id__in=ids, kind="step.deferred").count()
    finally:
        live_workers.stop()
        evaluators.stop()
        model_server.close()
    return {
        "quota": quotas, "model_latency_ms": args.model_latency_ms,
        "idle": {key: idle[key] for key in ("latency_ms", "first_step_wait_ms", "runs")},
        "beside": {key: beside[key] for key in ("latency_ms", "first_step_wait_ms", "runs")},
        "start_p50_x_idle": ratio(beside["latency_ms"].get("p50"), idle["latency_ms"].get("p50")),
        "wait_p50_x_idle": ratio(beside["first_step_wait_ms"].get("p50"),
                                 idle["first_step_wait_ms"].get("p50")),
        "evaluation": {"runs": runs, "steps": runs * CHAIN, "steps_completed": done,
                       "created_s": round(created, 2), "elapsed_s": round(elapsed, 1),
                       "steps_per_s": round(done / elapsed, 1) if elapsed else None,
                       "steps_deferred_events": deferred},
        "server": {"requests": model_server.requests, "most_in_flight": model_server.most_in_flight,
                   "most_tokens_in_a_minute": max(model_server.tokens_by_minute.values(),
                                                  default=0)},
    }
