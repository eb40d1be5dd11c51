"""The template gallery over the API: list the templates, read one, start a workflow from one.

`POST /api/v1/templates/<name>/instantiate/` calls `services.gallery.template_instantiate`,
which checks workflow.save in the team and saves the template's definition as any other.
"""
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from orchestrator.engine.definitions.format import WORKFLOW_NAME_PATTERN
from orchestrator.engine.gallery import Template, template_named, templates
from orchestrator.engine.services.gallery import template_instantiate

from .errors import ServiceErrorsMixin, error_body, valid_data
from .parsers import JSONBodyParser
from .permissions import team_for_write
from .serializers import ErrorsSerializer, WorkflowVersionSerializer


class TemplateTriggerSerializer(serializers.Serializer):
    kind = serializers.CharField(help_text="The kind of trigger to attach (docs/triggers.md).")
    input_template = serializers.JSONField(help_text="Maps the event's payload onto the input.")
    note = serializers.CharField()


class TemplateSerializer(serializers.Serializer):
    name = serializers.CharField(help_text="The template, and the workflow it creates by default.")
    title = serializers.CharField()
    summary = serializers.CharField()
    patterns = serializers.ListField(child=serializers.CharField())
    sample_input = serializers.JSONField(help_text="An input that runs offline on the scripted provider.")
    trigger = TemplateTriggerSerializer(allow_null=True, help_text="For an event-driven template.")


class TemplateDetailSerializer(TemplateSerializer):
    definition = serializers.JSONField(help_text="The workflow definition the template saves.")


class TemplateInstantiateSerializer(serializers.Serializer):
    team = serializers.SlugField(required=False, help_text="Team slug; needed only when you belong to several teams.")
    name = serializers.RegexField(WORKFLOW_NAME_PATTERN, required=False,
                                  help_text="The new workflow's name (default: the template's).")


def _body(template: Template, *, detail: bool = False) -> dict:
    body = {"name": template.name, "title": template.title, "summary": template.summary,
            "patterns": list(template.patterns), "sample_input": template.sample_input,
            "trigger": template.trigger}
    if detail:
        body["definition"] = template.definition()
    return body


_NOT_FOUND = OpenApiResponse(ErrorsSerializer, description="No template of that name.")


class TemplateViewSet(ServiceErrorsMixin, viewsets.ViewSet):
    """The template gallery (docs/templates.md): workflows to start from."""

    lookup_field = "name"
    lookup_value_regex = r"[a-z][a-z0-9_-]*"
    # JSON only: a form field left empty would read as left out.
    parser_classes = [JSONBodyParser]

    @extend_schema(responses={200: TemplateSerializer(many=True)})
    def list(self, request):
        return Response([_body(t) for t in templates()])

    @extend_schema(responses={200: TemplateDetailSerializer, 404: _NOT_FOUND})
    def retrieve(self, request, name=None):
        template = template_named(name)
        if template is None:
            return Response(error_body(f"no template named '{name}'", "name"), status=status.HTTP_404_NOT_FOUND)
        return Response(_body(template, detail=True))

    @extend_schema(
        request=TemplateInstantiateSerializer,
        responses={
            201: OpenApiResponse(WorkflowVersionSerializer, description="A new workflow version."),
            200: OpenApiResponse(WorkflowVersionSerializer, description="Unchanged: saved before."),
            400: ErrorsSerializer, 403: ErrorsSerializer, 404: _NOT_FOUND,
        },
        description="Save the template's workflow in your team (needs workflow.save).",
    )
    @action(detail=True, methods=["post"])
    def instantiate(self, request, name=None):
        if template_named(name) is None:
            return Response(error_body(f"no template named '{name}'", "name"), status=status.HTTP_404_NOT_FOUND)
        body = valid_data(TemplateInstantiateSerializer(data=request.data))
        team = team_for_write(request.user, body.get("team"))
        version, created = template_instantiate(template=name, team=team, actor=request.user,
                                                name=body.get("name"))
        context = {"request": request, "created": created}
        return Response(WorkflowVersionSerializer(version, context=context).data,
                        status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)
