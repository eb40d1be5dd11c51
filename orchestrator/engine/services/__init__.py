"""Services: the transactions that change state. One service per state change.

Every entry point (REST view, admin action, Celery task, websocket consumer, beat) calls these;
the rules, the permission checks, the events and the audit rows exist once, here.

- workflows: saving definitions as immutable versions
- runs: starting, timing out and cancelling runs
- scheduling: applying the scheduler's plan to a run, ending it (called inside other services)
- step_end: what happens after any step ends (release what it owned, move the run on)
- kinds/: one module per step kind, owning its start, finish, timeout and release:
  agent, tool and router (on what every worker kind shares: worker), human_gate, sub_workflow,
  map_step, loop, sleep, human_input, wait
- signals: a signal sent to a run, which completes the wait step that waits for it, or is kept
  until one does
- operators: an operator's redrive, retry, skip and resume
- deadletters: recording work that failed for good
- effects: the idempotency ledger every side effect goes through
- compensation: sagas, undoing a failed run's effects
- reaper: the background sweep for timeouts, due retries, lost messages and stuck runs

Importing this package registers every step kind with `kinds` (each kind module registers
itself), so the scheduler and the reaper find them without importing them.
"""
from .kinds import (  # noqa: F401  (registers the kinds)
    agent,
    human_gate,
    human_input,
    loop,
    map_step,
    router,
    sleep,
    sub_workflow,
    tool,
    wait,
    worker,
)
