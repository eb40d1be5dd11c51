"""Reads of evaluation datasets: which a person may see, a version's cases, and the expected
outcome a finished run shows (what an operator corrects before adding the run as a case).

Reads only; who may change a dataset is the services' check.
"""
from django.db.models import Prefetch, QuerySet

from orchestrator.engine.authz import Actor, visible
from orchestrator.engine.selectors import definition_of
from orchestrator.engine.states import RUN_TERMINAL, StepKind, StepState
from orchestrator.models import Run

from .models import Dataset, DatasetVersion


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
