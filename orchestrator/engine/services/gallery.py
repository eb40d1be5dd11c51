"""Starting a workflow from a template of the gallery (`orchestrator.engine.gallery`).

The template's definition is saved for the team by `workflow_save` — validated and versioned as
any definition, with the workflow.save permission checked there, for the acting person — under
the template's name or one the person chooses. The admin's "new workflow from template" page and
`POST /api/v1/templates/<name>/instantiate/` both call `template_instantiate`. A template that
ships sample evaluation cases gives the new workflow its `sample` dataset (docs/evaluation.md).
"""
from evaluation.services import dataset_sample_load
from orchestrator.models import Team, WorkflowVersion

from ..authz import Action, Actor, may, require
from ..errors import InputInvalid
from ..gallery import template_named
from .workflows import workflow_save


def template_instantiate(*, template: str, team: Team, actor: Actor,
                         name: str | None = None) -> tuple[WorkflowVersion, bool]:
    """Save template `template` as workflow `name` (default: the template's) of `team`.

    Returns (version, created): the same definition saved again is the existing version.
    A template with sample cases (`Template.dataset`) also creates the workflow's `sample`
    dataset from them, once, when the actor may (dataset.edit).

    Raises Forbidden without workflow.save in `team`, InputInvalid for an unknown template,
    DefinitionInvalid for a name the format refuses (or a definition this deployment refuses:
    a tool it does not register, an address its egress policy forbids).
    """
    require(actor, Action.WORKFLOW_SAVE, team=team)
    found = template_named(template)
    if found is None:
        message = f"no template named '{template}'"
        raise InputInvalid(message, [{"path": "template", "message": message}])
    definition = found.definition()
    if name:
        definition["name"] = name
    version, created = workflow_save(team=team, definition=definition, actor=actor)
    if found.dataset_path is not None and may(actor, Action.DATASET_EDIT, team=team):
        dataset_sample_load(workflow=version.workflow, path=found.dataset_path, actor=actor)
    return version, created
