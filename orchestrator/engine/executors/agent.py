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

from orchestrator.integrations.providers import PROVIDERS, ModelReply, ModelRequest, Provider
from orchestrator.integrations.providers.anthropic import DEFAULT_MAX_TOKENS
from orchestrator.integrations.providers.base import estimate_tokens
from orchestrator.integrations.providers.routes import Route, egress_refusal, routes_for

from .. import limits
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
# Failures that move a call on to the model's next route; any other (auth, a bad request, a
# reply over its size cap) fails it. An invalid reply is not a failure here: repair's job.
FALL_THROUGH = limits.TRANSIENT


@dataclass
class Conversation:
    """The calls of one attempt: usage summed over them, the attempt's deadline, and the
    model's routes (`providers.routes`) tried in order for each call."""

    routes: list[Route]
    spec: dict
    deadline: float
    # The price of a returned call (`ExecContext.price`).
    price: Callable[..., Decimal]
    team: str = ""
    # The amount reserved for a call of this attempt (`ExecContext.reserved`; None: unknown).
    reserved: Callable[[int], Decimal | None] | None = None
    # Masks the run's secret inputs in what is recorded of a route's error (`ExecContext.scrub`).
    scrub: Callable[[object], object] = lambda value: value
    tokens_in: int = 0
    tokens_out: int = 0
    # Each call priced when it returned (a price change mid-attempt does not reprice it).
    cost_usd: Decimal = Decimal(0)
    last_cost_usd: Decimal = Decimal(0)
    model_id: str = ""
    meta: dict = field(default_factory=dict)
    # The route that answered last: a repair turn goes to it first.
    answering: int = 0
    # Every route tried or skipped, for the attempt record (StepAttempt.routes).
    route_log: list[dict] = field(default_factory=list)
    turn: int = 0
    # What each route tried answered, for the attempt's attestation (`ExecContext.responded`).
    responded: Callable[..., None] | None = None

    @classmethod
    def start(cls, spec: dict, *, price: Callable[..., Decimal], team: str = "",
              reserved: Callable[[int], Decimal | None] | None = None,
              scrub: Callable[[object], object] | None = None,
              responded: Callable[..., None] | None = None) -> "Conversation":
        try:
            routes = routes_for(spec["model"], PROVIDERS)
        except KeyError:
            raise StepError("permanent", f"model {spec['model']!r} or its provider is not "
                            "registered on this worker") from None
        deadline = time.monotonic() + float(spec.get("timeout_s") or 300)
        return cls(routes, spec, deadline, price, team, reserved, scrub or (lambda value: value),
                   responded=responded)

    @property
    def provider(self) -> Provider:
        return self.routes[self.answering].provider

    @property
    def config(self) -> dict:
        return self.routes[self.answering].config

    def ask(self, request: ModelRequest) -> ModelReply:
        """The first reply a route gives, trying the routes in order (the last answering one
        first). A route is skipped without a call when the team may not reach it, its breaker
        is open, or a price above the first route's would not fit the call's reservation; a
        transient failure (5xx, timeout, 429) moves on to the next. Any other failure, or the
        last route's, fails the call. Raises SpentStepError."""
        order = self.routes[self.answering:] + self.routes[:self.answering]
        last: StepError | None = None
        skipped: list[str] = []
        for route in order:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                last = StepError("timeout", "the step's timeout passed between model calls")
                break
            reason = self.skip_reason(route, request)
            if reason:
                self.log(route, outcome="skipped", error=reason)
                skipped.append(f"{route.name}: {reason}")
                continue
            # A plain entry's one route is the model: the worker's breaker of the model guards it.
            reading = limits.breaker_read(route.dependency) if route.routed else None
            if reading and reading.open_for:
                reason = f"breaker open for {reading.open_for:.0f}s"
                self.log(route, outcome="skipped", error_class="breaker_open", error=reason)
                skipped.append(f"{route.name}: {reason}")
                last = StepError("transient", f"circuit open for {route.dependency}",
                                 retry_after_s=reading.open_for)
                continue
            started = time.monotonic()
            sent = replace(request, model=route.model_id, timeout_s=remaining)
            try:
                reply = route.provider.complete(sent)
            except StepError as error:
                self.attest(route, sent, {"error_class": error.error_class, "error": error.message},
                            outcome="failed")
                if reading:
                    limits.breaker_record(route.dependency, error_class=error.error_class)
                self.log(route, outcome="failed", error_class=error.error_class,
                         error=error.message, started=started)
                if error.error_class not in FALL_THROUGH:
                    raise self.failed(error) from error
                last = error
                continue
            self.attest(route, sent, {"raw": reply.raw, "model_id": reply.model_id,
                                      "tokens_in": reply.tokens_in, "tokens_out": reply.tokens_out},
                        outcome="answered")
            if reading:
                limits.breaker_record(route.dependency, error_class=None, reading=reading)
            return self.answered(route, reply, started)
        # No route was called: the first is refused by the team's egress policy, and so is every
        # other (or it costs more than the reservation allows). A retry would not change that.
        if last is None:
            last = StepError("policy", "no route of model "
                             f"{self.spec['model']!r} may be called: " + "; ".join(skipped))
        raise self.failed(last)

    def attest(self, route: Route, sent: ModelRequest, response: dict, *, outcome: str) -> None:
        """Hand what `route` was sent and what it answered (`ExecContext.responded`); the
        request without its timeout, which is the time left, not what was asked."""
        if self.responded is None:
            return
        request = {"provider": route.provider.name, "model": sent.model, "system": sent.system,
                   "prompt": sent.prompt, "messages": list(sent.messages),
                   "output_schema": sent.output_schema, "temperature": sent.temperature,
                   "max_tokens": sent.max_tokens}
        self.responded(request=request, response=response, route=route.name, outcome=outcome)

    def skip_reason(self, route: Route, request: ModelRequest) -> str:
        """Why `route` is not called for `request` ("" when it may be)."""
        refusal = egress_refusal(route, self.team)
        if refusal:
            return refusal
        if route.index == 0 or not self.reserved:
            return ""
        first_in, first_out = self.routes[0].prices()
        price_in, price_out = route.prices()
        if price_in <= first_in and price_out <= first_out:
            return ""
        reserved = self.reserved(self.turn)
        if reserved is None:
            return ""
        tokens_in = estimate_tokens(request.system + request.prompt + "".join(
            m["content"] for m in request.messages))
        tokens_out = int(request.max_tokens or route.config.get("max_tokens") or DEFAULT_MAX_TOKENS)
        projected = self.price(route.config, tokens_in, tokens_out, model=route.price_model)
        if projected > reserved:
            return (f"its price projects ${projected:.6f} for this call, more than the "
                    f"${reserved:.6f} reserved")
        return ""

    def answered(self, route: Route, reply: ModelReply, started: float) -> ModelReply:
        self.answering = route.index
        self.tokens_in += reply.tokens_in
        self.tokens_out += reply.tokens_out
        self.last_cost_usd = self.price(route.config, reply.tokens_in, reply.tokens_out,
                                        model=route.price_model)
        self.cost_usd += self.last_cost_usd
        self.model_id = reply.model_id or self.model_id
        self.log(route, outcome="answered", started=started, tokens_in=reply.tokens_in,
                 tokens_out=reply.tokens_out, cost_usd=self.last_cost_usd,
                 model_id=reply.model_id or route.model_id)
        return reply

    def log(self, route: Route, *, outcome: str, error_class: str = "", error: str = "",
            started: float | None = None, tokens_in: int = 0, tokens_out: int = 0,
            cost_usd: Decimal = Decimal(0), model_id: str = "") -> None:
        self.route_log.append({
            "turn": self.turn, "route": route.name, "index": route.index,
            "provider": route.provider.name, "model_id": model_id or route.model_id,
            "outcome": outcome, "error_class": error_class, "error": str(self.scrub(error))[:300],
            "tokens_in": tokens_in, "tokens_out": tokens_out, "cost_usd": str(cost_usd),
            "duration_ms": round((time.monotonic() - started) * 1000) if started else 0,
        })

    def result(self, output: object) -> Result:
        meta = {**self.meta, "model_id": self.model_id or self.model_name()}
        if self.route_log:
            meta["routes"] = list(self.route_log)
        return Result(output, self.tokens_in, self.tokens_out, self.cost_usd, self.spec["model"],
                      self.provider.name, meta)

    def failed(self, error: StepError) -> SpentStepError:
        """`error`, carrying what this attempt spent so far."""
        return SpentStepError(error.error_class, error.message, error.retry_after_s,
                              spent=self.result(None))

    def model_name(self) -> str:
        return self.routes[self.answering].model_id


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
    talk = Conversation.start(spec, price=ctx.price, team=ctx.team, reserved=ctx.reserved,
                              scrub=ctx.scrub, responded=ctx.responded)
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
        talk.meta["repair_count"] = talk.turn = repair
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
