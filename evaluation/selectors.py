"""Reads of evaluation datasets and evaluations: which a person may see, a version's cases, the
expected outcome a finished run shows (what an operator corrects before adding the run as a
case), an evaluation's results so far and two evaluations compared.

Reads only; who may change a dataset or start an evaluation is the services' check.
"""
from django.db.models import Count, Prefetch, Q, QuerySet

from orchestrator.engine.authz import Actor, visible
from orchestrator.engine.selectors import definition_of
from orchestrator.engine.states import RUN_TERMINAL, StepKind, StepState
from orchestrator.models import Run

from .models import CaseRunState, Dataset, DatasetVersion, Evaluation, EvaluationCase, ReleasePolicy
from .summary import compare, summarize


def datasets_visible_to(user: Actor) -> QuerySet[Dataset]:
    """The datasets of the teams `user` may see, each with its team and workflow, and its
    latest version as `latest` (one query for every dataset of a page, not one each)."""
    latest = DatasetVersion.objects.select_related("created_by", "workflow_version").order_by("-number")[:1]
    return visible(Dataset.objects.select_related("team", "workflow"), user).prefetch_related(
        Prefetch("versions", queryset=latest, to_attr="latest_versions"))


def latest_of(dataset: Dataset) -> DatasetVersion:
    """The dataset's latest version: prefetched by `datasets_visible_to`, else read."""
    prefetched = getattr(dataset, "latest_versions", None)
    return prefetched[0] if prefetched else dataset.latest_version


def expected_from_run(run: Run) -> dict:
    """What `run` did, in the expected-outcome shape (docs/evaluation.md): its state, whether
    it asked a person (a human gate waited), and for each completed step the action it proposed (a step with
    `proposal.actions`) or else its output. A human gate gives no step expectation: it is the
    run's `must_be_approved`."""
    definition, _ = definition_of(run)
    specs = {spec["name"]: spec for spec in definition["steps"]}
    steps, asked = {}, False
    for step in run.steps.order_by("position", "id"):
        spec = specs.get(step.name)
        if spec is None:
            continue  # an iteration of a loop's body: not a step the definition names
        if step.kind == StepKind.HUMAN_GATE:
            # A gate that started waited for a person (whatever came of it); a skipped one never did.
            asked = asked or step.started_at is not None
            continue
        if step.state != StepState.COMPLETED or step.output is None:
            continue
        proposal = step.output.get("proposal") if isinstance(step.output, dict) else None
        if spec.get("proposal") and isinstance(proposal, dict):
            steps[step.name] = {"action": {"name": proposal.get("action_type"), "params": proposal.get("params", {})}}
        else:
            steps[step.name] = {"output": step.output}
    expected: dict = {"run": {"state": run.state, "must_be_approved": asked}}
    if steps:
        expected["steps"] = steps
    return expected


def outcome_of_run(run: Run) -> dict:
    """What an evaluation's run did, in the shape its scorers read (`evaluation.scoring`): the
    run's state, latency and cost, each step's output, proposed action and evidence, whether a
    human gate would have asked a person and what it decided, the side-effecting calls the run
    made (sandboxed: `step.sandboxed` events) and whether a gate had approved before each, and
    the workflow-level measures."""
    definition, _ = definition_of(run)
    specs = {spec["name"]: spec for spec in definition["steps"]}
    steps, gates, rejections = {}, {}, 0
    rows = list(run.steps.order_by("position", "id"))
    for step in rows:
        spec = specs.get(step.name)
        if spec is None:
            continue  # an iteration of a loop's body
        if step.kind == StepKind.HUMAN_GATE:
            asked = step.started_at is not None
            decision = {StepState.COMPLETED: "approve", StepState.FAILED: "reject"}.get(step.state) if asked else None
            gates[step.name] = {"asked": asked, "decision": decision}
            rejections += decision == "reject"
            continue
        output = step.output if step.state == StepState.COMPLETED else None
        proposal = output.get("proposal") if isinstance(output, dict) else None
        entry = {"state": step.state, "output": output, "action": None, "abstained": False, "evidence": []}
        if spec.get("proposal"):
            if isinstance(proposal, dict) and proposal.get("action_type"):
                entry["action"] = {"name": proposal["action_type"], "params": proposal.get("params", {})}
                entry["evidence"] = list(proposal.get("evidence") or [])
            else:
                entry["abstained"] = step.state == StepState.COMPLETED
        steps[step.name] = entry
    effects = _effects_of(run, rows)
    ended = run.finished_at or run.progressed_at
    latency = (ended - run.started_at).total_seconds() if run.started_at and ended else None
    return {
        "run": {"state": run.state, "asked": any(g["asked"] for g in gates.values()),
                "latency_s": latency, "cost_usd": float(run.cost_usd),
                "tokens": run.tokens_in + run.tokens_out},
        "steps": steps,
        "gates": gates,
        "effects": effects,
        "measures": {"rejections": rejections,
                     "compensations": run.events.filter(kind="run.compensating").count(),
                     "duplicates_prevented": run.events.filter(kind="effect.replayed").count(),
                     "stuck": run.state not in RUN_TERMINAL},
    }


def _effects_of(run: Run, rows: list) -> list[dict]:
    """The side-effecting calls of `run` (its `step.sandboxed` events), each approved when a
    human gate of the run completed before the call's step started."""
    approved_at = sorted(s.finished_at for s in rows
                         if s.kind == StepKind.HUMAN_GATE and s.state == StepState.COMPLETED and s.finished_at)
    by_id = {s.id: s for s in rows}
    effects = []
    for event in run.events.filter(kind="step.sandboxed").order_by("id"):
        step = by_id.get(event.step_id)
        started = step.started_at if step else event.created_at
        effects.append({"step": step.name if step else "", "tool": event.payload.get("tool", ""),
                        "params": event.payload.get("params", {}),
                        "approved": any(at <= (started or event.created_at) for at in approved_at)})
    return effects


RISK_TIERS = {"low": "low", "medium": "medium", "high": "high", "critical": "high"}


def risk_tier_of(run: Run) -> str:
    """The evaluation tier of a live run: the highest risk Stepwise gave one of its proposals
    (critical counts as high), else low."""
    order = ["low", "medium", "high"]
    tiers = [RISK_TIERS.get(((output or {}).get("risk") or {}).get("tier"), "low")
             for output in run.steps.filter(state=StepState.COMPLETED).values_list("output", flat=True)
             if isinstance(output, dict) and isinstance(output.get("risk"), dict)]
    return max(tiers, key=order.index, default="low")


# --- evaluations ---------------------------------------------------------------------------------


def evaluations_visible_to(user: Actor) -> QuerySet[Evaluation]:
    """The evaluations of the teams `user` may see, with what a list shows of each: its workflow,
    version and dataset version, and how many of its cases there are (`case_total`), were
    scored (`case_scored`) and passed (`case_passed`), counted in the same query."""
    return visible(Evaluation.objects.select_related(
        "team", "workflow", "version", "baseline", "dataset_version__dataset", "created_by"), user).annotate(
        case_total=Count("cases"),
        case_scored=Count("cases", filter=Q(cases__state=CaseRunState.SCORED)),
        case_passed=Count("cases", filter=Q(cases__passed=True)))


def pass_rate(evaluation: Evaluation) -> float | None:
    """The share of its scored cases that passed (None before one is scored); needs the counts
    `evaluations_visible_to` annotates."""
    return evaluation.case_passed / evaluation.case_scored if evaluation.case_scored else None


def cases_by_state(evaluation: Evaluation) -> dict[str, int]:
    """How many of its cases are in each state, every state named (0 when none)."""
    counts = dict(evaluation.cases.order_by().values("state").annotate(n=Count("id")).values_list("state", "n"))
    return {state: counts.get(state, 0) for state in CaseRunState.values}


def scored_results(evaluation: Evaluation) -> list[dict]:
    """Its scored cases in the shape `scoring.summarize` and `scoring.compare` read."""
    rows = evaluation.cases.filter(state=CaseRunState.SCORED).order_by("key").values(
        "key", "risk_tier", "scores", "passed")
    return [{"case": r["key"], "risk_tier": r["risk_tier"], "scores": r["scores"] or {},
             "passed": bool(r["passed"])} for r in rows]


def results_of(evaluation: Evaluation) -> dict | None:
    """Its results by risk tier: the summary written when it ended, or while it runs the same
    summary over the cases scored so far (None before the first is scored)."""
    if evaluation.is_finished:
        return evaluation.summary
    results = scored_results(evaluation)
    return summarize(results) if results else None


def comparison(base: Evaluation, new: Evaluation) -> dict:
    """`scoring.compare` over the scored cases of two evaluations of the same dataset version:
    the cases that changed outcome and each tier's metrics side by side."""
    return compare(scored_results(base), scored_results(new))


def comparable_with(evaluation: Evaluation, user: Actor) -> QuerySet[Evaluation]:
    """The other evaluations `user` sees over the same dataset version, newest first (none for a
    shadow: its cases are live runs, its comparison the published version's runs themselves)."""
    if evaluation.dataset_version_id is None:
        return Evaluation.objects.none()
    return evaluations_visible_to(user).filter(dataset_version=evaluation.dataset_version).exclude(
        pk=evaluation.pk).order_by("-created_at", "-id")


def release_policy_of(workflow) -> ReleasePolicy | None:
    return ReleasePolicy.objects.select_related("dataset", "updated_by").filter(workflow=workflow).first()


def cases_of(evaluation: Evaluation) -> QuerySet[EvaluationCase]:
    return evaluation.cases.select_related("run").order_by("key")
