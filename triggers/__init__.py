"""Triggers: what starts runs when no person presses a button.

Four kinds, one path: a schedule fired by Celery beat, a signed webhook, a message-queue event
(RabbitMQ or a Redis stream, read by the `stepwise_consume` process) and a programmatic call
through the API all end in `triggers.services.firing.trigger_fire`, which admits the firing
(rate per trigger, the team's cap on unfinished runs — budgets', as on every start path) and starts the run through the same
`orchestrator.engine.services.runs.run_start` as the REST API. See docs/triggers.md.
"""
