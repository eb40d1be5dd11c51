"""The ledger's lookups by action and by run, as indexes in the database.

`AuditEntry` is unmanaged, so the schema editor created none of the indexes its Meta declares
(`create_model` and `AddIndex` skip an unmanaged model's indexes). Two of them serve reads that
must not grow with the ledger: `audit_entry_action` finds the newest prune without walking
every entry, and `audit_entry_run` finds the entry that chained a step's attestation when a
verification checks the outputs of what is new. PostgreSQL builds them CONCURRENTLY, so a
large ledger keeps taking entries while they are built.
"""
from django.db import migrations

INDEXES = {
    "audit_entry_action": "(action, created_at)",
    "audit_entry_run": "(run_id, sequence)",
}


def forward(apps, schema_editor):
    concurrently = " CONCURRENTLY" if schema_editor.connection.vendor == "postgresql" else ""
    for name, columns in INDEXES.items():
        schema_editor.execute(f"CREATE INDEX{concurrently} IF NOT EXISTS {name} ON audit_entry {columns}",
                              params=None)


def backward(apps, schema_editor):
    for name in INDEXES:
        schema_editor.execute(f"DROP INDEX IF EXISTS {name}", params=None)


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY cannot run inside a transaction.
    atomic = False

    dependencies = [("audit", "0006_ledger_partitions")]

    operations = [migrations.RunPython(forward, backward)]
