"""Tool steps: render params, validate them against the tool's schema, call the tool.

A side-effecting call goes through the effect ledger handed over in `ctx.effects`; an external
call is authorized first through `ctx.authorize`. In a sandboxed run (`ctx.sandbox`) a
side-effecting call never reaches its tool: `prepared_call` answers it from the sandbox
(`orchestrator.engine.sandbox`), and the ledger records what it would have done.
"""
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from jsonschema import Draft202012Validator

from orchestrator.integrations.tools.registry import Tool, ToolContext, get_tool
from orchestrator.models import Run

from ..definitions import TemplateError, render_value
from ..output_schemas import validate_output
from ..retry import StepError
from ..sandbox import connection_instead, tool_answer
from .base import ExecContext, Result


@dataclass(frozen=True)
class PreparedCall:
    tool: Tool
    params: object
    call: Callable[[], object]
    # In a sandboxed run, for a side-effecting call: the `step.sandboxed` event's payload
    # ({tool, params, response_declared}), and `call` returns the sandbox's answer. None: live.
    sandboxed: dict | None = None


def prepared_call(spec: dict, step_input: dict, ctx: ExecContext, *,
                  action: str = "default") -> PreparedCall:
    """The tool `spec` names, and a call of it with `spec`'s params rendered over `step_input`
    and checked against the tool's schema. Raises StepError before anything is called (and,
    in a sandboxed run, for a declared response its output schema refuses).

    Shared by tool steps, map items and compensations (`action` "compensate":
    services/compensation.py).
    """
    try:
        tool = get_tool(spec["tool"])
    except KeyError:
        raise StepError("permanent", f"tool '{spec['tool']}' is not registered") from None
    if tool.side_effect:  # it changes the world whatever the step says, and the audit says so
        spec = {**spec, "side_effect": True}
    try:
        params = render_value(spec.get("params") or {}, step_input)
    except TemplateError as exc:
        raise StepError("validation", f"params could not be rendered: {exc}") from exc
    if ctx.params_override and isinstance(params, dict):
        params = {**params, **ctx.params_override}
    errors = sorted(Draft202012Validator(tool.params_schema).iter_errors(params), key=str)
    if errors:
        raise StepError("validation", "; ".join(e.message for e in errors[:10]))
    tool_ctx = ToolContext(ctx.run_id, ctx.step_name, ctx.attempt, ctx.idempotency_key,
                           side_effect=bool(spec.get("side_effect")),
                           timeout_s=spec.get("timeout_s"), team_lookup=partial(_team_of, ctx.run_id),
                           fencing_token=ctx.fencing_token)

    if ctx.sandbox is not None and spec.get("side_effect") and tool.connection and isinstance(params, dict) \
            and (instead := connection_instead(ctx.sandbox, connection=params.get("connection"))):
        # Sent for real, to the sandbox connection the operator named for this one: the
        # ledger records it as sandboxed, with where it went.
        params = {**params, "connection": instead}
        return PreparedCall(tool, params, _live_call(tool, spec, step_input, ctx, params, tool_ctx),
                            sandboxed={"tool": tool.name, "params": params, "response_declared": False,
                                       "sent_to": instead})
    if ctx.sandbox is not None and spec.get("side_effect"):
        answer = tool_answer(ctx.sandbox, step=ctx.step_name, tool=tool.name, params=params,
                             output_schema=spec.get("output_schema") or tool.output_schema,
                             action=action)
        return PreparedCall(tool, params, lambda: answer.output,
                            sandboxed=answer.recorded(tool.name, params))
    return PreparedCall(tool, params, _live_call(tool, spec, step_input, ctx, params, tool_ctx))


def _live_call(tool: Tool, spec: dict, step_input: dict, ctx: ExecContext, params, tool_ctx: ToolContext):
    external = not tool.in_process or bool(spec.get("side_effect"))

    def call():
        # Audit: the entry authorizing this call is committed before the call is made, so a
        # worker that dies during the call leaves the evidence (audit.services). A replayed
        # effect makes no call, and so no entry. A call that stays in this process (a pure
        # tool) is not an external call: nothing to authorize, and no transaction of its own.
        if external:
            ctx.authorize(ctx=ctx, spec=spec, step_input=step_input, kind="tool",
                          target=tool.name, request=params)
        response = _call(tool, params, tool_ctx)
        if external and ctx.responded is not None:
            # Its answer, as the attempt's attestation records it beside the request.
            ctx.responded(request=params, response=response)
        return response

    return call


def run(spec: dict, step_input: dict, ctx: ExecContext) -> Result:
    prepared = prepared_call(spec, step_input, ctx)
    tool = prepared.tool
    if spec.get("side_effect") or tool.side_effect:
        if ctx.effects is None:  # a side effect outside the ledger could happen twice
            raise StepError("permanent", "a side-effecting call needs the effect ledger")
        output = ctx.effects(tool=tool, call=prepared.call, sandboxed=prepared.sandboxed)
        if prepared.sandboxed is not None and "sent_to" not in prepared.sandboxed:
            # The sandbox's answer: a declared one was checked as it was chosen; the default
            # one says what would have been called, and is not the tool's output to check.
            return Result(output)
    else:
        output = prepared.call()
    validate_output(spec.get("output_schema") or tool.output_schema, output)
    return Result(output)


def _team_of(run_id: str) -> str:
    """The run's team slug: a tool's egress policy may be the team's own."""
    return Run.objects.filter(id=run_id).values_list("team__slug", flat=True).first() or ""


def _call(tool, params: dict, tool_ctx: ToolContext):
    try:
        return tool.fn(params, tool_ctx)
    except StepError:
        raise
    except Exception as exc:  # a tool bug is a permanent failure of this attempt, not a crash
        raise StepError("permanent", f"{type(exc).__name__}: {exc}") from exc
