"""The tool registry: `@tool` registers a typed function; definitions refer to it by name.

Stepwise's built-in tools live in the modules of `BUILTIN_MODULES` (HTTP, SQL, files, message
brokers, e-mail, JSON APIs; docs/tools.md); users add their own from their
own modules, listed in the STEPWISE_TOOL_MODULES setting (environment variable), with no
change to Stepwise's code. A tool receives validated params and a `ToolContext`, returns a
JSON-able value, and raises `StepError` with an error class for a failure it understands.
A tool that calls out makes its calls through `orchestrator.integrations.egress.request` under
`egress.policy_for(tool=<its name>, team=ctx.team)`, and names its URL params in `url_params`.
A tool that reaches a system an operator configured takes a `connection` param naming one
(`orchestrator.integrations.connections`) and declares its kind in `connection`; a definition naming
a missing connection is refused when it is saved (`tools/checks.py`).
"""
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

from django.conf import settings


@dataclass(frozen=True)
class ToolContext:
    run_id: str
    step_name: str
    attempt: int
    idempotency_key: str
    side_effect: bool = False
    # The step's timeout_s: an outbound call must end by then (orchestrator.integrations.egress).
    timeout_s: float | None = None
    # Finds the run's team slug the first time a tool asks for `team`; most tools never do,
    # so most tool steps make no query for it.
    team_lookup: Callable[[], str] | None = field(default=None, repr=False, compare=False)
    # The attempt's fencing token (0: unfenced): adapters send it so a remote can refuse a
    # writer whose claim was superseded (FENCING_HEADER; docs/failure-semantics.md).
    fencing_token: int = 0

    @cached_property
    def team(self) -> str:
        """The slug of the run's team: its egress policy may differ from the default's."""
        return self.team_lookup() if self.team_lookup is not None else ""


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
    # Params that are URLs the tool calls: checked against the egress policy when a
    # definition is saved (their literal part) as well as when the call is made.
    url_params: tuple[str, ...] = ()
    # The kind of named connection its `connection` param names
    # (orchestrator.integrations.connections).
    connection: str | None = None
    # The tool changes the world whatever the step says: every call goes through the effect
    # ledger, as if the step declared `side_effect: true`.
    side_effect: bool = False
    # Save-time checks of a step's params against its connection: (params, connection or None)
    # -> [(path inside params, message)]; literal values only (templates are run-time's).
    check: Callable[[dict, object], list[tuple[tuple, str]]] | None = field(default=None)
    # The tool computes its output from its params alone, in the worker's process: it reaches
    # nothing outside (no network, file, database or clock), so a call of it is not an
    # external call and the audit ledger authorizes none (docs/audit.md). The step's own
    # entries (ready with its input hash, running, completed with its output) still say what
    # it did. A step that declares `side_effect: true` is authorized all the same.
    in_process: bool = False
    # Changed when what the tool returns for the same params changes (a new endpoint, a new
    # algorithm): a step's reusable result is kept per tool version (docs/definitions.md#cache).
    version: str = "1"


# The header (HTTP, e-mail) and message property (brokers) carrying the fencing token.
FENCING_HEADER = "Stepwise-Fencing-Token"

_TOOLS: dict[str, Tool] = {}


class ToolAlreadyRegistered(Exception):
    pass


def tool(name: str, *, params_schema: dict, output_schema: dict | None = None,
         description: str = "", lookup: Callable[[str], object] | None = None,
         dedupes_by_key: bool = False, url_params: tuple[str, ...] = (),
         connection: str | None = None, side_effect: bool = False,
         check: Callable[[dict, object], list[tuple[tuple, str]]] | None = None,
         in_process: bool = False, version: str = "1"):
    """Register the decorated function as tool `name`. Raises ToolAlreadyRegistered on reuse."""

    def register(fn):
        existing = _TOOLS.get(name)
        if existing is not None and existing.fn.__qualname__ != fn.__qualname__:
            raise ToolAlreadyRegistered(f"tool '{name}' is already registered by {existing.fn}")
        _TOOLS[name] = Tool(name, fn, params_schema, output_schema,
                            description or (fn.__doc__ or "").strip().split("\n")[0],
                            lookup=lookup, dedupes_by_key=dedupes_by_key,
                            url_params=tuple(url_params), connection=connection,
                            side_effect=side_effect, check=check, in_process=in_process,
                            version=version)
        return fn

    return register


def side_effecting_tools() -> set[str]:
    """The tools that change the world whatever a step declares (`Tool.side_effect`)."""
    return {name for name, t in _TOOLS.items() if t.side_effect}


def get_tool(name: str) -> Tool:
    """Raises KeyError for an unknown tool."""
    return _TOOLS[name]


def all_tools() -> dict[str, Tool]:
    return dict(_TOOLS)


def tool_param_schemas() -> dict[str, dict]:
    return {name: t.params_schema for name, t in _TOOLS.items()}


BUILTIN_MODULES = (
    "orchestrator.integrations.tools.builtin", "orchestrator.integrations.tools.sql",
    "orchestrator.integrations.tools.files", "orchestrator.integrations.tools.brokers",
    "orchestrator.integrations.tools.mail", "orchestrator.integrations.tools.http_api",
)


def load_tool_modules() -> None:
    """Import the built-in tools and every module named in STEPWISE_TOOL_MODULES."""
    for module in BUILTIN_MODULES:
        importlib.import_module(module)
    for module in settings.STEPWISE_TOOL_MODULES:
        importlib.import_module(module)
