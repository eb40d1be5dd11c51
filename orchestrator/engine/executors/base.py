"""What every executor takes and returns: the execution context, the result, a spent failure.

Kept apart from the executors themselves so they, the step services and the audit ledger share
these types without importing one another.
"""
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal

from ..retry import StepError


@dataclass(frozen=True)
class ExecContext:
    """What an executor is handed by the step service that calls it: the call's identity, and
    the services it may use only through this context (it imports none)."""

    run_id: str
    workflow: str
    step_name: str
    attempt: int
    idempotency_key: str
    step_id: int = 0
    # Performs a side-effecting call through the effect ledger, exactly once per key:
    # `effects(tool=..., call=...) -> output`. The step services provide it; executors never
    # write the ledger themselves.
    effects: Callable[..., object] | None = None
    # Parameters a reviewer changed at the step's approval gate (approvals.binding): they
    # replace the rendered ones before the call is checked against the tool's schema.
    params_override: dict = field(default_factory=dict)
    # Masks the run's secret inputs in what is recorded of the call (secret_inputs.Revealed).
    scrub: Callable[[object], object] = lambda value: value
    # The attempt's fencing token (its claim generation, docs/failure-semantics.md): every
    # write that finishes the attempt is refused once a newer claim exists, and tools pass it
    # to remotes that can refuse a stale writer. 0: unfenced (a compensation, one worker at a
    # time under the run's compensation lease).
    fencing_token: int = 0
    # The run's sandbox (orchestrator/engine/sandbox.py; None: a live run): a side-effecting
    # call is answered from it instead of made (`tool.prepared_call`).
    sandbox: dict | None = None
    # Budgets (docs/budgets.md): `reserve_call(turn)` reserves one more model call of this
    # attempt — its repair turn number `turn` — against every limit before it is made, and
    # raises StepError when it may not be made (class `budget`: the run is paused for it);
    # `settle_call(turn, cost_usd)` records what a call cost once it returned. The step
    # services provide them; None: nothing is reserved (a direct call in a test).
    reserve_call: Callable[[int], None] | None = None
    settle_call: Callable[[int, Decimal], None] | None = None
    # `reserved(turn)`: the USD reserved for that call of this attempt (None: none held), which
    # a model route priced above the model's first must fit (executors.agent).
    reserved: Callable[[int], Decimal | None] | None = None
    # The run's team (slug): its egress policy may forbid some of a model's routes.
    team: str = ""
    # Commits the ledger entry that authorizes one tool or model call before it is made:
    # `authorize(ctx=..., spec=..., step_input=..., kind=..., target=..., request=...)`
    # (audit.services.external_call_authorize).
    authorize: Callable[..., object] = field(kw_only=True)
    # What a returned model call cost, at the prices in force when it returned:
    # `price(model_config, tokens_in, tokens_out, model=...) -> USD` (budgets.services.cost_of).
    price: Callable[..., Decimal] = field(kw_only=True)
    # Records what an authorized call answered, for the attempt's attestation:
    # `responded(request=..., response=..., route="", outcome="answered")` — a model call once
    # per route tried (the request as that route was sent it, its reply or its error), a tool
    # call once with what the tool returned. None: nothing is attested (a direct call in a test).
    responded: Callable[..., None] | None = field(default=None, kw_only=True)


@dataclass(frozen=True)
class Result:
    output: object
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: Decimal = Decimal("0")
    model: str = ""
    provider: str = ""
    # What produced the output, for the attempt record: keys are ATTEMPT_META_FIELDS.
    meta: dict = field(default_factory=dict)


# StepAttempt columns an executor's `meta` fills (the step services persist them):
# prompt_hash (SHA-256 of the prompt templates and the contract framing), schema_hash (of the
# schema the reply had to satisfy), model_params (temperature, max_tokens, repair bound...),
# model_id (the model version the provider said answered), proposal_hash, risk_tier,
# repair_count, decision (a router's choice and why); reused_from ({run, step}: the output was
# copied from that earlier step's, nothing was called; services/results_cache.py).
# routes: each model route the attempt's calls tried or skipped, in order (executors.agent).
ATTEMPT_META_FIELDS = ("prompt_hash", "schema_hash", "model_params", "model_id",
                       "proposal_hash", "risk_tier", "repair_count", "decision", "reused_from",
                       "routes")


@dataclass(eq=False)  # like StepError: not frozen, Python sets __traceback__ when re-raising
class SpentStepError(StepError):
    """A failed attempt that still spent tokens (model calls, repairs): they must be charged.

    `spent` carries the usage and meta of the calls made before the failure, so budgets and the
    attempt record see them; it is a StepError, so every caller that handles those still works.
    """

    spent: Result | None = None
