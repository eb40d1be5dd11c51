"""Saving workflow definitions as immutable, validated versions."""
from django.conf import settings
from django.db import transaction

from audit.services import audit_record

from ..authz import Action, Actor, label, person, require
from ..definitions import DefinitionInvalid, Problem, normalize_definition, validate_definition
from ..egress import definition_checker
from ..hashing import digest_of
from ..models import Team, Workflow, WorkflowVersion
from ..selectors import latest_version
from ..tools.checks import definition_checker as connections_checker
from ..tools.registry import tool_param_schemas


def definition_problems(definition: object, *, team: Team) -> list[Problem]:
    """Every problem with `definition`, checked against this team's saved workflows, its egress
    policy and the named connections granted to it."""

    def workflows(name: str) -> dict | None:
        version = latest_version(team=team, name=name)
        return version.normalized["input_schema"] if version else None

    return validate_definition(
        definition, tools=tool_param_schemas(), models=settings.STEPWISE_MODELS.keys(),
        workflows=workflows, egress=definition_checker(team=team.slug),
        tool_params=connections_checker(team=team.slug),
    )


def workflow_save(*, team: Team, definition: dict, actor: Actor) -> tuple[WorkflowVersion, bool]:
    """Validate and store `definition`; return (version, created).

    An unchanged definition returns the existing latest version (created=False); a changed one
    becomes the next version. Raises Forbidden without the workflow.save permission in `team`,
    DefinitionInvalid listing every problem.
    """
    require(actor, Action.WORKFLOW_SAVE, team=team)
    problems = definition_problems(definition, team=team)
    if problems:
        raise DefinitionInvalid(problems)
    digest = digest_of(definition)
    with transaction.atomic():
        workflow, _ = Workflow.objects.get_or_create(team=team, name=definition["name"])
        latest = workflow.versions.select_for_update().order_by("-number").first()
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
    return version, True
