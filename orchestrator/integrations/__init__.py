"""Calls to the world: model providers (`providers/`), the tool registry and the built-in tools
(`tools/`), the connections tools reach systems through (`connections`), and the egress policy
and HTTP client every outbound call goes through (`egress/`).

The engine's executors and the notifications' delivery call it. It may import the engine's
workflow format and pure helpers (`definitions`, `risk`, `retry`, `hashing`, `clock`); never a
model, the store, a service, an executor, `operations/` or `web/`: what it needs of a run
comes in as arguments.
"""
