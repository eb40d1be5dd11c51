"""What every tool on a named connection shares: finding the connection, deadlines, message ids,
and turning a failure into a classified `StepError` with no credential in its message.

A tool never reads STEPWISE_CONNECTIONS itself: it asks `connection_for`, which applies the
team's grant. Messages go through `failure`, which scrubs the connection's credentials and
caps the length, because a step's error is stored, shown and written to the audit ledger.
"""
import uuid

from orchestrator.engine.definitions import contains_template
from orchestrator.engine.retry import StepError

from ..connections import Connection, ConnectionRefused, connection_get
from .registry import ToolContext

MESSAGE_LIMIT = 300
# Message ids derived from idempotency keys: the same key always gives the same id, so a
# consumer that saw the id once can drop a repeat.
MESSAGE_NAMESPACE = uuid.UUID("6f1d4c3e-5b0a-4a57-9b59-1d2f0c6e7a10")

CONNECTION_PARAM = {"type": "string", "minLength": 1, "maxLength": 100,
                    "description": "The name of a connection an operator configured."}


def connection_for(params: dict, ctx: ToolContext, kind: str) -> Connection:
    """The named connection of the step. Raises StepError("policy") when it is missing, of
    another kind, not granted to the run's team, or its credential cannot be read."""
    try:
        return connection_get(params.get("connection"), kind=kind, team=ctx.team)
    except ConnectionRefused as exc:
        raise StepError("policy", exc.message[:MESSAGE_LIMIT]) from None


def message_id(idempotency_key: str) -> str:
    """The message id of the effect with this key: a UUID derived from it, never random."""
    return str(uuid.uuid5(MESSAGE_NAMESPACE, idempotency_key))


def deadline_s(connection: Connection, params: dict, ctx: ToolContext, default: float = 30) -> float:
    """Seconds the call may take: the param, capped by the connection's and the step's timeout."""
    limits = [float(params.get("timeout_s") or default)]
    if connection.get("timeout_s"):
        limits.append(float(connection.get("timeout_s")))
    if ctx.timeout_s:
        limits.append(float(ctx.timeout_s))
    return max(min(limits), 0.1)


def failure(connection: Connection | None, error_class: str, exc: BaseException | str) -> StepError:
    """A StepError of `error_class` whose message names the failure, never a credential."""
    text = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
    if connection is not None:
        text = connection.scrub(text)
    return StepError(error_class, " ".join(text.split())[:MESSAGE_LIMIT])


def connection_checked(params: dict, *, names: tuple[str, ...] = ()) -> list[tuple[tuple, str]]:
    """Save-time: the params in `names` must be literal where given (a template could widen
    what the step may do past what a reviewer saw)."""
    problems = []
    for name in names:
        if name in params and contains_template(params[name]):
            problems.append(((name,), f"{name} must be literal, not a template"))
    return problems
