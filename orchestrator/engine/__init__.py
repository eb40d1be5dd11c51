"""The engine: what runs workflows.

It owns the workflow format (`definitions/`), the pure plan (`scheduler`, `risk`), the services
that change a run's state (`services/`, a module per state change and per step kind in
`services/kinds/`), the executors that run one step outside any transaction (`executors/`),
the outbox (`events`) and the messages sent after commit (`dispatch`), leases, rate limits,
retries, the shared reads (`selectors`, `authz`'s permission rules) and the vocabulary every
layer uses (`states`, `errors`, `clock`, `hashing`, `keys`, `text`, ...).

It may import `orchestrator.models`, `orchestrator.store`, `integrations/` (executors call tools
and model providers), `operations/` (to log, trace and count) and the ledgers of the other apps;
never `web/` or the app root's entry points: a service sends a task by its name. Inside it the
layers of pyproject.toml's contract hold: executors import no service; the plan imports no
model, clock or read of the database.
"""
