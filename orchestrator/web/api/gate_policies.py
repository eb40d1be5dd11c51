"""Mandatory gate policies in the API (`/api/v1/gate-policies/`): list your teams' policies; an
owner adds one (a tool or glob, optionally a target, per team or per workflow) or removes one.

Entry points only: they parse, call `services.gate_policies`, and serialize (docs/permissions.md).
"""
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.response import Response

from orchestrator.engine.authz import visible
from orchestrator.engine.definitions.format import RISK_TIERS
from orchestrator.engine.services.gate_policies import (
    gate_policy_create,
    gate_policy_delete,
    published_gate_problems,
)
from orchestrator.models import GatePolicy

from .errors import ServiceErrorsMixin, valid_data
from .parsers import JSONBodyParser
from .permissions import team_and_workflow_for_write
from .serializers import ErrorsSerializer


class GatePolicySerializer(serializers.Serializer):
    id = serializers.IntegerField(read_only=True)
    team = serializers.SlugField(source="team.slug", read_only=True)
    workflow = serializers.CharField(source="workflow.name", read_only=True, allow_null=True,
                                     help_text="null: every workflow of the team.")
    tool = serializers.CharField(read_only=True)
    target = serializers.CharField(read_only=True)
    approvers = serializers.CharField(read_only=True)
    required_approvals = serializers.IntegerField(read_only=True)
    self_approval_up_to = serializers.CharField(read_only=True)
    created_by = serializers.CharField(source="created_by.username", read_only=True, allow_null=True)
    created_at = serializers.DateTimeField(read_only=True)


class GatePolicyCreateSerializer(serializers.Serializer):
    team = serializers.SlugField(required=False, help_text="Needed when you belong to several teams.")
    workflow = serializers.CharField(required=False, allow_null=True, min_length=1, max_length=100,
                                     help_text="A workflow of the team; leave out for every workflow.")
    tool = serializers.CharField(min_length=1, max_length=100, help_text="A tool name or glob: email.send, payments.*")
    target = serializers.CharField(required=False, allow_blank=True, max_length=200, default="",
                                   help_text="A glob over a call's named connection, recipients' "
                                   "domains and URL host; empty: every call of the tool.")
    approvers = serializers.CharField(required=False, allow_blank=True, max_length=150, default="",
                                      help_text="The group a satisfying gate names; empty: any.")
    required_approvals = serializers.IntegerField(required=False, min_value=1, max_value=10, default=1)
    self_approval_up_to = serializers.ChoiceField(choices=["", *RISK_TIERS], required=False, default="")


class GatePolicyCreatedSerializer(GatePolicySerializer):
    unguarded_published = serializers.DictField(
        read_only=True, help_text="Published versions this policy finds unguarded, by workflow: "
        "their runs are refused until an owner publishes them again (waiving) or a fixed version.")


@extend_schema_view(list=extend_schema(description="The mandatory gate policies of your teams."))
class GatePolicyViewSet(ServiceErrorsMixin, mixins.ListModelMixin, viewsets.GenericViewSet):
    """What every version of a team's workflows (or of one) must put behind a gate, by action."""

    serializer_class = GatePolicySerializer
    parser_classes = [JSONBodyParser]

    def get_queryset(self):
        rows = GatePolicy.objects.select_related("team", "workflow", "created_by")
        return visible(rows, self.request.user).order_by("team__slug", "tool", "id")

    @extend_schema(request=GatePolicyCreateSerializer,
                   responses={201: GatePolicyCreatedSerializer, 400: ErrorsSerializer,
                              403: ErrorsSerializer},
                   description="Guard a tool (or glob), optionally on a target. Owners "
                               "(workflow.policy); audited. docs/permissions.md.")
    def create(self, request):
        body = dict(valid_data(GatePolicyCreateSerializer(data=request.data)))
        team, workflow = team_and_workflow_for_write(request.user, body)
        policy = gate_policy_create(team=team, workflow=workflow, actor=request.user, **body)
        data = {**GatePolicySerializer(policy).data,
                "unguarded_published": published_gate_problems(policy)}
        return Response(data, status=status.HTTP_201_CREATED)

    @extend_schema(responses={204: None, 403: ErrorsSerializer, 404: ErrorsSerializer},
                   description="Remove a policy. Owners (workflow.policy); audited.")
    def destroy(self, request, pk=None):
        policy = self.get_object()
        gate_policy_delete(policy_id=policy.id, actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)
