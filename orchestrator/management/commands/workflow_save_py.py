"""Save a workflow written in Python (stepwise_client.builder) as the next version of its team's
workflow: `manage.py workflow_save_py examples.python.support:workflow --team demo --user admin`.

The module's attribute is a `Workflow` (or a dict); its `to_dict()` is validated and saved by
`workflow_save`, exactly as a YAML file would be, with the permission of `--user`.
"""
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from orchestrator.engine.definitions import DefinitionInvalid
from orchestrator.engine.errors import Forbidden
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Team
from stepwise_client.builder import load_definition


class Command(BaseCommand):
    help = "Save the workflow a Python module defines (module:attribute, or file.py:attribute)."

    def add_arguments(self, parser):
        parser.add_argument("reference", help="e.g. examples.python.support:workflow")
        parser.add_argument("--team", required=True, help="the team's slug")
        parser.add_argument("--user", required=True, help="who saves it (needs workflow.save in the team)")

    def handle(self, *args, reference: str, team: str, user: str, **options):
        try:
            definition = load_definition(reference)
        except (ImportError, AttributeError, TypeError, ValueError) as exc:
            raise CommandError(f"cannot load {reference}: {exc}") from exc
        found = Team.objects.filter(slug=team).first()
        actor = get_user_model().objects.filter(username=user).first()
        if found is None or actor is None:
            raise CommandError(f"no team {team!r}" if found is None else f"no user {user!r}")
        try:
            version, created = workflow_save(team=found, definition=definition, actor=actor)
        except DefinitionInvalid as exc:
            raise CommandError("invalid definition:\n" + "\n".join(f"  {p}" for p in exc.problems)) from exc
        except Forbidden as exc:
            raise CommandError(str(exc)) from exc
        state = "saved" if created else "unchanged"
        self.stdout.write(f"workflow {version.workflow.name} v{version.number} {state}")
