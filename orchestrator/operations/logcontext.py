"""The ids every log line carries: run, step, attempt, workflow, team and trace.

A context variable holds them for the current request, task or thread;
`orchestrator.operations.logs` puts them on each record. Entry points bind them (the request
middleware, the Celery task signals, the worker once it claimed a step); nothing else needs to pass
them around. It also keeps the secret values this process revealed, for the log redaction
(`mask_in_logs`). Pure: no Stepwise import, no I/O.
"""
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from threading import Lock

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


# --- secret values this process holds in memory --------------------------------------------
# A run's secret inputs, once revealed in this process (to render a step's params, a child's
# input), are masked in every log line written here afterwards, whichever library writes it
# (an HTTP client's request line with the value in a URL's query). Kept per process, most
# recent last, and bounded: a value dropped from it was revealed long ago.
MAX_KNOWN_SECRETS = 4096
_known: dict[str, None] = {}
_known_sorted: tuple[str, ...] = ()
_known_lock = Lock()


def mask_in_logs(values: Iterable[str]) -> None:
    """Mask these values in every log line this process writes from now on."""
    global _known_sorted
    fresh = [v for v in values if isinstance(v, str) and v and v not in _known]
    if not fresh:
        return
    with _known_lock:
        for value in fresh:
            _known[value] = None
        while len(_known) > MAX_KNOWN_SECRETS:
            del _known[next(iter(_known))]
        _known_sorted = tuple(sorted(_known, key=len, reverse=True))  # longest first


def masked_values() -> tuple[str, ...]:
    """The values `mask_in_logs` was given (the most recent MAX_KNOWN_SECRETS), longest first."""
    return _known_sorted
