"""The check right before a guarded action runs: is its approval still good for exactly it?

A worker claiming a step that a human gate guards (a worker step listing a completed gate in
its `after`) calls `guarded_step_clearance` in the claim's transaction. The approval must still
be approved (not revoked), enough of its approvers must still hold the authority they approved
with (`authority.approval_lapse`), and the action the step is about to perform must hash to the
approved hash (`actions.action_drift`). Any of these failing refuses the step: it fails with
class `policy` and the action does not run.

For a gate that binds a tool step's call, the parameters reviewers edited are returned as
overrides for the executor. Reads only (the approval row is locked for the claim's
transaction, so a revocation cannot slip between the check and the claim). In a sandboxed run
the sandbox decided (no person's authority can lapse): only the hash is checked.
"""
from dataclasses import dataclass, field

from orchestrator.engine.definitions.gates import STEP
from orchestrator.engine.selectors import definition_of
from orchestrator.engine.states import StepState
from orchestrator.models import Run, StepRun

from .actions import action_drift
from .authority import approval_lapse
from .models import ApprovalRequest, ApprovalState


@dataclass(frozen=True)
class Clearance:
    refusal: str | None = None
    params_override: dict = field(default_factory=dict)


def guarded_step_clearance(*, run: Run, step: StepRun) -> Clearance:
    """Whether `step` (queued, its input loaded) may run now under its gates' approvals."""
    _, graph = definition_of(run)
    gates = [name for name in graph.steps[step.name]["after"]
             if graph.steps[name]["type"] == "human_gate"]
    if not gates:
        return Clearance()
    completed = set(StepRun.objects.filter(run=run, name__in=gates, state=StepState.COMPLETED)
                    .values_list("name", flat=True))
    overrides: dict = {}
    for gate in gates:
        if gate not in completed:
            continue  # skipped (not required) or not approved: the scheduler decided already
        approval = (ApprovalRequest.objects.select_for_update(of=("self",))
                    .select_related("run__team", "run__version", "step")
                    .filter(run=run, step__name=gate).order_by("-id").first())
        if approval is None:
            return Clearance(f"gate '{gate}' completed without an approval request")
        if step.name not in approval.guarded_steps:
            continue
        # A sandboxed run's approval was its sandbox's (approvals.services.
        # approval_request_sandboxed): no person's authority to lapse, the action's hash still
        # checked.
        lapse = (approval_lapse(approval) if run.sandbox is None
                 else None if approval.state == ApprovalState.APPROVED
                 else f"approval {approval.id} is {approval.state}")
        problem = lapse or action_drift(approval, step, gate)
        if problem:
            return Clearance(f"gate '{gate}': {problem}; the action was not run")
        if approval.action_kind == STEP:
            overrides.update(approval.edits)
    return Clearance(params_override=overrides)
