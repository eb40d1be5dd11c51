"""The soak's invariants: what every run, effect, ledger and budget must look like at the end.

`collect` reads the database once everything has settled; `violations` is pure over what was
collected, so a test can hand it a deliberate fault (a duplicate effect) and see it caught.
"""
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal

from approvals.models import ApprovalRequest
from audit.chain import verify_ledger
from orchestrator.models import Effect, Event, Run, StepAttempt, StepRun

from .workload import BUDGET_USD, Started

OPEN_STEPS = ("queued", "running", "retrying", "waiting")


@dataclass
class RunFacts:
    order: str
    kind: str
    expected: str
    state: str | None  # None: no run exists for this order
    runs_for_order: int = 1
    keys: dict[str, int] = field(default_factory=dict)  # effect key -> effects the remote must show
    resent_after_lost: Counter = field(default_factory=Counter)  # key -> lost outcomes resent
    open_steps: int = 0
    open_effects: int = 0
    cost: Decimal = Decimal("0")
    attempts_cost: Decimal = Decimal("0")
    budget: Decimal | None = None
    decision: str = ""  # the reviewer's plan: approve | reject
    approval: str = ""  # the approval request's state
    gated_before_decision: bool = False  # the gated effect started before the approval


@dataclass
class Observed:
    runs: list[RunFacts]
    effects: Counter  # at the remote: key -> effects acted on (de-duplicated by key)
    answered_ok: Counter  # at the remote: key -> successful requests, repeats included
    audit_ok: bool = True
    audit_detail: str = ""


def expected_keys(started: Started, run_id: str, child_id: str | None) -> dict[str, int]:
    k = f"{run_id}:{{}}"
    if started.kind == "chain":
        return {k.format("pay:default"): 1, k.format("notify:default"): 1}
    if started.kind == "gate":
        return {k.format("send:default"): int(started.decision == "approve")}
    if started.kind == "saga":
        refunded = int(started.refund == "refund")
        return {k.format("hold:default"): 1, k.format("pay:default"): 1, k.format("ship:default"): 0,
                k.format("pay:compensate"): refunded, k.format("hold:compensate"): refunded}
    if started.kind == "parent":
        return {f"{child_id}:charge:default": 1} if child_id else {}
    return {}


def collect(planned: list[Started], effects: Counter, answered_ok: Counter) -> Observed:
    facts = []
    for started in planned:
        runs = list(Run.objects.filter(idempotency_key=started.order).values_list("id", "state"))
        if not runs:
            facts.append(RunFacts(started.order, started.kind, started.expected, None, 0))
            continue
        run_id, state = runs[0]
        child = Run.objects.filter(parent_step__run_id=run_id).values_list("id", flat=True).first()
        run_ids = [run_id] + ([child] if child else [])
        fact = RunFacts(started.order, started.kind, started.expected, state, len(runs),
                        keys=expected_keys(started, str(run_id), str(child) if child else None),
                        decision=started.decision)
        for payload in Event.objects.filter(run_id__in=run_ids, kind="effect.reconciled").values_list(
                "payload", flat=True):
            if payload.get("found") is not True:
                fact.resent_after_lost[payload["key"]] += 1
        fact.open_steps = StepRun.objects.filter(run_id__in=run_ids, state__in=OPEN_STEPS).count()
        fact.open_effects = Effect.objects.filter(run_id__in=run_ids, status="started").count()
        if started.kind == "budget":
            run = Run.objects.get(id=run_id)
            fact.cost, fact.budget = run.cost_usd, Decimal(BUDGET_USD)
            fact.attempts_cost = sum(StepAttempt.objects.filter(
                step__run_id=run_id, outcome__in=("succeeded", "failed")).values_list("cost_usd", flat=True),
                Decimal("0"))
        if started.kind == "gate":
            approval = ApprovalRequest.objects.filter(run_id=run_id).first()
            fact.approval = approval.state if approval else ""
            sent = Effect.objects.filter(key=f"{run_id}:send:default").first()
            fact.gated_before_decision = bool(sent and (approval is None or approval.decided_at is None
                                                        or sent.started_at < approval.decided_at))
        facts.append(fact)
    report = verify_ledger()
    return Observed(facts, effects, answered_ok, audit_ok=report.ok,
                    audit_detail="" if report.ok else str(report.broken))


def violations(observed: Observed) -> list[str]:
    """Every broken invariant, one line each (empty: none)."""
    found = []
    expected_anywhere = set()
    for run in observed.runs:
        where = f"{run.kind} {run.order}"
        if run.state is None:
            found.append(f"{where}: lost — no run exists")
            continue
        if run.runs_for_order != 1:
            found.append(f"{where}: {run.runs_for_order} runs for one start")
        if run.state != run.expected:
            found.append(f"{where}: ended {run.state}, expected {run.expected}")
        if run.open_steps or run.open_effects:
            found.append(f"{where}: stuck — {run.open_steps} open steps, {run.open_effects} effects "
                         "left started")
        for key, count in run.keys.items():
            expected_anywhere.add(key)
            if observed.effects[key] != count:
                found.append(f"{where}: effect {key} happened {observed.effects[key]} times, "
                             f"expected {count}")
            allowed = count + run.resent_after_lost[key]
            if observed.answered_ok[key] > max(allowed, count):
                found.append(f"{where}: {key} was acted on {observed.answered_ok[key]} times by "
                             f"the remote, {run.resent_after_lost[key]} lost outcomes explain {allowed}")
        if run.budget is not None:
            if run.cost > run.budget:
                found.append(f"{where}: cost {run.cost} over the budget {run.budget}")
            if run.cost != run.attempts_cost:
                found.append(f"{where}: charged {run.cost}, its finishing attempts cost "
                             f"{run.attempts_cost} (a stale attempt charged?)")
        if run.kind == "gate":
            wanted = {"approve": "approved", "reject": "rejected"}[run.decision]
            if run.approval != wanted:
                found.append(f"{where}: approval is {run.approval or 'missing'}, the reviewer "
                             f"chose {run.decision}")
            if run.gated_before_decision:
                found.append(f"{where}: the gated effect started before the approval")
    for key, count in observed.effects.items():
        if count and key not in expected_anywhere:
            found.append(f"effect {key} happened {count} times, but no run expects it")
    if not observed.audit_ok:
        found.append(f"audit ledger does not verify: {observed.audit_detail}")
    return found
