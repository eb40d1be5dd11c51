"""Workflows and their versions: saving a definition as an immutable version, publishing the
version runs and triggers start, archiving and restoring a workflow.

Each is a permissioned, audited change (docs/permissions.md): saving needs workflow.save,
publishing workflow.publish, archiving workflow.archive, the publish-on-save policy
workflow.policy; making active a version that drops or weakens a mandatory gate
(definitions/mandatory_gates.py), or calls a tool an owner's gate policy guards without a
satisfying gate before it (services/gate_policies.py), needs workflow.waive_gate as well.
"""
from django.conf import settings
from django.db import transaction
from django.utils.module_loading import import_string

from audit.services import audit_record
from orchestrator.integrations.egress import definition_checker
from orchestrator.integrations.tools.checks import definition_checker as connections_checker
from orchestrator.integrations.tools.registry import side_effecting_tools, tool_param_schemas
from orchestrator.models import Team, Workflow, WorkflowVersion

from ..authz import Action, Actor, label, may, person, require
from ..capacity import capacity_problems
from ..clock import now
from ..definitions import DefinitionInvalid, Problem, normalize_definition, validate_definition
from ..definitions.calls import call_cycle, workflow_calls
from ..definitions.mandatory_gates import mandatory_gate_problems, weakened_gates
from ..definitions.problems import format_path
from ..errors import Forbidden, NotAllowed
from ..hashing import digest_of
from ..selectors import version_to_start
from .gate_policies import url_params, version_gate_problems


def definition_problems(definition: object, *, team: Team) -> list[Problem]:
    """Every problem with `definition`, checked against this team's saved workflows, its egress
    policy and the named connections granted to it."""

    def workflows(name: str) -> dict | None:
        version = version_to_start(team=team, name=name)
        return version.normalized["input_schema"] if version else None

    problems = validate_definition(
        definition, tools=tool_param_schemas(), models=settings.STEPWISE_MODELS.keys(),
        workflows=workflows, egress=definition_checker(team=team.slug),
        tool_params=connections_checker(team=team.slug), side_effect_tools=side_effecting_tools(),
    )
    if not problems and "capacity" in definition:
        # The deployment's classes, not the schema's: an operator may add some.
        problems = [Problem(p["path"], p["message"]) for p in capacity_problems(definition["capacity"])]
    if not problems:
        problems = call_cycle_problems(definition, team=team)
    return problems or mandatory_gate_problems(definition)


def release_problems(workflow: Workflow, version: WorkflowVersion) -> list[Problem]:
    """What the publish checks (settings.STEPWISE_PUBLISH_CHECKS: the evaluation app's release
    gate) find against publishing `version`: each failing measure, by path."""
    return [Problem(p["path"], p["message"]) for check in settings.STEPWISE_PUBLISH_CHECKS
            for p in import_string(check)(workflow=workflow, version=version)]


def call_cycle_problems(definition: dict, *, team: Team) -> list[Problem]:
    """A problem at each sub_workflow step through which `definition` would end up calling
    itself, through the published or the latest saved version of each workflow on the way
    (either may run: the published one now, the latest once it is published)."""
    name = definition.get("name")
    calls = workflow_calls(definition)
    if not isinstance(name, str) or not calls:
        return []

    def callees(other: str) -> set[str]:
        workflow = Workflow.objects.filter(team=team, name=other).first()
        if workflow is None:
            return set()
        latest = workflow.versions.order_by("-number").only("normalized").first()
        versions = {v.id: v for v in (workflow.active_version, latest) if v is not None}
        return {called for version in versions.values()
                for _, called in workflow_calls(version.normalized)}

    problems = []
    for parts, called in calls:
        chain = call_cycle(name, [called], callees)
        if chain is not None:
            problems.append(Problem(
                format_path(parts),
                "workflows may not call each other in a cycle: " + " -> ".join(chain)))
    return problems


def workflow_save(*, team: Team, definition: dict, actor: Actor) -> tuple[WorkflowVersion, bool]:
    """Validate and store `definition`; return (version, created).

    An unchanged definition returns the existing latest version (created=False); a changed one
    becomes the next version, and is published at once when the workflow publishes on save and
    `actor` may publish (else it is a draft). Raises Forbidden without the workflow.save
    permission in `team`, or when publishing it would drop or weaken a mandatory gate and
    `actor` may not waive one (nothing is saved then); DefinitionInvalid listing every problem.
    """
    require(actor, Action.WORKFLOW_SAVE, team=team)
    problems = definition_problems(definition, team=team)
    if problems:
        raise DefinitionInvalid(problems)
    digest = digest_of(definition)
    with transaction.atomic():
        workflow, _ = Workflow.objects.get_or_create(team=team, name=definition["name"])
        workflow = Workflow.objects.select_for_update().get(pk=workflow.pk)
        latest = workflow.versions.order_by("-number").first()
        if latest is not None and latest.digest == digest:
            return latest, False
        number = (latest.number if latest else 0) + 1
        version = WorkflowVersion.objects.create(
            workflow=workflow, number=number, definition=definition,
            normalized=normalize_definition(definition), digest=digest,
            created_by=person(actor),
        )
        audit_record(action="workflow.version_created", outcome="created", actor=label(actor),
                     subject_type="workflow", subject_id=workflow.id, workflow=workflow.name,
                     workflow_version=number, definition_digest=digest, team=team.slug)
        # A version a release gate holds back stays a draft: it is evaluated, then published.
        if workflow.publish_on_save and may(actor, Action.WORKFLOW_PUBLISH, team=team) \
                and not release_problems(workflow, version):
            _publish(workflow, version, actor, saving=True)
    return version, True


def workflow_publish(*, workflow_id: int, number: int, actor: Actor) -> Workflow:
    """Make version `number` the one runs and triggers start.

    Raises Forbidden without workflow.publish in the workflow's team, or when the version drops
    or weakens a mandatory gate of the active one and `actor` may not waive it (each problem
    with its path); NotAllowed for an archived workflow or a version that does not exist.
    """
    with transaction.atomic():
        workflow = Workflow.objects.select_for_update(of=("self",)).select_related("team").get(pk=workflow_id)
        require(actor, Action.WORKFLOW_PUBLISH, team=workflow.team)
        if workflow.archived_at is not None:
            raise NotAllowed(f"workflow '{workflow.name}' is archived: restore it first")
        version = workflow.versions.filter(number=number).first()
        if version is None:
            raise NotAllowed(f"workflow '{workflow.name}' has no version {number}",
                             [{"path": "number", "message": f"no version {number}"}])
        # Publishing the published version again is how an owner waives what a policy set
        # since finds unguarded in it (its runs are refused until then).
        if workflow.active_version_id != version.id or version_gate_problems(version):
            cycle = call_cycle_problems(version.normalized, team=workflow.team)
            if cycle:
                raise DefinitionInvalid(cycle)
            _publish(workflow, version, actor, saving=False)
    return workflow


def _publish(workflow: Workflow, version: WorkflowVersion, actor: Actor, *, saving: bool) -> None:
    """Make `version` active, in the caller's transaction, refusing a weakened gate or an
    action a gate policy guards without its gate to anyone who may not waive one; an owner's
    waiver of the policy problems is kept on the version, so its runs may start."""
    before = workflow.active_version
    weakened = weakened_gates(before.normalized, version.normalized, url_params) \
        if before and before.id != version.id else []
    unguarded = version_gate_problems(version)
    release = [] if saving else release_problems(workflow, version)
    waived = weakened + unguarded + release
    if waived and not may(actor, Action.WORKFLOW_WAIVE_GATE, team=workflow.team):
        how = ("an owner must save it, or save it with publishing on save turned off and have an "
               "owner publish it") if saving else "an owner must publish it"
        what = (f"drops or weakens a mandatory gate of the published version {before.number}"
                if weakened else "calls a tool a gate policy guards without a gate that "
                "satisfies it" if unguarded else "does not pass the workflow's release gate")
        if not (weakened or unguarded):
            how = ("publish a version whose evaluation passes, or have an owner publish this one "
                   "(an override, audited; docs/evaluation.md#the-release-gate)")
        raise Forbidden(f"version {version.number} of '{workflow.name}' {what}: {how} "
                        "(docs/permissions.md)",
                        [{"path": p.path, "message": p.message} for p in waived])
    if unguarded:
        version.gates_waived = [*(version.gates_waived or []),
                                *({"path": p.path, "message": p.message} for p in unguarded)]
        version.save(update_fields=["gates_waived"])
    workflow.active_version = version
    workflow.gates_unguarded = []  # none left: every one was refused or waived just now
    workflow.save(update_fields=["active_version", "gates_unguarded"])
    audit_record(action="workflow.published",
                 outcome="overridden" if release else "waived" if waived else "published",
                 actor=label(actor), subject_type="workflow", subject_id=workflow.id,
                 workflow=workflow.name, workflow_version=version.number,
                 definition_digest=version.digest, team=workflow.team.slug,
                 payload={"previous_version": before.number if before else None,
                          "gates_waived": [f"{p.path}: {p.message}" for p in weakened + unguarded],
                          **({"release_gate_overridden": [f"{p.path}: {p.message}" for p in release]}
                             if release else {})})


def workflow_policy_set(*, workflow_id: int, publish_on_save: bool, actor: Actor) -> Workflow:
    """Say whether saving a version of the workflow publishes it (on) or leaves a draft that
    someone must publish (off: two people see each change). Raises Forbidden without
    workflow.policy (owners)."""
    with transaction.atomic():
        workflow = Workflow.objects.select_for_update(of=("self",)).select_related("team").get(pk=workflow_id)
        require(actor, Action.WORKFLOW_POLICY, team=workflow.team)
        if workflow.publish_on_save == publish_on_save:
            return workflow
        workflow.publish_on_save = publish_on_save
        workflow.save(update_fields=["publish_on_save"])
        audit_record(action="workflow.policy_changed", outcome="changed", actor=label(actor),
                     subject_type="workflow", subject_id=workflow.id, workflow=workflow.name,
                     team=workflow.team.slug, payload={"publish_on_save": publish_on_save})
    return workflow


def workflow_archive(*, workflow_id: int, actor: Actor) -> Workflow:
    """Archive a workflow: its versions and runs stay, no new run starts (from the API, a
    trigger or a parent). Raises Forbidden without workflow.archive; archiving twice is a no-op."""
    return _set_archived(workflow_id, actor, archived=True)


def workflow_restore(*, workflow_id: int, actor: Actor) -> Workflow:
    """Undo `workflow_archive`. Raises Forbidden without workflow.archive."""
    return _set_archived(workflow_id, actor, archived=False)


def _set_archived(workflow_id: int, actor: Actor, *, archived: bool) -> Workflow:
    with transaction.atomic():
        workflow = Workflow.objects.select_for_update(of=("self",)).select_related("team").get(pk=workflow_id)
        require(actor, Action.WORKFLOW_ARCHIVE, team=workflow.team)
        if (workflow.archived_at is not None) == archived:
            return workflow
        workflow.archived_at = now() if archived else None
        workflow.save(update_fields=["archived_at"])
        audit_record(action="workflow.archived" if archived else "workflow.restored",
                     outcome="archived" if archived else "restored", actor=label(actor),
                     subject_type="workflow", subject_id=workflow.id, workflow=workflow.name,
                     team=workflow.team.slug)
    return workflow
