"""The builder page and its layout endpoint (docs/builder.md).

Thin entry points. Who may open the builder is who may save workflows in the team
(`authz.require(..., WORKFLOW_SAVE)`, the check `workflow_save` makes): anyone else gets a 403,
an anonymous visitor the login page (the admin's `admin_view`). The page receives the definition
exactly as it was submitted (`WorkflowVersion.definition`), the format's JSON Schema it builds
its forms from, and the saved positions; everything else it asks of the API.
"""

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseNotAllowed, JsonResponse
from django.template.response import TemplateResponse
from django.urls import reverse

from orchestrator.engine.authz import Action, require, teams_where, visible
from orchestrator.engine.definitions import DefinitionInvalid
from orchestrator.engine.definitions.format import definition_format_schema
from orchestrator.engine.definitions.loader import parse_json_text
from orchestrator.engine.errors import Forbidden, InputInvalid
from orchestrator.engine.gallery import sample_input_of, template_named, templates
from orchestrator.engine.services.layouts import version_layout_save
from orchestrator.integrations.tools.registry import tool_param_schemas
from orchestrator.models import Team, Workflow, WorkflowVersion, WorkflowVersionLayout

BLANK = {"name": "new-workflow", "input_schema": {"type": "object"}, "steps": []}


def _team_to_edit(request, slug: str | None) -> Team:
    """The team the new workflow is drawn for: the one asked for, else the first where the
    person may save. Raises PermissionDenied when they may save in none (or not in that one)."""
    teams = teams_where(request.user, Action.WORKFLOW_SAVE).order_by("slug")
    team = teams.filter(slug=slug).first() if slug else teams.first()
    if team is None:
        raise PermissionDenied("you may not save workflows in this team (docs/permissions.md)")
    return team


def integral_float_paths(value: object, path: tuple = ()) -> list[list]:
    """Paths of the floats with no fraction (`2.0`): JSON text read by a browser turns them into
    integers, and the page must write them back as floats so an unedited definition keeps its
    digest."""
    if isinstance(value, float) and value.is_integer():
        return [list(path)]
    if isinstance(value, dict):
        return [p for key, item in value.items() for p in integral_float_paths(item, (*path, key))]
    if isinstance(value, list):
        return [p for index, item in enumerate(value) for p in integral_float_paths(item, (*path, index))]
    return []


def builder_page(request, workflow_id: int | None = None, *, admin_context: dict) -> TemplateResponse:
    """GET: the builder, for a workflow's version (`?version=`, default the latest), a gallery
    template (`?template=`), or a blank workflow, in `?team=` (default: the first team where
    the person may save)."""
    workflow = version = None
    sample_input: dict = {}
    if workflow_id is not None:
        workflow = visible(Workflow.objects.select_related("team"), request.user).filter(
            id=workflow_id).first()
        if workflow is None:
            raise Http404("no such workflow, or not one of your teams'")
        try:
            require(request.user, Action.WORKFLOW_SAVE, team=workflow.team)
        except Forbidden as exc:
            raise PermissionDenied(str(exc)) from exc
        versions = workflow.versions.order_by("-number")
        wanted = request.GET.get("version")
        version = (versions.filter(number=wanted) if wanted and wanted.isdigit() else versions).first()
        if version is None:
            raise Http404("no such version")
        team, definition = workflow.team, version.definition
        found = None
        sample_input = sample_input_of(workflow)
    else:
        team = _team_to_edit(request, request.GET.get("team"))
        found = template_named(request.GET.get("template") or "")
        if request.GET.get("template") and found is None:
            raise Http404("no such template")
        definition = found.definition() if found else dict(BLANK)
        sample_input = found.sample_input if found else {}
    layout = WorkflowVersionLayout.objects.filter(version=version).first() if version else None
    data = {
        "schema": definition_format_schema(),
        "definition": definition,
        "float_paths": integral_float_paths(definition),
        "positions": layout.positions if layout else {},
        "team": team.slug,
        "workflow": workflow.name if workflow else None,
        "version": version.number if version else None,
        "template": found.name if found and workflow is None else None,
        "sample_input": sample_input,
        "models": sorted(settings.STEPWISE_MODELS),
        "tools": sorted(tool_param_schemas()),
        "templates": [{"name": t.name, "title": t.title} for t in templates()],
        "urls": {
            "workflows": reverse("api:workflow-list"),
            "validate": reverse("api:workflow-validate"),
            "layout": reverse("admin:orchestrator_workflow_builder_layout"),
            "builder_new": reverse("admin:orchestrator_workflow_builder"),
            "run_live": reverse("admin:orchestrator_run_live",
                                args=["00000000-0000-0000-0000-000000000000"]),
        },
    }
    title = f"Builder: {workflow.name} v{version.number}" if workflow else "Builder: new workflow"
    context = {**admin_context, "title": title, "team": team, "workflow": workflow,
               "version": version, "data": data, "opts": Workflow._meta}
    return TemplateResponse(request, "admin/orchestrator/workflow/builder.html", context)


def builder_layout(request) -> JsonResponse:
    """POST `{"team", "workflow", "number", "positions"}`: store where the version's steps were
    drawn (`version_layout_save`, which checks workflow.save)."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    try:
        # The loader's strict JSON: no lone surrogate (nothing stores undecodable text).
        body = parse_json_text(request.body or b"{}", what="layout")
        team, name, number = body["team"], body["workflow"], int(body["number"])
    except (DefinitionInvalid, ValueError, KeyError, TypeError):
        return JsonResponse({"errors": [{"path": "", "message": "expected JSON with team, "
                                         "workflow, number and positions"}]}, status=400)
    version = visible(WorkflowVersion.objects.all(), request.user, team_field="workflow__team").filter(
        workflow__team__slug=team, workflow__name=name, number=number).first()
    if version is None:
        raise Http404("no such version")
    try:
        layout = version_layout_save(version_id=version.id, positions=body.get("positions"),
                                     actor=request.user)
    except Forbidden as exc:
        return JsonResponse({"errors": exc.problems}, status=403)
    except InputInvalid as exc:
        return JsonResponse({"errors": exc.problems}, status=400)
    builder = reverse("admin:orchestrator_workflow_builder_edit", args=[version.workflow_id])
    return JsonResponse({"workflow": name, "number": number, "positions": layout.positions,
                         "builder_url": f"{builder}?version={number}"})
