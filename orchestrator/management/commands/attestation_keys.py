"""`manage.py attestation_keys`: the deployment's attestation keys (docs/audit.md#attestation).

  list                      every key: id, process, registered, revoked
  keygen --output FILE      write a new Ed25519 private key (PEM, mode 0600) for a worker's
                            STEPWISE_ATTESTATION_KEY_FILE, and print its public key
  provision PUBLIC_KEY      add a public key (base64 of the raw 32 bytes) before a process uses
                            it: the only way in when STEPWISE_ATTESTATION_PROVISIONED_ONLY is on
  revoke KEY_ID [--reason]  revoke a key: nothing it signed lets a run advance any more

Each change goes through `engine/services/attestations.py` as the system actor
`attestation-keys`, and is an entry of the audit ledger.
"""
import os
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.core.management.base import BaseCommand, CommandError

from orchestrator.engine.attestation import key_id_of, public_text_of
from orchestrator.engine.authz import System
from orchestrator.engine.services.attestations import worker_key_provision, worker_key_revoke
from orchestrator.models import WorkerKey

ACTOR = System("attestation-keys")


class Command(BaseCommand):
    help = "List, generate, provision and revoke the attestation keys of workers."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("list")
        keygen = sub.add_parser("keygen")
        keygen.add_argument("--output", type=Path, required=True)
        provision = sub.add_parser("provision")
        provision.add_argument("public_key")
        provision.add_argument("--process", default="", help="Which worker will use it.")
        revoke = sub.add_parser("revoke")
        revoke.add_argument("key_id")
        revoke.add_argument("--reason", default="")

    def handle(self, *args, action, **options):
        if action == "list":
            for key in WorkerKey.objects.order_by("registered_at"):
                revoked = f"revoked {key.revoked_at:%Y-%m-%d %H:%M} by {key.revoked_by}" \
                    if key.revoked_at else "active"
                self.stdout.write(f"{key.key_id}  {key.process or '-'}  registered "
                                  f"{key.registered_at:%Y-%m-%d %H:%M}"
                                  f"{' (provisioned)' if key.provisioned else ''}  {revoked}")
        elif action == "keygen":
            key = Ed25519PrivateKey.generate()
            try:
                descriptor = os.open(options["output"], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError as exc:
                raise CommandError(f"{options['output']} exists: not overwritten") from exc
            with os.fdopen(descriptor, "wb") as handle:
                handle.write(key.private_bytes(serialization.Encoding.PEM,
                                               serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
            self.stdout.write(f"{key_id_of(key.public_key())} {public_text_of(key.public_key())}")
        elif action == "provision":
            try:
                row = worker_key_provision(actor=ACTOR, public_key=options["public_key"],
                                           process=options["process"])
            except ValueError as exc:
                raise CommandError(f"not an Ed25519 public key: {exc}") from exc
            self.stdout.write(f"{row.key_id} provisioned")
        elif action == "revoke":
            if not worker_key_revoke(actor=ACTOR, key_id=options["key_id"], reason=options["reason"]):
                raise CommandError(f"{options['key_id']}: no such active key")
            self.stdout.write(f"{options['key_id']} revoked")
