"""Starting a workflow from a template of the gallery (`orchestrator.engine.gallery`).

The template's definition is saved for the team by `workflow_save` — validated and versioned as
any definition, with the workflow.save permission checked there, for the acting person — under
the template's name or one the person chooses. The admin's "new workflow from template" page and
`POST /api/v1/templates/<name>/instantiate/` both call `template_instantiate`. A template that
ships sample evaluation cases gives the new workflow its `sample` dataset (docs/evaluation.md),
and one that ships a release policy over them, that policy.
"""
from evaluation.gate import release_policy_set
from evaluation.services import dataset_sample_load
from orchestrator.models import Team, WorkflowVersion

from ..authz import Action, Actor, System, may, require
from ..errors import InputInvalid
from ..gallery import template_named
from .workflows import workflow_save

GALLERY = System("gallery")


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
        dataset = dataset_sample_load(workflow=version.workflow, path=found.dataset_path, actor=actor)
        # The template's gate comes with the workflow it creates, set by the gallery (setting a
        # policy is an owner's; an editor's new workflow gets it all the same).
        if dataset is not None and found.release_policy:
            release_policy_set(workflow=version.workflow, dataset=dataset, thresholds=found.release_policy,
                               actor=GALLERY)
    return version, created
