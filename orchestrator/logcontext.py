"""The ids every log line carries: run, step, attempt, workflow, team and trace.

A context variable holds them for the current request, task or thread; `orchestrator.logs`
puts them on each record. Entry points bind them (the request middleware, the Celery task
signals, the worker once it claimed a step); nothing else needs to pass them around. Pure: no
Stepwise import, no I/O.
"""
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token

FIELDS = ("run_id", "step", "attempt", "workflow", "team", "trace_id")

_ids: ContextVar[dict | None] = ContextVar("stepwise_log_ids", default=None)


def current() -> dict:
    """The ids bound now (only those that are set)."""
    return _ids.get() or {}


def bind(**ids) -> Token:
    """Add ids (None leaves one as it was) for the rest of this context; returns the token
    `reset` takes to go back."""
    unknown = set(ids) - set(FIELDS)
    if unknown:
        raise ValueError(f"not a log id: {', '.join(sorted(unknown))}")
    merged = {**current(), **{k: str(v) for k, v in ids.items() if v is not None and v != ""}}
    return _ids.set(merged)


def reset(token: Token) -> None:
    _ids.reset(token)


def clear() -> None:
    """Forget every id (a worker between two tasks)."""
    _ids.set({})


@contextmanager
def describing(**ids) -> Iterator[None]:
    """Exactly these ids (None: not set) for what is logged inside, the trace id kept: a line
    about another object than the one the context names (an event of another run or step)."""
    token = _ids.set({**({"trace_id": current()["trace_id"]} if "trace_id" in current() else {}),
                      **{k: str(v) for k, v in ids.items() if v is not None and v != ""}})
    try:
        yield
    finally:
        reset(token)


@contextmanager
def bound(**ids) -> Iterator[None]:
    token = bind(**ids)
    try:
        yield
    finally:
        reset(token)
