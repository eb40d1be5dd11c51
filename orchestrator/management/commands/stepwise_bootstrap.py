"""First-run set-up for `make run`: an admin user and API token, a demo team, the approvers
group, the example workflows (saved through the same service as the API), the example
database's sample rows, and the local keys.

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
from orchestrator.definitions import parse_definition_text
from orchestrator.models import Role, Team, TeamMembership
from orchestrator.services.workflows import workflow_save

EXAMPLES = Path(settings.BASE_DIR) / "examples"


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
        user.groups.add(Group.objects.get_or_create(name="support_leads")[0])
        token, _ = Token.objects.get_or_create(user=user)
        if not settings.PRODUCTION:
            seed_example_warehouse()
        for path in sorted(EXAMPLES.glob("*.yaml")):
            version, created = workflow_save(
                team=team, definition=parse_definition_text(path.read_text()), actor=user)
            state = "loaded" if created else "unchanged"
            self.stdout.write(f"  workflow {version.workflow.name} v{version.number} {state}")
        secrets_line = ""
        if not settings.PRODUCTION:  # production never generates keys (docs/security.md)
            secrets_line = (f"\n  secrets:  {settings.SECRETS_DIR}/ (generated once and reused; "
                            f"ledger signing key {key_id(signing_key().public_key())})")
        base = f"http://127.0.0.1:{port}"
        self.stdout.write(self.style.SUCCESS(f"""
Stepwise is starting on {base}
  admin:    {base}/admin/   user: {username}   password: {password}
  API docs: {base}/api/v1/docs/
  API token: {token.key}{secrets_line}

Try the support example (it stops at its approval gate):
  curl -s -X POST {base}/api/v1/workflows/support-reply/runs/ \\
       -H 'Authorization: Token {token.key}' -H 'Content-Type: application/json' \\
       -d '{{"input": {{"ticket_id": "T-1", "body": "I need a refund", "customer_email": "c@example.com"}}}}'
  curl -s {base}/api/v1/approvals/?state=pending -H 'Authorization: Token {token.key}'
  curl -s -X POST {base}/api/v1/approvals/<id>/approve/ -H 'Authorization: Token {token.key}' \\
       -H 'Content-Type: application/json' -d '{{"note": "ok"}}'

Try the integrations example (database -> agent -> file -> RabbitMQ; docs/tools.md):
  curl -s -X POST {base}/api/v1/workflows/orders-digest/runs/ \\
       -H 'Authorization: Token {token.key}' -H 'Content-Type: application/json' \\
       -d '{{"input": {{"region": "EU"}}}}'
"""))
