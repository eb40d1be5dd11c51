"""The tool registry: `@tool` registers a typed function; definitions refer to it by name.

Stepwise's built-in tools live in `orchestrator.tools.builtin`; users add their own from their
own modules, listed in the STEPWISE_TOOL_MODULES setting (environment variable), with no
change to Stepwise's code. A tool receives validated params and a `ToolContext`, returns a
JSON-able value, and raises `StepError` with an error class for a failure it understands.
"""
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

from django.conf import settings


@dataclass(frozen=True)
class ToolContext:
    run_id: str
    step_name: str
    attempt: int
    idempotency_key: str
    side_effect: bool = False


@dataclass(frozen=True)
class Tool:
    name: str
    fn: Callable[[dict, ToolContext], object]
    params_schema: dict
    output_schema: dict | None = None
    description: str = ""
    # For effects whose outcome can be uncertain: look the effect up by idempotency key ...
    lookup: Callable[[str], object] | None = field(default=None)
    # ... or the remote dedupes by the idempotency key we send it, so repeating is safe.
    dedupes_by_key: bool = False


_TOOLS: dict[str, Tool] = {}


class ToolAlreadyRegistered(Exception):
    pass


def tool(name: str, *, params_schema: dict, output_schema: dict | None = None,
         description: str = "", lookup: Callable[[str], object] | None = None,
         dedupes_by_key: bool = False):
    """Register the decorated function as tool `name`. Raises ToolAlreadyRegistered on reuse."""

    def register(fn):
        existing = _TOOLS.get(name)
        if existing is not None and existing.fn.__qualname__ != fn.__qualname__:
            raise ToolAlreadyRegistered(f"tool '{name}' is already registered by {existing.fn}")
        _TOOLS[name] = Tool(name, fn, params_schema, output_schema,
                            description or (fn.__doc__ or "").strip().split("\n")[0],
                            lookup=lookup, dedupes_by_key=dedupes_by_key)
        return fn

    return register


def get_tool(name: str) -> Tool:
    """Raises KeyError for an unknown tool."""
    return _TOOLS[name]


def all_tools() -> dict[str, Tool]:
    return dict(_TOOLS)


def tool_param_schemas() -> dict[str, dict]:
    return {name: t.params_schema for name, t in _TOOLS.items()}


def load_tool_modules() -> None:
    """Import the built-in tools and every module named in STEPWISE_TOOL_MODULES."""
    importlib.import_module("orchestrator.tools.builtin")
    for module in settings.STEPWISE_TOOL_MODULES:
        importlib.import_module(module)
