"""The release gate: no version is published that does worse where it matters.

A workflow's `ReleasePolicy` (set by an owner: `workflow.policy`) names a dataset and thresholds
per risk tier (`scoring.POLICY_SCHEMA`). Publishing a version then needs a completed evaluation of
exactly that version over the dataset's latest version whose summary meets every threshold, and,
where a tier limits regression, an evaluation of the published version over the same cases to
compare with. The engine asks `release_problems` before it publishes (settings.
STEPWISE_PUBLISH_CHECKS): anyone but an owner is refused with the failing measures; an owner's
publish goes through as an override, audited with them (orchestrator.engine.services.workflows).
"""
from django.db import transaction

from audit.services import audit_record
from orchestrator.engine.authz import Action, Actor, label, person, require
from orchestrator.engine.clock import now
from orchestrator.engine.errors import InputInvalid
from orchestrator.models import Workflow, WorkflowVersion

from .models import Dataset, Evaluation, EvaluationState, ReleasePolicy
from .policy import gate_check, policy_problems


def release_policy_set(*, workflow: Workflow, dataset: Dataset | None, thresholds: dict | None,
                       actor: Actor) -> ReleasePolicy | None:
    """Set (or with `dataset` None, remove) the workflow's release policy. Audited.

    Raises Forbidden without workflow.policy (owners), InputInvalid for a dataset of another
    workflow or thresholds the policy schema refuses (each problem at its path)."""
    require(actor, Action.WORKFLOW_POLICY, team=workflow.team)
    with transaction.atomic():
        current = ReleasePolicy.objects.select_for_update().filter(workflow=workflow).first()
        if dataset is None:
            if current is not None:
                current.delete()
                _audit(workflow, actor, "removed", {})
            return None
        problems = []
        if dataset.workflow_id != workflow.id:
            problems.append({"path": "dataset", "message": f"dataset '{dataset.name}' is not one of "
                             f"workflow '{workflow.name}'"})
        problems += policy_problems(thresholds, definition=workflow.active_version.normalized
                                    if workflow.active_version else None, at=("thresholds",))
        if problems:
            raise InputInvalid("the release policy is invalid", problems)
        policy = current or ReleasePolicy(workflow=workflow)
        policy.dataset, policy.thresholds = dataset, thresholds
        policy.updated_by, policy.updated_at = person(actor), now()
        policy.save()
        _audit(workflow, actor, "changed" if current else "set", {"dataset": dataset.name, "thresholds": thresholds})
    return policy


def release_problems(*, workflow: Workflow, version: WorkflowVersion) -> list[dict]:
    """Why `version` may not be published under the workflow's release policy, each as
    {"path", "message"}; none when it may (or there is no policy)."""
    policy = ReleasePolicy.objects.select_related("dataset").filter(workflow=workflow).first()
    if policy is None:
        return []
    cases = policy.dataset.latest_version
    evaluation = passing_candidate(version, cases)
    where = f"dataset '{policy.dataset.name}' version {cases.number}"
    if evaluation is None:
        return [{"path": "release_gate.evaluation", "message": f"version {version.number} has no completed "
                 f"evaluation over {where}: evaluate it first"}]
    active = workflow.active_version
    baseline = None
    if active is not None and active.id != version.id and _limits_regression(policy.thresholds):
        baseline = passing_candidate(active, cases)
        if baseline is None:
            return [{"path": "release_gate.baseline", "message": f"the published version {active.number} has no "
                     f"completed evaluation over {where} to compare with: evaluate it too"}]
    failures = gate_check(evaluation.summary or {}, policy.thresholds,
                          baseline_summary=baseline.summary if baseline else None)
    return [{"path": f"release_gate.{f['tier']}.{f['metric']}",
             "message": f"{f['message']} (evaluation {evaluation.id})"} for f in failures]


def passing_candidate(version: WorkflowVersion, cases) -> Evaluation | None:
    """The latest completed evaluation of `version` over the dataset version `cases`."""
    return (Evaluation.objects.filter(version=version, dataset_version=cases, state=EvaluationState.COMPLETED)
            .order_by("-created_at", "-id").first())


def _limits_regression(thresholds: dict) -> bool:
    return any("max_regression" in limits for limits in (thresholds.get("tiers") or {}).values())


def _audit(workflow: Workflow, actor: Actor, outcome: str, payload: dict) -> None:
    audit_record(action="workflow.release_policy", outcome=outcome, actor=label(actor),
                 subject_type="workflow", subject_id=workflow.id, team=workflow.team.slug,
                 workflow=workflow.name, payload=payload)
