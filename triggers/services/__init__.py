"""The transactions of triggers: one module per concern.

- `config`    creating and changing triggers, their beat schedules and webhook secrets;
- `firing`    the one path every trigger takes to start a run: dedupe by key, filter, map,
              validate, admit (rate, the team's cap) and `run_start`; and admitting held firings;
- `schedules` a beat tick: which slots run, missed-slot policy;
- `webhooks`  a signed HTTP delivery;
- `events`    a queue event, its dead letter and the replay of one.

Each checks permissions itself (`orchestrator.engine.authz`) and writes its audit entries in its own
transaction; entry points (API, admin, tasks, the consumer) only call them.
"""
