"""First-run set-up for `make run`: an admin user and API token, a demo team, the approvers
groups, a reviewer who is not staff, the example workflows (saved through the same service as
the API), one support run waiting at its approval gate, and the local keys.

The development secrets (Django's SECRET_KEY and the ledger's redaction key) are generated into
var/secrets/ by the settings on first start; this also creates the ledger's signing key there
(docs/security.md). Idempotent: running it again changes nothing that exists and prints the
same instructions.
"""
import secrets
from pathlib import Path

from django.conf import settings
from django.contrib.auth.models import Group, User
from django.core.management.base import BaseCommand
from rest_framework.authtoken.models import Token

from audit.signing import key_id, signing_key
from orchestrator.definitions import parse_definition_text
from orchestrator.models import Role, Run, Team, TeamMembership
from orchestrator.services.runs import run_start
from orchestrator.services.workflows import workflow_save

EXAMPLES = Path(settings.BASE_DIR) / "examples"
DEMO_TICKET = {
    "ticket_id": "T-1001",
    "body": "Hello, I was charged twice for my March invoice (INV-2291). Could you refund the "
            "duplicate charge? Thanks, Sam",
    "customer_email": "sam@example.com",
}


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
        reviewer, reviewer_password = self.reviewer(team, leads)
        reviewer_token, _ = Token.objects.get_or_create(user=reviewer)
        versions = {}
        for path in sorted(EXAMPLES.glob("*.yaml")):
            version, created = workflow_save(
                team=team, definition=parse_definition_text(path.read_text()), actor=user)
            versions[version.workflow.name] = version
            state = "loaded" if created else "unchanged"
            self.stdout.write(f"  workflow {version.workflow.name} v{version.number} {state}")
        support = versions["support-reply"]
        if not Run.objects.filter(version__workflow=support.workflow).exists():
            # Started by the admin, so the reviewer (not its starter) may approve it.
            run = run_start(version=support, input=DEMO_TICKET, actor=user)
            self.stdout.write(f"  support run {run.id} started: it will wait at its approval gate")
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
"""))

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
