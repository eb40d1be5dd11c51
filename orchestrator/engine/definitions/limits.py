"""The size, depth and cost limits on everything a definition carries, in one place.

Owns the numbers (docs/limits.md lists each one, where it is enforced and the error a user
gets) and `document_problems`, the iterative check of a parsed document's size and nesting
that runs before anything recursive touches it (jsonschema, the validators, the JSON
encoder used for digests). It must not enforce the template or expression limits itself;
`templates.py` and `expressions.py` do, with these numbers.

Every limit is far above what a real workflow needs and far below what would stall a web
process or a worker: a violation is a 4xx with a path, never a 500, a stall or a stuck run.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import time
from collections.abc import Iterator

from ..text import invalid_char
from .problems import PathPart, format_path

# --- a definition ------------------------------------------------------------------------
MAX_DEFINITION_BYTES = 512 * 1024  # its canonical JSON (UTF-8), and its YAML/JSON text
MAX_STEPS = 500
MAX_DEPTH = 64  # nesting of mappings and lists, the document itself being level 1

# --- run input ------------------------------------------------------------------------------
MAX_INPUT_BYTES = 1024 * 1024  # its canonical JSON (UTF-8)
MAX_INPUT_DEPTH = 64

# --- numeric fields of the format (also in its JSON Schema as `maximum`) ---------------------
MAX_TIMEOUT_S = 30 * 86400  # a step attempt, a human gate, a map item, a sub-workflow
MAX_RUN_DURATION_S = 90 * 86400  # budget.max_duration_s
MAX_SLEEP_S = 90 * 86400  # a sleep step: its for_s, and how far ahead its until may be
MAX_WAIT_S = 90 * 86400  # a wait step's timeout_s
MAX_CACHE_TTL_S = 365 * 86400  # how long a step's reusable result is kept (cache.ttl_s)
# --- signals (a wait step's) ----------------------------------------------------------------
MAX_BUFFERED_SIGNALS = 20  # signals one run keeps before a wait step for them starts
MAX_SIGNAL_KEY_CHARS = 200  # a signal's idempotency key, and a wait step's correlation key
MAX_COST_USD = 1_000_000  # budget.max_cost_usd
MAX_RETRY_ATTEMPTS = 100
MAX_RETRY_DELAY_S = 86400  # retry.base_s and retry.max_s
MAX_PARALLEL = 1000
MAX_CONCURRENCY_LIMIT = 10_000  # runs of one concurrency key unfinished at once
MAX_CONCURRENCY_KEY_CHARS = 200  # a rendered concurrency key
MAX_LOOP_ITERATIONS = 50  # max_iterations of a loop step
MAX_LOOP_BODY_STEPS = 20  # steps in one loop's body
MAX_TOKENS = 1_000_000  # max_tokens of a model call
MAX_REPAIR_ATTEMPTS = 10
MAX_TEMPERATURE = 2
MAX_SCRIPTED_TOKENS = 10_000_000  # tokens_in / tokens_out of a scripted reply
MAX_SCRIPTED_DELAY_MS = 600_000  # delay_ms of a scripted reply

# --- templates (Jinja2) ------------------------------------------------------------------------
MAX_TEMPLATE_CHARS = 64 * 1024  # the source of one template
MAX_RENDER_CHARS = 1024 * 1024  # what one template renders to, and any string or list it builds
MAX_INT_BITS = 4096  # integers a template or an expression computes (about 1,233 digits)
MAX_RENDER_STEPS = 200_000  # loop iterations of one render, nested loops counted in full
MAX_RENDER_SECONDS = 2.0  # one render's CPU time, checked at every operation it performs
TEMPLATE_CACHE_SIZE = 512  # compiled templates kept; each is at most MAX_TEMPLATE_CHARS of source

# --- expressions (CEL) --------------------------------------------------------------------------
MAX_EXPRESSION_CHARS = 4096
MAX_EXPRESSION_DEPTH = 200  # levels of the syntax tree (each parenthesis adds about ten)
MAX_EXPRESSION_COST = 10_000  # evaluation steps (AST nodes visited, macro iterations included)
MAX_EXPRESSION_SECONDS = 2.0  # CPU-time backstop for one evaluation, far above what the cost allows
EXPRESSION_CACHE_SIZE = 1024


def spent_seconds() -> float:
    """The calling thread's CPU time: what a render or an evaluation is timed by, so a busy
    machine descheduling the thread never makes a cheap template look costly."""
    return time.thread_time()


class CpuDeadline:
    """A limit on the CPU time the calling thread spends from now on.

    The CPU clock is a system call; the wall clock is not. CPU time never runs ahead of wall
    time, so the CPU clock is read only once the wall clock has passed the limit.
    """

    def __init__(self, seconds: float) -> None:
        self.wall = time.monotonic() + seconds
        self.cpu = spent_seconds() + seconds

    def passed(self) -> bool:
        return time.monotonic() > self.wall and spent_seconds() > self.cpu


def document_problems(
    value: object,
    *,
    max_bytes: int,
    max_depth: int,
    what: str,
) -> Iterator[tuple[tuple[PathPart, ...], str]]:
    """Yield (path, message) when `value` nests deeper than `max_depth` or its JSON text
    would exceed `max_bytes`; also for floats that are not finite (no JSON has them) and for
    the first string (or key) that is not valid Unicode (`orchestrator.engine.text`).

    Iterative, so it is safe on any depth, and it stops counting bytes once over the limit:
    the cost is bounded by the size of `value` itself, never by its expansion.
    """
    size = 0
    stack: list[tuple[object, tuple[PathPart, ...], int]] = [(value, (), 1)]
    while stack:
        node, parts, depth = stack.pop()
        if depth > max_depth:
            yield parts, f"{what} nests deeper than {max_depth} levels"
            return
        if isinstance(node, dict):
            size += 2 + max(len(node) - 1, 0)
            for key, item in node.items():
                size += _text_bytes(key) + 1
                if isinstance(key, str) and invalid_char(key) is not None:
                    yield parts, f"a key of {what} is not valid Unicode (a lone surrogate)"
                    return
                stack.append((item, (*parts, key), depth + 1))
        elif isinstance(node, list | tuple):
            size += 2 + max(len(node) - 1, 0)
            for index, item in enumerate(node):
                stack.append((item, (*parts, index), depth + 1))
        elif isinstance(node, str):
            size += _text_bytes(node)
            char = invalid_char(node)
            if char is not None:
                yield parts, (f"is not valid Unicode: it holds a lone surrogate "
                              f"(U+{ord(char):04X}), which no UTF-8 text can carry")
                return
        elif isinstance(node, float) and not math.isfinite(node):
            yield parts, f"{node} is not a JSON number; use a finite number"
        elif isinstance(node, int) and not isinstance(node, bool):
            size += node.bit_length() * 30103 // 100000 + 2  # its decimal digits, at most
        else:
            size += 5 if not isinstance(node, float) else 24  # null, true, false; a float
        if size > max_bytes:
            yield (), f"{what} is larger than {max_bytes:,} bytes as JSON"
            return


def _text_bytes(text: object) -> int:
    if not isinstance(text, str):
        return len(repr(text))
    # An estimate without encoding the whole string: exact for ASCII, an upper bound else.
    return len(text) + 2 if text.isascii() else len(text) * 4 + 2


def run_input_problems(value: object) -> list[dict]:
    """Every way run input `value` exceeds the input limits, as [{"path", "message"}]
    with paths like ``input.a[0]`` — checked before the input schema, whose validator
    recurses and whose cost grows with the input."""
    return [
        {"path": format_path(("input", *parts)), "message": message}
        for parts, message in document_problems(
            value, max_bytes=MAX_INPUT_BYTES, max_depth=MAX_INPUT_DEPTH, what="the run input"
        )
    ]


def signal_payload_problems(value: object) -> list[dict]:
    """Every way a signal's payload exceeds the limits of a run input (paths ``payload...``)."""
    return [
        {"path": format_path(("payload", *parts)), "message": message}
        for parts, message in document_problems(
            value, max_bytes=MAX_INPUT_BYTES, max_depth=MAX_INPUT_DEPTH, what="the payload"
        )
    ]


# --- one definition check: all its sample renders and evaluations together ---------------------
MAX_CHECK_RENDER_STEPS = 1_000_000
MAX_CHECK_EXPRESSION_COST = 100_000


class Allowance:
    """What the sample renders and evaluations of one definition check may spend in total,
    so a definition of many costly templates cannot stall a save."""

    def __init__(self) -> None:
        self.render_steps = MAX_CHECK_RENDER_STEPS
        self.expression_cost = MAX_CHECK_EXPRESSION_COST


_allowance: contextvars.ContextVar[Allowance | None] = contextvars.ContextVar(
    "definition_check_allowance", default=None
)


@contextlib.contextmanager
def check_allowance() -> Iterator[Allowance]:
    """Within this block every render and evaluation also draws on one shared Allowance."""
    token = _allowance.set(Allowance())
    try:
        yield _allowance.get()
    finally:
        _allowance.reset(token)


def current_allowance() -> Allowance | None:
    return _allowance.get()
