"""`/api/v1/tools/`: the registered tools with their schemas, for a definition's author and the
visual builder's palette.

Each tool is listed with its params and output JSON Schemas, how it behaves on a retry, and -
for a tool on a named connection - the names of the connections its caller's teams may use
(`?team=` narrows to one team). Connection names only: never an address or a credential.
Reads the registry and the settings; changes nothing.
"""
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers, status, viewsets
from rest_framework.exceptions import PermissionDenied
from rest_framework.response import Response

from orchestrator.engine.authz import teams_visible_to
from orchestrator.integrations.connections import connections_for
from orchestrator.integrations.tools.registry import Tool, all_tools

from .errors import error_body
from .pagination import KeysetPagination
from .serializers import ErrorsSerializer

_TOOL = inline_serializer("Tool", {
    "name": serializers.CharField(),
    "description": serializers.CharField(),
    "params_schema": serializers.JSONField(),
    "output_schema": serializers.JSONField(allow_null=True),
    "side_effect": serializers.BooleanField(
        help_text="Every call goes through the effect ledger, whatever the step says."),
    "exactly_once": serializers.ChoiceField(
        choices=["lookup", "remote_key", "none"],
        help_text="How an uncertain call is reconciled: the tool's lookup, the idempotency key "
                  "the remote dedupes by, or not at all (a person decides)."),
    "connection_kind": serializers.CharField(allow_null=True),
    "connections": serializers.ListField(child=serializers.CharField(), allow_null=True,
                                         help_text="Connections of that kind your teams may use."),
})
_TEAM = OpenApiParameter("team", str, description="Only the connections this team may use.")


def tool_body(tool: Tool, teams: set[str] | None) -> dict:
    exactly_once = "lookup" if tool.lookup else "remote_key" if tool.dedupes_by_key else "none"
    return {
        "name": tool.name, "description": tool.description, "params_schema": tool.params_schema,
        "output_schema": tool.output_schema, "side_effect": tool.side_effect,
        "exactly_once": exactly_once, "connection_kind": tool.connection,
        "connections": connections_for(kind=tool.connection, teams=teams)
        if tool.connection else None,
    }


class ToolViewSet(viewsets.ViewSet):
    """Registered tools, each with its schemas and the named connections you may use with it."""

    lookup_field = "name"
    lookup_value_regex = r"[A-Za-z0-9_.-]+"
    pagination_class = KeysetPagination

    def _teams(self, request) -> set[str] | None:
        """The team slugs whose connections the caller sees (None: every team's)."""
        slug = request.query_params.get("team")
        visible = teams_visible_to(request.user)
        if slug:
            if not visible.filter(slug=slug).exists():
                raise PermissionDenied(error_body(f"you are not a member of team '{slug}'", "team"))
            return {slug}
        if request.user.is_superuser:
            return None
        return set(visible.values_list("slug", flat=True))

    @extend_schema(parameters=[_TEAM], responses={200: _TOOL, 400: ErrorsSerializer,
                                                  403: ErrorsSerializer})
    def list(self, request):
        teams = self._teams(request)
        tools = [tool_body(t, teams) for _, t in sorted(all_tools().items())]
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(tools, request, view=self)
        return paginator.get_paginated_response(page)

    @extend_schema(parameters=[_TEAM],
                   responses={200: _TOOL, 400: ErrorsSerializer, 403: ErrorsSerializer,
                              404: ErrorsSerializer})
    def retrieve(self, request, name=None):
        tool = all_tools().get(name)
        if tool is None:
            return Response(error_body(f"tool '{name}' is not registered", "name"),
                            status=status.HTTP_404_NOT_FOUND)
        return Response(tool_body(tool, self._teams(request)))
