"""Live pages: the websocket consumers and the outbox relay that nudges them (docs/live.md).

An entry point like the API: consumers check who may watch through `authz`, and the relay only
reads the outbox (`Event` rows) and sends nudges; neither changes state.
"""
