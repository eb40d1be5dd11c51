"""Services: the transactions that change state. One service per state change.

Every entry point (REST view, admin action, Celery task, webhook, beat) calls these; the
rules, the events and the audit rows exist once, here.

- workflows: saving definitions as immutable versions
- runs: starting and cancelling runs, finishing them
- advance: applying the scheduler's plan to a run (called inside the other services)
- steps: claiming, completing, failing and retrying steps
- fanout: map steps (Celery chord) and sub-workflows
- reaper: the background sweep for timeouts, due retries, lost messages and stuck runs
"""
