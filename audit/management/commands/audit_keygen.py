"""`manage.py audit_keygen --output FILE`: a new Ed25519 key for signing ledger checkpoints.

Writes the private key (PEM, mode 0600; refuses to overwrite) and prints its key id and the
public key in the form AUDIT_VERIFY_KEYS takes. The same key can be made with
`openssl genpkey -algorithm ed25519 -out FILE`. Rotation: docs/security.md.
"""
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from audit.signing import key_id, public_key_text, signing_key_create


class Command(BaseCommand):
    help = "Create an Ed25519 private key for AUDIT_SIGNING_KEY_FILE and print its public key."

    def add_arguments(self, parser):
        parser.add_argument("--output", type=Path, required=True, help="Where to write the key.")

    def handle(self, *args, output: Path, **options):
        try:
            key = signing_key_create(output)
        except FileExistsError as exc:
            raise CommandError(f"{output} exists; a key is never overwritten") from exc
        public = key.public_key()
        self.stdout.write(f"wrote {output}\nkey id:     {key_id(public)}\n"
                          f"public key: {public_key_text(public)}")
