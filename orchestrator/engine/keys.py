"""Identities that several layers must agree on: idempotency keys and worker ids.

The effect ledger, the tools, the step services and the audit ledger all name an action or a
worker the same way, so these live here, low in the import graph. Pure apart from the host
name and process id.
"""
import os
import socket


def idempotency_key_for(run_id: object, step_name: str, action: str = "default") -> str:
    """Stable across attempts and redeliveries: (run, step, logical action), never random."""
    return f"{run_id}:{step_name}:{action}"


def worker_id() -> str:
    """This worker process, the holder of its leases (prefork children share the parent's
    import, so ask at call time)."""
    return f"{socket.gethostname()}:{os.getpid()}"
