"""Agent steps: ask the model, hold the reply to its contract, repair within a bound.

The contract is the step's `output_schema`, or — for a step that declares `proposal` — the
proposal envelope over the declared action allowlist (`orchestrator.engine.definitions.proposals`).
A reply is checked strictly (unknown fields and enum values are rejected). A reply that fails is
sent back once per allowed repair (`repair_attempts`, default 1) with the problems listed; every
call's tokens are summed into the attempt, so budgets see repairs. Each repair turn is a model
call of its own for budgets too: it is reserved before it is made (`ctx.reserve_call`; a turn
that would cross a limit is not made) and every call is priced (`ctx.price`) and settled to its
cost once it returns (`ctx.settle_call`), like an attempt. After the bound the
attempt fails as `invalid_output` — never a crash, never half-checked data flowing on.

A proposal that passes is normalized and hashed, and our code — not the model — adds the
risk block (`orchestrator.engine.risk`) the approval gate's `when` reads. This executor changes no
run or step state (it only has the audit entry authorizing each call recorded: `ctx.authorize`)
and runs no tool: an action is performed only by a tool step the definition names.
"""
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from decimal import Decimal

from orchestrator.integrations.providers import ModelReply, ModelRequest, Provider, provider_for

from ..definitions import TemplateError, render_template
from ..definitions.format import DEFAULT_REPAIR_ATTEMPTS
from ..definitions.proposals import (
    envelope_schema,
    normalize_proposal,
    proposal_hash,
    proposal_problems,
)
from ..hashing import digest_of
from ..output_schemas import validate_output
from ..prompts import prompt_hash
from ..retry import StepError
from ..risk import assess
from .base import ExecContext, Result, SpentStepError

MAX_PROBLEMS_SHOWN = 10


@dataclass
class Conversation:
    """The calls of one attempt: usage summed over them, and the attempt's deadline."""

    provider: Provider
    config: dict
    spec: dict
    deadline: float
    # The price of a returned call (`ExecContext.price`).
    price: Callable[..., Decimal]
    tokens_in: int = 0
    tokens_out: int = 0
    # Each call priced when it returned (a price change mid-attempt does not reprice it).
    cost_usd: Decimal = Decimal(0)
    last_cost_usd: Decimal = Decimal(0)
    model_id: str = ""
    meta: dict = field(default_factory=dict)

    @classmethod
    def start(cls, spec: dict, *, price: Callable[..., Decimal]) -> "Conversation":
        try:
            provider, config = provider_for(spec["model"])
        except KeyError:
            raise StepError("permanent", f"model {spec['model']!r} or its provider is not "
                            "registered on this worker") from None
        deadline = time.monotonic() + float(spec.get("timeout_s") or 300)
        return cls(provider, config, spec, deadline, price)

    def ask(self, request: ModelRequest) -> ModelReply:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise self.failed(StepError("timeout", "the step's timeout passed between model calls"))
        try:
            reply = self.provider.complete(replace(request, timeout_s=remaining))
        except StepError as error:
            raise self.failed(error) from error
        self.tokens_in += reply.tokens_in
        self.tokens_out += reply.tokens_out
        self.last_cost_usd = self.price(self.config, reply.tokens_in, reply.tokens_out, model=self.spec["model"])
        self.cost_usd += self.last_cost_usd
        self.model_id = reply.model_id or self.model_id
        return reply

    def result(self, output: object) -> Result:
        return Result(output, self.tokens_in, self.tokens_out, self.cost_usd, self.spec["model"], self.provider.name,
                      {**self.meta, "model_id": self.model_id or self.model_name()})

    def failed(self, error: StepError) -> SpentStepError:
        """`error`, carrying what this attempt spent so far."""
        return SpentStepError(error.error_class, error.message, error.retry_after_s,
                              spent=self.result(None))

    def model_name(self) -> str:
        return self.config.get("model_id", self.spec["model"])


def render_prompts(spec: dict, step_input: dict) -> tuple[str, str]:
    """(system, prompt) rendered from the definition's templates over the step input.

    Input values are inserted as text, never rendered again, so `{{ }}` in user data stays text.
    """
    try:
        prompt = render_template(spec["prompt"], step_input)
        system = render_template(spec["system"], step_input) if spec.get("system") else ""
    except TemplateError as exc:
        raise StepError("validation", f"prompt could not be rendered: {exc}") from exc
    return system, prompt


def contract_of(spec: dict) -> dict | None:
    """The schema a reply must satisfy."""
    if spec.get("proposal"):
        return envelope_schema(spec["proposal"])
    return spec.get("output_schema")


def problems_of(spec: dict, reply: ModelReply) -> tuple[list[str], object]:
    """(problems, the value that may flow on) for one reply."""
    if reply.invalid:
        return [reply.invalid], None
    if spec.get("proposal"):
        try:
            value = normalize_proposal(spec["proposal"], reply.output)
        except ValueError as exc:
            return [str(exc)], None
        return proposal_problems(spec["proposal"], value), value
    try:
        validate_output(spec.get("output_schema"), reply.output)
    except StepError as exc:
        return [exc.message], None
    return [], reply.output


def repair_turns(reply: ModelReply, problems: list[str]) -> tuple[dict, dict]:
    shown = "\n".join(f"- {p[:300]}" for p in problems[:MAX_PROBLEMS_SHOWN])
    more = len(problems) - MAX_PROBLEMS_SHOWN
    if more > 0:
        shown += f"\n- ... and {more} more"
    return (
        {"role": "assistant", "content": reply.raw[:8000]},
        {"role": "user", "content": (
            "Your reply was rejected and nothing was done with it. Problems:\n"
            f"{shown}\n"
            "Reply again with the complete corrected answer only, following the same JSON "
            "Schema. Do not add fields the schema does not list.")},
    )


def run(spec: dict, step_input: dict, ctx: ExecContext) -> Result:
    """One attempt of an agent step. Raises StepError (a SpentStepError once tokens are spent)."""
    system, prompt = render_prompts(spec, step_input)
    talk = Conversation.start(spec, price=ctx.price)
    contract = contract_of(spec)
    # A deterministic provider (scripted) would give the same reply again: no repair.
    bound = 0 if talk.provider.deterministic else int(
        spec.get("repair_attempts", DEFAULT_REPAIR_ATTEMPTS))
    talk.meta = {
        "prompt_hash": prompt_hash(spec),
        "schema_hash": digest_of(contract) if contract is not None else "",
        "model_params": {"temperature": spec.get("temperature"),
                         "max_tokens": spec.get("max_tokens"), "repair_attempts": bound,
                         "structured_output": talk.config.get("structured_output")},
        "repair_count": 0,
    }
    request = ModelRequest(
        model=talk.model_name(), prompt=prompt, system=system, output_schema=contract,
        temperature=spec.get("temperature"), max_tokens=spec.get("max_tokens"),
        script=spec.get("script") or [], context=step_input,
        fixture_key=f"{ctx.workflow}.{ctx.step_name}",
    )
    messages: list[dict] = []
    for repair in range(bound + 1):
        talk.meta["repair_count"] = repair
        if repair and ctx.reserve_call:
            # Budgets: a repair turn is reserved like an attempt before it is made.
            try:
                ctx.reserve_call(repair)
            except StepError as error:
                raise talk.failed(error) from error
        # Audit: the entry authorizing this model call is committed before the call is made,
        # so a worker that dies during the call leaves the evidence (audit.services).
        ctx.authorize(ctx=ctx, spec=spec, step_input=step_input, kind="model",
                      target=f"{talk.provider.name}:{talk.model_name()}",
                      request={"system": system, "prompt": prompt, "repair": repair})
        reply = talk.ask(replace(request, messages=tuple(messages)))
        if ctx.settle_call:
            ctx.settle_call(repair, talk.last_cost_usd)
        problems, value = problems_of(spec, reply)
        if not problems:
            return talk.result(_output(spec, value, step_input, repair, talk))
        if repair < bound:
            messages.extend(repair_turns(reply, problems))
    detail = "; ".join(problems[:MAX_PROBLEMS_SHOWN])
    raise talk.failed(StepError(
        "invalid_output", f"the reply failed validation after {bound} repair(s): {detail}"))


def _output(spec: dict, value: object, step_input: dict, repairs: int, talk: Conversation):
    if not spec.get("proposal"):
        return value
    digest = proposal_hash(value)
    risk = assess(declaration=spec["proposal"], proposal=value, step_input=step_input,
                  repairs=repairs)
    talk.meta.update(proposal_hash=digest, risk_tier=risk.tier)
    return {"proposal": value, "proposal_hash": digest, "risk": risk.as_dict()}
