"""Moving unfinished runs to another version in the API (`POST /api/v1/runs/move/`): the dry
run, or the move itself.

An entry point only: it parses, finds the target version, calls `services.moves`
(`runs_move_plan`, `runs_move`), and serializes (docs/operations.md#moving-runs-to-another-version).
"""
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from orchestrator.engine.authz import visible
from orchestrator.engine.selectors import runs_with_version
from orchestrator.engine.services.moves import MAX_REASON, MAX_RUNS, runs_move, runs_move_plan
from orchestrator.models import Run, WorkflowVersion

from .errors import ServiceErrorsMixin, error_body, valid_data
from .parsers import JSONBodyParser
from .serializers import ErrorsSerializer


class MoveRequestSerializer(serializers.Serializer):
    runs = serializers.ListField(child=serializers.UUIDField(), min_length=1, max_length=MAX_RUNS,
                                 help_text="The runs to move: unfinished runs of one workflow.")
    version = serializers.IntegerField(min_value=1, help_text="The number of the version to move them to.")
    workflow = serializers.CharField(required=False, min_length=1, max_length=100,
                                     help_text="The workflow whose version it is (default: the "
                                     "first run's); another workflow's is refused per run.")
    dry_run = serializers.BooleanField(default=True, help_text="Only say what the move would do "
                                       "(the default); false moves the runs that can move.")
    reason = serializers.CharField(required=False, allow_blank=True, max_length=MAX_REASON, default="",
                                   help_text="Why: required to move, recorded in the audit ledger.")


class RefusalSerializer(serializers.Serializer):
    code = serializers.CharField(help_text="other_workflow, same_version, finished, not_live, "
                                 "version_refused, input_invalid, in_flight, step_missing, "
                                 "kind_changed, output_invalid, order, waiting_changed, gate_unbound, "
                                 "approval_scope")
    message = serializers.CharField()
    path = serializers.CharField()


class StepMappingSerializer(serializers.Serializer):
    name = serializers.CharField()
    change = serializers.ChoiceField(choices=["kept", "added", "removed"])
    state = serializers.CharField(help_text="The run's step's state (empty for an added step).")
    kind_from = serializers.CharField()
    kind_to = serializers.CharField()
    definition = serializers.CharField(help_text="same or changed (empty unless kept).")
    output_schema = serializers.CharField(help_text="same, changed, or empty when neither declares one.")
    input_schema = serializers.CharField(help_text="same, changed, or empty when neither declares one.")
    outcome = serializers.CharField(help_text="What the move does to the step.")


class MovePlanSerializer(serializers.Serializer):
    run = serializers.UUIDField()
    workflow = serializers.CharField()
    from_version = serializers.IntegerField()
    to_version = serializers.IntegerField()
    state = serializers.CharField(help_text="The run's state when it was planned.")
    movable = serializers.BooleanField(help_text="Whether it can move (a dry run) or was moved.")
    refusals = RefusalSerializer(many=True)
    steps = StepMappingSerializer(many=True)
    gates_asked_again = serializers.ListField(child=serializers.CharField(), help_text=(
        "Waiting gates whose approved action changes: their request is cancelled and a new "
        "decision asked."))


class MoveAnswerSerializer(serializers.Serializer):
    dry_run = serializers.BooleanField()
    moved = serializers.IntegerField(help_text="Runs moved (0 for a dry run).")
    refused = serializers.IntegerField(help_text="Runs that cannot move (or were not moved).")
    runs = MovePlanSerializer(many=True)


class RunsMoveView(ServiceErrorsMixin, APIView):
    """Move unfinished runs to another version of their workflow."""

    parser_classes = [JSONBodyParser]

    @extend_schema(
        request=MoveRequestSerializer,
        responses={200: MoveAnswerSerializer, 400: ErrorsSerializer, 403: ErrorsSerializer,
                   404: ErrorsSerializer},
        description="With `dry_run` (the default): per run, whether it can move to `version` "
        "and how its steps map by name (kept, added, removed; kind, definition and schemas "
        "compared), with the reasons it cannot. Without: moves those that can, each under its "
        "lock and planned again there, audited with `reason` (required); the others are "
        "refused with their reasons, nothing changed. A waiting gate whose approved action "
        "changes asks a new decision. Needs run.move in the runs' team (operators, owners); "
        "the target must pass the checks a start of it passes. 404 for a run you cannot see.")
    def post(self, request):
        body = valid_data(MoveRequestSerializer(data=request.data))
        first = visible(runs_with_version(), request.user).filter(id=body["runs"][0]).first()
        if first is None:
            raise NotFound(error_body(f"no such run: {body['runs'][0]}", "runs[0]"))
        name = body.get("workflow") or first.version.workflow.name
        version = (WorkflowVersion.objects.select_related("workflow")
                   .filter(workflow__team_id=first.team_id, workflow__name=name,
                           number=body["version"]).first())
        if version is None:
            raise ValidationError(error_body(f"workflow '{name}' has no version {body['version']}",
                                             "version"))
        try:
            if body["dry_run"]:
                plans = runs_move_plan(run_ids=body["runs"], version=version, actor=request.user)
            else:
                plans = runs_move(run_ids=body["runs"], version=version, actor=request.user,
                                  reason=body["reason"])
        except Run.DoesNotExist as exc:
            raise NotFound(error_body(str(exc), "runs")) from None
        moved = 0 if body["dry_run"] else sum(p.movable for p in plans)
        answer = {"dry_run": body["dry_run"], "moved": moved,
                  "refused": sum(not p.movable for p in plans),
                  "runs": [p.as_dict() for p in plans]}
        return Response(MoveAnswerSerializer(answer).data, status=status.HTTP_200_OK)
