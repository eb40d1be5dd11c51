"""A history of finished runs written straight into PostgreSQL (INSERT ... SELECT generate_series):
runs with their steps, events, approvals, input tasks, dead letters, alerts and ledger rows, in
minutes rather than by running them. The rows are well-formed for the lists and pages that read
them; the ledger rows are raw rows for sizing and do not verify.

Used by the scale-history bench phase (bench/scale_history.py) and by the query-plan tests
(tests/perf/test_query_plans.py), which seed a smaller history the same way.
"""
from dataclasses import dataclass

TRIGGER = "history"  # the seeded runs' trigger, so a second seeding adds to them


@dataclass(frozen=True)
class Shape:
    runs: int
    steps_per_run: int = 3
    events_per_run: int = 6
    entries_per_run: int = 4
    # Of every `waiting_every` runs, five passed a gate and five a form; one of each still waits.
    waiting_every: int = 100
    dead_letter_every: int = 200  # one in ten of them still open
    alert_every: int = 1000
    seconds_between: float = 2.0  # created_at spacing, newest last (the scale bench's: a year)


def seed(cursor, shape: Shape, *, team_id: int, version_id: int, user_id: int,
         newer: int = 0) -> None:
    """Insert `shape.runs` runs of the team's version and what hangs off them, the newest
    created `newer` runs' spacing before now (a history seeded in batches, oldest first)."""
    n, every = shape.runs, shape.waiting_every
    params = {"n": n + newer, "team": team_id, "version": version_id, "user": user_id,
              "gap": shape.seconds_between, "every": every, "rows": n}
    cursor.execute("DROP TABLE IF EXISTS seeded")
    cursor.execute("""
        CREATE TEMP TABLE seeded ON COMMIT DROP AS
        SELECT gen_random_uuid() AS id, g,
               now() - make_interval(secs => (%(n)s - g) * %(gap)s) AS at,
               CASE WHEN g %% %(every)s = 0 THEN 'waiting'
                    WHEN g %% %(every)s = 1 THEN 'waiting'
                    WHEN g %% 50 = 7 THEN 'failed' ELSE 'completed' END AS state
        FROM generate_series(1, %(rows)s) AS g""", params)
    cursor.execute("""
        INSERT INTO orchestrator_run (id, state, input, trigger, request_digest, created_at,
            started_at, finished_at, progressed_at, cost_usd, tokens_in, tokens_out, team_id,
            version_id, created_by_id, provenance, capacity, concurrency_key, fork_step,
            fork_edits)
        SELECT id, state, jsonb_build_object('ticket_id', 'T-' || g), %(trigger)s, '', at, at,
               CASE WHEN state = 'waiting' THEN NULL ELSE at + interval '3 seconds' END, at,
               0.004, 300, 120, %(team)s, %(version)s, %(user)s, '{}'::jsonb, 'interactive', '',
               '', '{}'::jsonb
        FROM seeded""", {**params, "trigger": TRIGGER})
    cursor.execute("""
        INSERT INTO orchestrator_steprun (name, kind, position, state, queue, attempts, input,
            output, skip_reason, lease_owner, started_at, finished_at, cost_usd, tokens_in,
            tokens_out, run_id, correlation_key, waiting_for, concurrency_key)
        SELECT CASE WHEN p = %(steps)s AND s.g %% %(every)s IN (0, 2, 4, 6, 8) THEN 'approve'
                    WHEN p = %(steps)s AND s.g %% %(every)s IN (1, 3, 5, 7, 9) THEN 'ask'
                    ELSE 'step_' || p END,
               CASE WHEN p = %(steps)s AND s.g %% %(every)s IN (0, 2, 4, 6, 8) THEN 'human_gate'
                    WHEN p = %(steps)s AND s.g %% %(every)s IN (1, 3, 5, 7, 9) THEN 'human_input'
                    ELSE 'agent' END,
               p, CASE WHEN p = %(steps)s AND s.state = 'waiting' THEN 'waiting'
                       WHEN s.state = 'failed' AND p = %(steps)s THEN 'failed'
                       ELSE 'completed' END,
               'default', 1, '{}'::jsonb, '{"ok": true}'::jsonb, '', '', s.at, s.at, 0.001, 100,
               40, s.id, '', '', ''
        FROM seeded s CROSS JOIN generate_series(1, %(steps)s) AS p""",
                   {**params, "steps": shape.steps_per_run})
    cursor.execute("""
        INSERT INTO orchestrator_stepattempt (number, worker, started_at, finished_at, outcome,
            error_class, error_message, tokens_in, tokens_out, cost_usd, idempotency_key, model,
            provider, step_id, model_id, model_params, prompt_hash, proposal_hash, repair_count,
            risk_tier, schema_hash, routes)
        SELECT 1, 'history', st.started_at, st.finished_at, 'succeeded', '', '', 100, 40, 0.001,
               '', 'gpt-4o-mini', 'openai', st.id, 'gpt-4o-mini', '{}'::jsonb, '', '', 0, '', '',
               '[]'::jsonb
        FROM orchestrator_steprun st JOIN seeded s ON st.run_id = s.id
        WHERE st.kind = 'agent'""")
    cursor.execute("""
        INSERT INTO orchestrator_event (kind, actor, payload, created_at, run_id)
        SELECT CASE WHEN e = 1 THEN 'run.started' ELSE 'step.completed' END, 'system',
               '{}'::jsonb, s.at + make_interval(secs => e * 0.1), s.id
        FROM seeded s CROSS JOIN generate_series(1, %(events)s) AS e""",
                   {"events": shape.events_per_run})
    cursor.execute("""
        INSERT INTO approvals_approvalrequest (state, approvers, instructions, context,
            proposal_hash, requested_at, deadline_at, note, run_id, step_id, action, action_kind,
            action_source, approvals_required, editable, edits, escalation_level, explanation,
            guarded_steps, risk_reasons, risk_tier, self_approval_up_to)
        SELECT CASE WHEN s.state = 'waiting' THEN 'pending' ELSE 'approved' END, 'support_leads',
               'Check it.', '{}'::jsonb, md5(st.id::text), s.at,
               s.at + interval '7 days', '', s.id, st.id, '{}'::jsonb, '', '', 1, '[]'::jsonb,
               '[]'::jsonb, 0, '{}'::jsonb, '[]'::jsonb, '[]'::jsonb, 'low', ''
        FROM seeded s JOIN orchestrator_steprun st ON st.run_id = s.id AND st.name = 'approve'
        """)
    cursor.execute("""
        INSERT INTO approvals_inputtask (state, "group", assignee, escalation_level,
            instructions, evidence, form, allow_abstain, separation_of_duties, requested_at,
            deadline_at, note, run_id, step_id, version_id)
        SELECT CASE WHEN s.state = 'waiting' THEN 'open' ELSE 'answered' END, 'support_leads', '',
               0, 'Answer it.', '{}'::jsonb, '{}'::jsonb, false,
               false, s.at, s.at + interval '7 days', '', s.id, st.id, %(version)s
        FROM seeded s JOIN orchestrator_steprun st ON st.run_id = s.id AND st.name = 'ask'
        """, params)
    cursor.execute("""
        INSERT INTO orchestrator_deadletter (error_class, error_message, attempts, payload_ref,
            trace_id, status, created_at, run_id, step_id)
        SELECT 'provider_error', 'gave up after 5 attempts', 5, '', '',
               CASE WHEN s.g %% (%(every)s * 10) = 3 THEN 'open' ELSE 'redriven' END, s.at, s.id,
               st.id
        FROM seeded s JOIN orchestrator_steprun st ON st.run_id = s.id AND st.position = 1
        WHERE s.g %% %(every)s = 3""", {"every": shape.dead_letter_every})
    cursor.execute("""
        INSERT INTO alerts_alert (key, rule, severity, subject, body, state, created_at, run_id,
            team_id)
        SELECT 'history:' || s.id, 'run_failed', 'warning', 'run failed', '', 'resolved', s.at,
               s.id, %(team)s
        FROM seeded s WHERE s.g %% %(every)s = 7""", {**params, "every": shape.alert_every})
    cursor.execute("""
        INSERT INTO audit_entry (created_at, actor, actor_kind, action, subject_type, subject_id,
            team, workflow, definition_digest, run_id, step_name, proposal_hash, model,
            prompt_version, idempotency_key, correlation_id, outcome, payload, payload_ref,
            digest, shard)
        SELECT s.at, 'system', 'system', 'step.completed', 'run', s.id::text, 'support', 'support',
               '', s.id, 'step_' || k, '', '', '', '', '', 'ok', '{}', '', md5(s.id::text || k), 0
        FROM seeded s CROSS JOIN generate_series(1, %(entries)s) AS k""",
                   {"entries": shape.entries_per_run})
    for table in ("orchestrator_run", "orchestrator_steprun", "orchestrator_stepattempt",
                  "orchestrator_event",
                  "approvals_approvalrequest", "approvals_inputtask", "orchestrator_deadletter",
                  "alerts_alert", "audit_entry"):
        cursor.execute(f"ANALYZE {table}")
