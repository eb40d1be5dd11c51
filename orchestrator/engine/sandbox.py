"""What a sandboxed run gets in place of the world: pure decisions over its `Run.sandbox`.

A run started with a sandbox (an evaluation's case, a shadow run of a draft) reaches no
side-effecting tool, no person and no callback. Its sandbox says what answers instead:

    {"purpose": "evaluation" | "shadow",
     "responses": {"<step>": <output>},           # a side-effecting tool step's (or a map's
                                                  # items'), or a human_input step's answer
     "decisions": {"<gate>": "approve" | "reject"},   # a human_gate's; default approve
     "connections": {"<connection>": "<sandbox connection>"}}   # sent there instead

Each step kind asks here once, at the one place it would reach the world: the tool executor
(`executors.tool.prepared_call`, which tool steps, map items and compensations share), the
human gate's start and the human input's start (`services.kinds`). Nothing here reads or writes
the database; the services record what was answered (`step.sandboxed`, the gate's decision by
`authz.SANDBOX`, "service:evaluation").
"""
from dataclasses import dataclass

from .definitions.limits import MAX_INPUT_BYTES, MAX_INPUT_DEPTH, document_problems
from .definitions.problems import format_path
from .output_schemas import validate_output
from .retry import StepError

PURPOSES = ("evaluation", "shadow")
DECISIONS = ("approve", "reject")
KEYS = ("purpose", "responses", "decisions", "connections")


def sandbox_problems(sandbox: object) -> list[dict]:
    """Every way `sandbox` is not a sandbox (module docstring), as [{"path", "message"}] with
    paths like ``sandbox.decisions.approve``; [] for None (a live run). Checked for size first,
    like a run's input: it is stored on the run and read at every step."""
    if sandbox is None:
        return []
    size = [{"path": format_path(("sandbox", *parts)), "message": message}
            for parts, message in document_problems(sandbox, max_bytes=MAX_INPUT_BYTES,
                                                    max_depth=MAX_INPUT_DEPTH, what="the sandbox")]
    if size:
        return size
    if not isinstance(sandbox, dict):
        return [{"path": "sandbox", "message": "a sandbox is an object: {purpose, responses, "
                 "decisions}, or null for a live run"}]
    problems = [{"path": f"sandbox.{key}", "message": f"not a field of a sandbox (one of "
                 f"{', '.join(KEYS)})"} for key in sandbox if key not in KEYS]
    if "purpose" in sandbox and sandbox["purpose"] not in PURPOSES:
        problems.append({"path": "sandbox.purpose",
                         "message": f"one of {', '.join(PURPOSES)}"})
    for key in ("responses", "decisions"):
        if not isinstance(sandbox.get(key, {}), dict):
            problems.append({"path": f"sandbox.{key}", "message": "an object keyed by step name"})
    connections = sandbox.get("connections", {})
    if not isinstance(connections, dict) or not all(
            isinstance(v, str) and v and v != k for k, v in connections.items()):
        problems.append({"path": "sandbox.connections", "message": "an object naming, for a connection, "
                         "another connection its side-effecting calls go to instead"})
    for gate, decision in (sandbox.get("decisions") if isinstance(sandbox.get("decisions"), dict)
                           else {}).items():
        if decision not in DECISIONS:
            problems.append({"path": f"sandbox.decisions.{gate}",
                             "message": f"one of {', '.join(DECISIONS)}"})
    return problems


@dataclass(frozen=True)
class ToolAnswer:
    """What a side-effecting call of a sandboxed run returns instead of calling its tool."""

    output: object
    #: True: the sandbox declared it (`responses[<step>]`), and it matched the output schema.
    declared: bool

    def recorded(self, tool: str, params: object) -> dict:
        """The payload of the `step.sandboxed` event: what the call would have done."""
        return {"tool": tool, "params": params, "response_declared": self.declared}


def tool_answer(sandbox: dict, *, step: str, tool: str, params: object,
                output_schema: dict | None, action: str = "default") -> ToolAnswer:
    """The answer of step `step`'s call of `tool` with `params`: the declared response, checked
    against `output_schema`, else `{"sandboxed": true, "tool", "params"}` (not checked: it says
    what would have been called). A compensation (`action` "compensate") always gets the
    latter: nothing reads its output. Raises StepError("validation") naming the path when the
    declared response does not match: the case's declaration is wrong, not the tool."""
    responses = sandbox.get("responses") or {}
    if action == "default" and step in responses:
        output = responses[step]
        try:
            validate_output(output_schema, output)
        except StepError as error:
            raise StepError("validation", f"sandbox.responses.{step}: {error.message}") from None
        return ToolAnswer(output, declared=True)
    return ToolAnswer({"sandboxed": True, "tool": tool, "params": params}, declared=False)


def gate_decision(sandbox: dict, gate: str) -> str:
    """How a sandboxed run's gate `gate` ends: "approve" (the default) or "reject"."""
    return (sandbox.get("decisions") or {}).get(gate, "approve")


def declared_answer(sandbox: dict, step: str) -> object:
    """The declared answer of human_input step `step`, or None when the sandbox has none."""
    return (sandbox.get("responses") or {}).get(step)


def connection_instead(sandbox: dict, *, connection: object) -> str | None:
    """The sandbox connection a side-effecting call through `connection` is sent to instead
    (an operator's test account of the same kind), or None: the call is answered, not sent."""
    connections = sandbox.get("connections") or {}
    return connections.get(connection) if isinstance(connection, str) else None
