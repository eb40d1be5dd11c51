"""First-run set-up for `make run`: an admin user and API token, a demo team, the approvers
groups, a reviewer who is not staff, the example workflows (saved through the same service as
the API) and their sample evaluation datasets (examples/datasets/), one support run waiting at its approval gate, the example database's sample rows, and
the local keys.

The development secrets (Django's SECRET_KEY and the ledger's redaction key) are generated into
var/secrets/ by the settings on first start; this also creates the ledger's signing key there
(docs/security.md). Idempotent: running it again changes nothing that exists and prints the
same instructions.
"""
import secrets
import sqlite3
from pathlib import Path

from django.conf import settings
from django.contrib.auth.models import Group, User
from django.core.management.base import BaseCommand
from rest_framework.authtoken.models import Token

from audit.signing import key_id, signing_key
from evaluation.services import dataset_sample_load
from orchestrator.engine.definitions import parse_definition_text
from orchestrator.engine.gallery import template_named
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Role, Run, Team, TeamMembership
from triggers.models import Trigger
from triggers.services.config import trigger_create

EXAMPLES = Path(settings.BASE_DIR) / "examples"
SUPPORT_INPUT = {"ticket_id": "{{ payload.ticket }}", "body": "{{ payload.text }}",
                 "customer_email": "{{ payload.email }}"}
# One trigger of each kind on the support example (docs/triggers.md); the schedule is left
# disabled so that a fresh `make run` does not start runs by itself.
DEMO_TRIGGERS = [
    {"kind": "webhook", "name": "support-inbox", "input_template": SUPPORT_INPUT,
     "description": "A helpdesk posts new tickets here, signed."},
    {"kind": "queue", "name": "support-queue", "input_template": SUPPORT_INPUT,
     "source": "rabbitmq", "exchange": "stepwise.demo", "binding_key": "tickets.*",
     "description": "Tickets published to RabbitMQ (exchange stepwise.demo, tickets.*)."},
    {"kind": "schedule", "name": "support-digest", "cron": "0 9 * * mon-fri",
     "timezone": "Europe/Paris", "enabled": False, "input_template": {
         "ticket_id": "digest-{{ slot }}", "body": "Weekday digest of open tickets ({{ slot }})",
         "customer_email": "support-leads@example.com"},
     "description": "Enable it, or change its cron, in the admin."},
    {"kind": "api", "name": "support-api", "input_template": SUPPORT_INPUT,
     "description": "Fired by programs: POST /api/v1/triggers/<id>/fire/."},
]
DEMO_TICKET = {
    "ticket_id": "T-1001",
    "body": "Hello, I was charged twice for my March invoice (INV-2291). Could you refund the "
            "duplicate charge? Thanks, Sam",
    "customer_email": "sam@example.com",
}


def seed_example_warehouse(path: Path | None = None) -> Path:
    """Create the orders-digest example's SQLite database from examples/warehouse.sql, once
    (the `examples-warehouse` connection reads it). Returns its path."""
    path = path or Path(settings.VAR_DIR) / "examples" / "warehouse.sqlite3"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".tmp")
        partial.unlink(missing_ok=True)
        with sqlite3.connect(partial) as db:
            db.executescript((EXAMPLES / "warehouse.sql").read_text())
        db.close()
        partial.replace(path)
    return path


class Command(BaseCommand):
    help = "Create the admin user, a demo team and load the example workflows."

    def add_arguments(self, parser):
        parser.add_argument("--username", default="admin")
        parser.add_argument("--port", default="8000")

    def handle(self, *args, username: str, port: str, **options):
        password_file = Path(settings.VAR_DIR) / "admin-password.txt"
        user = User.objects.filter(username=username).first()
        if user is None:
            password = secrets.token_urlsafe(12)
            user = User.objects.create_superuser(username, f"{username}@localhost", password)
            password_file.write_text(password + "\n")
        password = password_file.read_text().strip() if password_file.exists() else "(unchanged)"
        team, _ = Team.objects.get_or_create(slug="demo", defaults={"name": "Demo"})
        TeamMembership.objects.get_or_create(team=team, user=user, defaults={"role": Role.OWNER})
        leads = Group.objects.get_or_create(name="support_leads")[0]
        managers = Group.objects.get_or_create(name="support_managers")[0]
        user.groups.add(leads, managers)
        token, _ = Token.objects.get_or_create(user=user)
        if not settings.PRODUCTION:
            seed_example_warehouse()
        reviewer, reviewer_password = self.reviewer(team, leads)
        reviewer_token, _ = Token.objects.get_or_create(user=reviewer)
        versions = {}
        for path in sorted(EXAMPLES.glob("*.yaml")):
            version, created = workflow_save(
                team=team, definition=parse_definition_text(path.read_text()), actor=user)
            versions[version.workflow.name] = version
            state = "loaded" if created else "unchanged"
            self.stdout.write(f"  workflow {version.workflow.name} v{version.number} {state}")
        for path in sorted((EXAMPLES / "datasets").glob("*.jsonl")):
            if path.stem in versions and dataset_sample_load(workflow=versions[path.stem].workflow,
                                                             path=path, actor=user):
                self.stdout.write(f"  dataset {path.stem}/sample loaded ({path.name})")
        support = versions["support-reply"]
        if not Run.objects.filter(version__workflow=support.workflow).exists():
            # Started by the admin, so the reviewer (not its starter) may approve it.
            run = run_start(version=support, input=DEMO_TICKET, actor=user)
            self.stdout.write(f"  support run {run.id} started: it will wait at its approval gate")
        looped = versions["revise-until-approved"]
        if not Run.objects.filter(version__workflow=looped.workflow).exists():
            run = run_start(version=looped, input=template_named(looped.workflow.name).sample_input,
                            actor=user)
            self.stdout.write(f"  loop run {run.id} started: draft[1], critique[1], draft[2], ... "
                              "show on its run page")
        triggers_text = self._demo_triggers(team, user, port)
        secrets_line = ""
        if not settings.PRODUCTION:  # production never generates keys (docs/security.md)
            secrets_line = (f"\n  secrets:  {settings.SECRETS_DIR}/ (generated once and reused; "
                            f"ledger signing key {key_id(signing_key().public_key())})")
        base = f"http://127.0.0.1:{port}"
        self.stdout.write(self.style.SUCCESS(f"""
Stepwise is starting on {base}
  admin:    {base}/admin/   user: {username}   password: {password}
  reviewer: {base}/admin/   user: {reviewer.username}   password: {reviewer_password}
            (not staff; in support_leads: the support example waits in their inbox)
            API token: {reviewer_token.key}
  live:     {base}/admin/orchestrator/run/ (each run's "watch" page updates as it moves),
            {base}/admin/orchestrator/run/operations/ (queues, workers, failures, spend)
  API docs: {base}/api/v1/docs/
  API token: {token.key}{secrets_line}
  e-mail:   notifications in {settings.VAR_DIR / "mail"}/, the example's e-mails in {settings.VAR_DIR / "outbox" / "emails.jsonl"}

Decide the waiting support run: sign in as {reviewer.username}, open Approvals, read the e-mail that
will be sent, approve it with a note; the note ends up in the e-mail.

Or start another and decide it through the API (the hash you reviewed is required):
  curl -s -X POST {base}/api/v1/workflows/support-reply/runs/ \\
       -H 'Authorization: Token {token.key}' -H 'Content-Type: application/json' \\
       -d '{{"input": {{"ticket_id": "T-1", "body": "I need a refund", "customer_email": "c@example.com"}}}}'
  curl -s {base}/api/v1/approvals/?state=pending -H 'Authorization: Token {token.key}'
  curl -s -X POST {base}/api/v1/approvals/<id>/approve/ -H 'Authorization: Token {reviewer_token.key}' \\
       -H 'Content-Type: application/json' -d '{{"proposal_hash": "<its proposal_hash>", "note": "ok"}}'
(the reviewer approves: whoever started a run may not approve it.)

Try the integrations example (database -> agent -> file -> RabbitMQ; docs/tools.md):
  curl -s -X POST {base}/api/v1/workflows/orders-digest/runs/ \\
       -H 'Authorization: Token {token.key}' -H 'Content-Type: application/json' \\
       -d '{{"input": {{"region": "EU"}}}}'
{triggers_text}"""))

    def reviewer(self, team: Team, leads: Group) -> tuple[User, str]:
        """A support lead who is not staff (docs/approvals.md): signs in to decide, nothing more."""
        password_file = Path(settings.VAR_DIR) / "reviewer-password.txt"
        reviewer = User.objects.filter(username="reviewer").first()
        if reviewer is None:
            password = secrets.token_urlsafe(12)
            reviewer = User.objects.create_user("reviewer", "reviewer@localhost", password)
            password_file.write_text(password + "\n")
        TeamMembership.objects.get_or_create(team=team, user=reviewer,
                                             defaults={"role": Role.MEMBER})
        reviewer.groups.add(leads)
        password = password_file.read_text().strip() if password_file.exists() else "(unchanged)"
        return reviewer, password

    def _demo_triggers(self, team, user, port: str) -> str:
        """Create the demo triggers once; the webhook's secret goes to var/ (development)."""
        if settings.PRODUCTION:  # a deployment makes its own triggers
            return ""
        secret_file = Path(settings.VAR_DIR) / "webhook-support-inbox-secret.txt"
        for spec in DEMO_TRIGGERS:
            spec = dict(spec)
            if Trigger.objects.filter(team=team, name=spec["name"]).exists():
                continue
            if spec.get("source") and spec["source"] not in settings.STEPWISE_EVENT_SOURCES:
                continue  # STEPWISE_EVENT_SOURCES names no such broker here
            trigger, secret = trigger_create(team=team, kind=spec.pop("kind"), actor=user,
                                             workflow="support-reply", **spec)
            if secret:
                secret_file.write_text(secret + "\n")
                secret_file.chmod(0o600)
            self.stdout.write(f"  trigger {trigger.name} ({trigger.kind}) created")
        inbox = Trigger.objects.get(team=team, name="support-inbox")
        api = Trigger.objects.get(team=team, name="support-api")
        return (f"\nTriggers (README, docs/triggers.md): webhook {inbox.name} at "
                f"http://127.0.0.1:{port}/api/v1/hooks/{inbox.id}/\n  (its secret is in "
                f"{secret_file}), queue support-queue (RabbitMQ exchange stepwise.demo, "
                f"tickets.*, if STEPWISE_EVENT_SOURCES has rabbitmq),\n  schedule support-digest (disabled; the admin's Triggers page), "
                f"api {api.name} ({api.id}).\n")
