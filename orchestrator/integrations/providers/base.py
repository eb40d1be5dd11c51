"""The provider interface. A provider turns a request into a reply or a classified StepError.

A provider performs exactly one call per `complete` — no hidden retries: retrying is the step's
retry policy's job, and repairing a bad reply is the agent executor's. A reply whose text is
not a usable JSON value is not an exception: it comes back with `invalid` set, so the executor
can show the model its mistake within the repair bound.
"""
import json
import os
import re
from dataclasses import dataclass, field

from orchestrator.engine.retry import StepError

from .errors import DEFAULT_MAX_RESPONSE_BYTES

# The name of the one tool / structured-output channel a reply may arrive through.
RESPONSE_NAME = "respond"
# Seconds a model call may take, and its connection (registry `timeout_s`, `connect_timeout_s`).
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_CONNECT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class ModelRequest:
    model: str  # the provider's model id (registry `model_id`, else the registry name)
    prompt: str
    system: str = ""
    # The JSON Schema the reply must satisfy: providers use JSON mode / tool calling with it.
    output_schema: dict | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    # Turns after `prompt`, for repair: [{"role": "assistant"|"user", "content": str}, ...].
    messages: tuple = ()
    # Seconds this call may take (the step's remaining time, capped by the registry).
    timeout_s: float | None = None
    # Offline scripted replies declared in the definition, and what their `when` may read.
    script: list = field(default_factory=list)
    context: dict = field(default_factory=dict)
    fixture_key: str = ""


@dataclass(frozen=True)
class ModelReply:
    output: object  # parsed JSON value (None when `invalid`)
    tokens_in: int
    tokens_out: int
    raw: str = ""
    model_id: str = ""  # the model version the provider says answered
    invalid: str = ""  # why the reply is not a usable JSON value ("" when it is)


class Provider:
    name = "base"
    # Where calls go when the registry entry names no `base_url` ("": nowhere, e.g. scripted).
    default_base_url = ""
    # True when the same request always gets the same reply (then a repair turn is pointless).
    deterministic = False

    def __init__(self, config: dict):
        self.config = config

    def complete(self, request: ModelRequest) -> ModelReply:  # pragma: no cover - interface
        raise NotImplementedError

    def call_timeout_s(self, request: ModelRequest) -> float:
        """The registry's `timeout_s`, cut to what is left of the step's own timeout."""
        limit = float(self.config.get("timeout_s", DEFAULT_TIMEOUT_S))
        return min(limit, request.timeout_s) if request.timeout_s else limit

    def connect_timeout_s(self) -> float:
        return float(self.config.get("connect_timeout_s", DEFAULT_CONNECT_TIMEOUT_S))

    def max_response_bytes(self) -> int:
        """The registry's `max_response_bytes`: the largest reply read (egress size cap)."""
        return int(self.config.get("max_response_bytes", DEFAULT_MAX_RESPONSE_BYTES))


def response_calls_problem(names: list[str]) -> str:
    """Why a reply's tool calls (by name) are not a usable answer ("" when they are): only one
    call of the response channel is; any other tool is never run from a reply."""
    others = sorted({str(name) for name in names if name != RESPONSE_NAME})
    if others:
        return (f"the reply calls {', '.join(others)}, which is not offered; the only way to "
                f"answer is the `{RESPONSE_NAME}` tool, and no tool is ever run from a reply")
    if len(names) > 1:
        return f"the reply calls `{RESPONSE_NAME}` {len(names)} times; call it once"
    return ""


_FENCE = re.compile(r"^```[a-zA-Z]*\s*\n(.*)\n\s*```$", re.DOTALL)


def _reject_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def parse_json_reply(text: str) -> tuple[object, str]:
    """(value, "") for a reply that is one complete JSON value, else (None, why not).

    One surrounding Markdown code fence is removed (local models add it even in JSON mode);
    nothing is ever extracted from prose, and NaN/Infinity are rejected, so a value either
    parses whole or not at all.
    """
    stripped = (text or "").strip()
    fenced = _FENCE.match(stripped)
    if fenced:
        stripped = fenced.group(1).strip()
    if not stripped:
        return None, "the reply was empty; expected a JSON value"
    try:
        return json.loads(stripped, parse_constant=_reject_constant), ""
    except ValueError as exc:
        return None, f"the reply is not valid JSON ({exc})"


def estimate_tokens(text: str) -> int:
    """~4 characters a token: used when a server reports no usage, so budgets still see cost."""
    return len(text) // 4 + 1


def token_count(value: object, fallback: int) -> int:
    """A usage figure from the API if it is a sane count, else the estimate."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return fallback


def wrap_schema(schema: dict | None) -> tuple[dict, bool]:
    """A tool/function input schema must be an object: wrap any other schema as {"value": ...}.

    Returns (schema to send, whether replies must be unwrapped).
    """
    if isinstance(schema, dict) and schema.get("type") == "object":
        return schema, False
    inner = schema if isinstance(schema, dict) else {}
    return {"type": "object", "required": ["value"], "additionalProperties": False,
            "properties": {"value": inner}}, True


def contract_text(schema: dict | None, *, tool: bool = False) -> str:
    """The instruction that states the output contract, appended to the system prompt."""
    if schema is None:
        return ""
    channel = (f"Answer only by calling the `{RESPONSE_NAME}` tool; its input is your answer."
               if tool else "Reply with one JSON value and nothing else: no prose, no code fence.")
    return (f"{channel}\nThe answer must validate against this JSON Schema; fields it does not "
            f"list are not allowed:\n{json.dumps(schema, sort_keys=True)}")


def with_contract(system: str, schema: dict | None, *, tool: bool = False) -> str:
    contract = contract_text(schema, tool=tool)
    return "\n\n".join(part for part in (system, contract) if part)


def api_key(config: dict, default_env: str | None) -> str | None:
    """The API key from the environment variable the registry names (never from the registry).

    Raises StepError('auth') when a variable is named but not set.
    """
    env = config.get("api_key_env", default_env)
    if not env:
        return None
    key = os.environ.get(env)
    if not key:
        raise StepError("auth", f"environment variable {env} (the API key) is not set")
    return key


def unwrap(value: object, wrapped: bool) -> tuple[object, str]:
    """Undo `wrap_schema`: {"value": x} -> x."""
    if not wrapped:
        return value, ""
    if isinstance(value, dict) and set(value) == {"value"}:
        return value["value"], ""
    return None, 'the reply must be an object with exactly one field, "value"'
