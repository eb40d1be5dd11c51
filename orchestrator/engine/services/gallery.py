"""Starting a workflow from a template of the gallery (`orchestrator.engine.gallery`).

The template's definition is saved for the team by `workflow_save` — validated and versioned as
any definition, with the workflow.save permission checked there, for the acting person — under
the template's name or one the person chooses. The admin's "new workflow from template" page and
`POST /api/v1/templates/<name>/instantiate/` both call `template_instantiate`.
"""
from orchestrator.models import Team, WorkflowVersion

from ..authz import Action, Actor, require
from ..errors import InputInvalid
from ..gallery import template_named
from .workflows import workflow_save


def template_instantiate(*, template: str, team: Team, actor: Actor,
                         name: str | None = None) -> tuple[WorkflowVersion, bool]:
    """Save template `template` as workflow `name` (default: the template's) of `team`.

    Returns (version, created): the same definition saved again is the existing version.
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
    return workflow_save(team=team, definition=definition, actor=actor)
