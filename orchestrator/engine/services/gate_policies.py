"""Mandatory gate policies: owners name the actions (a tool or glob, optionally a target) that
every version of a team's workflows, or of one workflow, must put behind a satisfying human
gate; and the one check of a version against them.

Setting or removing a policy needs workflow.policy (owners) and is a ledger entry. The check,
`version_gate_problems`, is what publishing (`services.workflows`), starting a version
(`services.runs.version_start_refusal`, which every start path passes: the API, the builder,
triggers, child runs) and the reaction to each refuse on; an owner's waiver is recorded on the
version (`gates_waived`) when the owner publishes it. The rules themselves are pure:
`definitions.mandatory_gates`.
"""
from django.db import transaction
from django.db.models import Q

from audit.services import audit_record
from orchestrator.integrations.tools.registry import all_tools
from orchestrator.models import GatePolicy, Team, Workflow, WorkflowVersion

from ..authz import Action, Actor, label, person, require
from ..definitions import Problem
from ..definitions.format import RISK_TIERS
from ..definitions.mandatory_gates import ActionRule, unguarded_actions
from ..errors import InputInvalid, NotAllowed


def url_params(tool: str) -> tuple[str, ...]:
    """The URL params of a registered tool (none for an unknown one)."""
    found = all_tools().get(tool)
    return found.url_params if found else ()


def gate_rules(*, team_id: int, workflow_id: int | None) -> list[ActionRule]:
    """The rules in force for a workflow: its team's policies and its own."""
    policies = GatePolicy.objects.filter(Q(workflow__isnull=True) | Q(workflow_id=workflow_id),
                                         team_id=team_id)
    return [ActionRule(tool=p.tool, target=p.target, approvers=p.approvers,
                       required_approvals=p.required_approvals,
                       self_approval_up_to=p.self_approval_up_to,
                       label=f"gate policy {p.id}") for p in policies]


def definition_gate_problems(definition: dict, *, team_id: int, workflow_id: int | None
                             ) -> list[Problem]:
    """Where `definition` performs an action a policy of its team or workflow guards without
    surely waiting for a gate that satisfies it."""
    rules = gate_rules(team_id=team_id, workflow_id=workflow_id)
    return unguarded_actions(definition, rules, url_params) if rules else []


def version_gate_problems(version: WorkflowVersion) -> list[Problem]:
    """The policy problems of `version` that no owner waived for it.

    For the published version they are read from its workflow (`gates_unguarded`, kept by the
    services that change policies or publish), so a run of it costs no query for policies."""
    workflow = version.workflow
    if workflow.active_version_id == version.id:
        return [Problem(p["path"], p["message"]) for p in workflow.gates_unguarded or []]
    return _unwaived(version)


def _unwaived(version: WorkflowVersion) -> list[Problem]:
    workflow = version.workflow
    problems = definition_gate_problems(version.normalized, team_id=workflow.team_id,
                                        workflow_id=workflow.id)
    waived = {(w.get("path"), w.get("message")) for w in version.gates_waived or []}
    return [p for p in problems if (p.path, p.message) not in waived]


def gate_policy_create(*, team: Team, actor: Actor, tool: str, target: str = "",
                       approvers: str = "", required_approvals: int = 1,
                       self_approval_up_to: str = "", workflow: Workflow | None = None) -> GatePolicy:
    """Guard calls of `tool` (a name or glob) on `target` (a glob; empty: any) in the team's
    workflows, or in `workflow` only. Audited; the response's caller can list the published
    versions it finds unguarded with `published_gate_problems`. Raises Forbidden without
    workflow.policy in `team`, InputInvalid for an empty tool, a workflow of another team or
    a value out of range."""
    require(actor, Action.WORKFLOW_POLICY, team=team)
    problems = []
    if not isinstance(tool, str) or not tool.strip():
        problems.append({"path": "tool", "message": "name a tool or a glob (email.send, payments.*)"})
    if workflow is not None and workflow.team_id != team.id:
        problems.append({"path": "workflow", "message": "the workflow belongs to another team"})
    if not isinstance(required_approvals, int) or not 1 <= required_approvals <= 10:
        problems.append({"path": "required_approvals", "message": "a number from 1 to 10"})
    if self_approval_up_to and self_approval_up_to not in RISK_TIERS:
        problems.append({"path": "self_approval_up_to", "message": f"one of {', '.join(RISK_TIERS)}"})
    if problems:
        raise InputInvalid("the gate policy is invalid", problems)
    with transaction.atomic():
        policy = GatePolicy.objects.create(
            team=team, workflow=workflow, tool=tool.strip(), target=target.strip(),
            approvers=approvers.strip(), required_approvals=required_approvals,
            self_approval_up_to=self_approval_up_to, created_by=person(actor))
        audit_record(action="gate_policy.created", outcome="created", actor=label(actor),
                     subject_type="gate_policy", subject_id=policy.id, team=team.slug,
                     workflow=workflow.name if workflow else "", payload=_described(policy))
        _refresh_published(team.id, workflow.id if workflow else None)
    return policy


def gate_policy_delete(*, policy_id: int, actor: Actor) -> None:
    """Remove a policy. Audited. Raises Forbidden without workflow.policy in its team,
    NotAllowed when there is no such policy."""
    with transaction.atomic():
        policy = GatePolicy.objects.select_for_update(of=("self",)).select_related("team", "workflow").filter(
            pk=policy_id).first()
        if policy is None:
            raise NotAllowed(f"no gate policy {policy_id}")
        require(actor, Action.WORKFLOW_POLICY, team=policy.team)
        audit_record(action="gate_policy.deleted", outcome="deleted", actor=label(actor),
                     subject_type="gate_policy", subject_id=policy.id, team=policy.team.slug,
                     workflow=policy.workflow.name if policy.workflow_id else "",
                     payload=_described(policy))
        policy.delete()
        _refresh_published(policy.team_id, policy.workflow_id)


def published_gate_problems(policy: GatePolicy) -> dict[str, list[dict]]:
    """The published versions of the policy's scope that the policies find unguarded
    (workflow name -> problems): runs of them are refused until an owner publishes them again,
    waiving, or a fixed version."""
    return {w.name: w.gates_unguarded for w in _scope(policy.team_id, policy.workflow_id)
            if w.gates_unguarded}


def _scope(team_id: int, workflow_id: int | None):
    workflows = Workflow.objects.filter(team_id=team_id, active_version__isnull=False)
    return workflows.filter(pk=workflow_id) if workflow_id else workflows


def _refresh_published(team_id: int, workflow_id: int | None) -> None:
    """Record on each workflow of the scope what the policies now in force find unguarded in
    its published version (in the caller's transaction)."""
    for workflow in _scope(team_id, workflow_id).select_for_update(of=("self",)).select_related("active_version"):
        found = [{"path": p.path, "message": p.message} for p in _unwaived(workflow.active_version)]
        if found != workflow.gates_unguarded:
            workflow.gates_unguarded = found
            workflow.save(update_fields=["gates_unguarded"])


def _described(policy: GatePolicy) -> dict:
    return {"tool": policy.tool, "target": policy.target, "approvers": policy.approvers,
            "required_approvals": policy.required_approvals,
            "self_approval_up_to": policy.self_approval_up_to,
            "scope": f"workflow {policy.workflow.name}" if policy.workflow_id else "team"}
