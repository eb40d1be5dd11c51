"""Where the visual builder drew a version's steps (`WorkflowVersionLayout`, docs/builder.md).

A layout is stored beside a version's definition and never inside it: it changes no meaning,
no digest and no version, so saving one is not audited. Saving needs what saving the definition
needs, workflow.save in the workflow's team. This module must not touch definitions; they are
saved by `services.workflows.workflow_save` only.
"""
import math

from orchestrator.models import WorkflowVersion, WorkflowVersionLayout

from ..authz import Action, Actor, person, require
from ..clock import now
from ..errors import InputInvalid

MAX_POSITIONS = 1000  # far above the most steps (and loop body steps) a definition may have
MAX_COORDINATE = 1e6


def _clean_positions(positions: object) -> dict:
    """`{name: {"x", "y"}}` with finite numbers; raises InputInvalid naming each bad entry."""
    if not isinstance(positions, dict):
        raise InputInvalid("positions must be an object of step name to {x, y}",
                           [{"path": "positions", "message": "expected an object"}])
    if len(positions) > MAX_POSITIONS:
        raise InputInvalid(f"at most {MAX_POSITIONS} positions",
                           [{"path": "positions", "message": f"at most {MAX_POSITIONS} entries"}])
    problems, clean = [], {}
    for name, point in positions.items():
        ok = (isinstance(name, str) and 0 < len(name) <= 100 and isinstance(point, dict)
              and set(point) == {"x", "y"}
              and all(isinstance(point[axis], int | float) and not isinstance(point[axis], bool)
                      and math.isfinite(point[axis]) and abs(point[axis]) <= MAX_COORDINATE
                      for axis in ("x", "y")))
        if ok:
            clean[name] = {"x": round(float(point["x"]), 1), "y": round(float(point["y"]), 1)}
        else:
            problems.append({"path": f"positions.{name}",
                             "message": "expected {x, y} with finite numbers"})
    if problems:
        raise InputInvalid("positions are not {x, y} points", problems)
    return clean


def version_layout_save(*, version_id: int, positions: object, actor: Actor) -> WorkflowVersionLayout:
    """Store the positions of version `version_id`'s steps, replacing any before.

    Names that are not steps of the version are dropped (a layout never describes steps the
    definition does not have). Raises Forbidden without workflow.save in the workflow's team,
    InputInvalid for positions that are not `{name: {x, y}}`.
    """
    version = WorkflowVersion.objects.select_related("workflow__team").get(pk=version_id)
    require(actor, Action.WORKFLOW_SAVE, team=version.workflow.team)
    names = step_names(version.definition)
    clean = {name: point for name, point in _clean_positions(positions).items() if name in names}
    layout, _ = WorkflowVersionLayout.objects.update_or_create(
        version=version, defaults={"positions": clean, "updated_at": now(),
                                   "updated_by": person(actor)})
    return layout


def step_names(definition: dict) -> set[str]:
    """Every step name of a definition, a loop's body steps included."""
    names: set[str] = set()
    for step in definition.get("steps") or []:
        if isinstance(step, dict) and isinstance(step.get("name"), str):
            names.add(step["name"])
            for body_step in step.get("body") or [] if step.get("type") == "loop" else []:
                if isinstance(body_step, dict) and isinstance(body_step.get("name"), str):
                    names.add(body_step["name"])
    return names
