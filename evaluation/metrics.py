"""The names of evaluation metrics and what each means for a verdict: its kind and which way is
better (docs/evaluation-scoring.md).

One table, read by scoring (what a case passed on), the summary (which interval), the
comparison (better or worse) and the release gate (what a policy may name), so the four never
disagree about a metric. A metric is named `<base>` (run level, e.g. `run_state`) or
`<base>:<step>` (per step, e.g. `action:propose`), or `scorer:<name>` for a registered code
scorer. Pure: names in, facts out.
"""
from dataclasses import dataclass

from .scorers import better_of

TIERS = ("low", "medium", "high")  # evaluation.models.RiskTier
OVERALL = "overall"

PROPORTION, COUNT, MEAN = "proportion", "count", "mean"
HIGHER, LOWER, NEUTRAL = "higher", "lower", "neutral"


@dataclass(frozen=True)
class Metric:
    #: proportion: True/False per case; count: a whole number per case; mean: any number.
    kind: str
    #: Which way is better: higher, lower, or neutral (neither: shown, never a regression).
    better: str
    #: Whether it is measured once per step the case has an expectation of (`<base>:<step>`).
    per_step: bool = False
    what: str = ""


METRICS: dict[str, Metric] = {
    # the run
    "run_state": Metric(PROPORTION, HIGHER, what="the run ended in the expected state"),
    "approval_routing": Metric(PROPORTION, HIGHER,
                               what="a human gate asked a person exactly when the case says it must be approved"),
    "unauthorized_actions": Metric(COUNT, LOWER, what="effects the case did not authorize"),
    "review_volume": Metric(COUNT, LOWER, what="human gates that asked a person"),
    "rejections": Metric(COUNT, LOWER, what="decisions that rejected"),
    "compensations": Metric(COUNT, LOWER, what="compensations run"),
    "duplicates_prevented": Metric(COUNT, NEUTRAL, what="repeated effects the effect ledger refused"),
    "stuck": Metric(PROPORTION, LOWER, what="the run was found stuck"),
    "latency_s": Metric(MEAN, LOWER, what="seconds from start to end"),
    "cost_usd": Metric(MEAN, LOWER, what="what the run's model calls cost"),
    "tokens": Metric(MEAN, LOWER, what="tokens the run's model calls used"),
    # each step the case expects something of
    "action": Metric(PROPORTION, HIGHER, True, "the proposed action is the expected one"),
    "action_params": Metric(PROPORTION, HIGHER, True, "the expected action, with the expected params"),
    "labels": Metric(PROPORTION, HIGHER, True, "the step's labels are the expected ones"),
    "output": Metric(PROPORTION, HIGHER, True, "the step's output matches the expected one"),
    "abstention": Metric(PROPORTION, HIGHER, True, "the step abstained exactly when it should"),
    "evidence": Metric(PROPORTION, HIGHER, True, "a proposal the case expects carries evidence"),
    "rubric": Metric(PROPORTION, HIGHER, True, "a model grader scored the output at least the rubric's min_score"),
    "rubric_score": Metric(MEAN, HIGHER, True, "the model grader's score, 0 to 1"),
    # the case
    "passed": Metric(PROPORTION, HIGHER, what="the case passed (scoring.passed)"),
}

#: Families: one value per case over the case's per-step metrics of these bases, so a policy
#: can name `action_accuracy` whatever the steps are called. A proportion family is true when
#: every member is; a mean family is the members' mean.
FAMILIES: dict[str, tuple[str, ...]] = {
    "action_accuracy": ("action", "action_params"),
    "extraction_accuracy": ("output", "labels"),
    "abstention_accuracy": ("abstention",),
    "evidence_present": ("evidence",),
    "rubric_pass": ("rubric",),
    "rubric_mean": ("rubric_score",),
    "scorer_pass": ("scorer",),
}
FAMILY_METRICS = {name: Metric(MEAN if name == "rubric_mean" else PROPORTION, HIGHER,
                               what="every " + " and ".join(f"{base}:*" for base in bases) + " of the case")
                  for name, bases in FAMILIES.items()}

#: What the summary adds: the share of cases that passed.
PASS_RATE = "pass_rate"


def base_of(name: str) -> str:
    """`action` of `action:propose`; a run-level name is its own base."""
    return name.split(":", 1)[0]


def metric_of(name: str, value: object = None) -> Metric:
    """What `name` is. A registered scorer's direction is its registration's; a name this table
    does not know is taken from its value (a bool is a proportion), higher being better."""
    if name == PASS_RATE:
        return METRICS["passed"]
    if name in FAMILY_METRICS:
        return FAMILY_METRICS[name]
    base = base_of(name)
    if base == "scorer":
        kind = PROPORTION if isinstance(value, bool) or value is None else MEAN
        return Metric(kind, better_of(name.split(":", 1)[1]) if ":" in name else HIGHER, True)
    known = METRICS.get(base)
    if known is not None:
        return known
    return Metric(PROPORTION if isinstance(value, bool) else MEAN, HIGHER)


def is_known(name: str) -> bool:
    """Whether a policy may name `name`: a metric of the table (per step when it is one), a
    family, `pass_rate`, or `scorer:<name>`."""
    if name == PASS_RATE or name in FAMILY_METRICS:
        return True
    base, _, step = name.partition(":")
    if base == "scorer":
        return bool(step)
    known = METRICS.get(base)
    return known is not None and known.per_step == bool(step) and base != "passed"
