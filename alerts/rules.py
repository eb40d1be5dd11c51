"""The alert rules Stepwise knows, each with its default: on, and a sensible threshold.

Pure (no database): `alerts.services.rule_for` overlays the `AlertRule` rows an operator saved
for a team or a workflow on these defaults. A rule's threshold means what its `unit` says; a
rule without a unit has none.
"""
from dataclasses import dataclass
from enum import StrEnum


class RuleKind(StrEnum):
    RUN_FAILED = "run.failed"
    RUN_PAUSED = "run.paused"
    DEAD_LETTER = "dead_letter.created"
    STEP_RETRIED = "step.retried"
    RUN_STUCK = "run.stuck"
    DEADLINE_AT_RISK = "deadline.at_risk"
    DEADLINE_BREACHED = "deadline.breached"
    BUDGET_WARNING = "budget.warning"
    BUDGET_DENIED = "budget.denied"
    BREAKER_OPENED = "breaker.opened"
    QUEUE_AGE = "queue.age"
    TRIGGER_REFUSED = "trigger.refused"
    ATTESTATION_INVALID = "step.attestation_invalid"


class Severity(StrEnum):
    WARNING = "warning"
    CRITICAL = "critical"


@dataclass(frozen=True)
class Rule:
    kind: RuleKind
    enabled: bool
    threshold: float | None
    severity: Severity
    unit: str = ""
    description: str = ""


DEFAULTS: dict[RuleKind, Rule] = {r.kind: r for r in [
    Rule(RuleKind.RUN_FAILED, True, None, Severity.CRITICAL,
         description="a run failed, timed out or its compensation failed"),
    Rule(RuleKind.RUN_PAUSED, True, None, Severity.WARNING,
         description="a run paused for an operator (a failed step under on_error: pause)"),
    Rule(RuleKind.DEAD_LETTER, True, None, Severity.CRITICAL,
         description="a step's work was dead-lettered"),
    Rule(RuleKind.STEP_RETRIED, True, 3, Severity.WARNING, "attempts",
         description="a step was retried more than this many times"),
    Rule(RuleKind.RUN_STUCK, True, 900, Severity.WARNING, "seconds",
         description="a running run made no progress for this long"),
    Rule(RuleKind.DEADLINE_AT_RISK, True, 0.8, Severity.WARNING, "fraction of the deadline",
         description="a live run used this share of its max_duration_s"),
    Rule(RuleKind.DEADLINE_BREACHED, True, None, Severity.CRITICAL,
         description="a run passed its deadline (max_duration_s)"),
    Rule(RuleKind.BUDGET_WARNING, True, 0.8, Severity.WARNING, "fraction of the budget",
         description="a run spent this share of its max_cost_usd"),
    Rule(RuleKind.BUDGET_DENIED, True, None, Severity.CRITICAL,
         description="the budget gate refused a step and paused the run"),
    Rule(RuleKind.BREAKER_OPENED, True, None, Severity.WARNING,
         description="a step met an open circuit breaker for its model or tool"),
    Rule(RuleKind.QUEUE_AGE, True, 300, Severity.WARNING, "seconds",
         description="a step waited in its queue for longer than this"),
    Rule(RuleKind.TRIGGER_REFUSED, True, None, Severity.WARNING,
         description="a schedule's slot started no run (its input was refused, or its rate, "
                     "quota or budget held it back); once per trigger and reason until the "
                     "trigger is changed"),
    Rule(RuleKind.ATTESTATION_INVALID, True, None, Severity.CRITICAL,
         description="a step's output has no valid attestation (changed after it was produced, "
                     "or signed by an unregistered or revoked key): its run paused for an "
                     "investigation"),
]}
