"""The audit ledger table and the triggers that make it append-only and hash-chained.

The model is unmanaged (so Django's flush never empties it); this migration creates the table
itself, with the schema editor, and installs per-vendor triggers:

PostgreSQL
- audit_entry_before_insert: the chain fields of a new row are always NULL; only the seal sets them.
- audit_entry_seal: a deferred constraint trigger. At COMMIT it takes
  pg_advisory_xact_lock(727001), reads the head, and sets sequence = head + 1, prev_hash = head
  hash, hash = sha256(prev_hash ':' sequence ':' digest) (see audit/chain.py).
- audit_entry_guard: refuses UPDATE (except the seal's own, from inside the seal trigger, which
  changes only the chain fields of an unsealed row) and DELETE (except inside audit_prune: the
  transaction-local setting stepwise.audit_prune = 'on' and a checkpoint covering the row).
- audit_entry_no_truncate: refuses TRUNCATE.

SQLite
- audit_entry_no_update, audit_entry_no_delete: refuse UPDATE and DELETE. audit_prune drops and
  recreates audit_entry_no_delete inside its transaction (audit/triggers.py holds the same text).
- audit_entry_delete_covered: even then, only rows covered by a prune checkpoint may go.

Keep this SQL frozen: a change to the triggers is a new migration.
"""
from django.db import migrations, models

CHAIN_LOCK_KEY = 727001

PG_FORWARD = [
    """
    CREATE FUNCTION audit_entry_before_insert() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        NEW.sequence := NULL;
        NEW.prev_hash := NULL;
        NEW.hash := NULL;
        RETURN NEW;
    END $$
    """,
    "CREATE TRIGGER audit_entry_before_insert BEFORE INSERT ON audit_entry "
    "FOR EACH ROW EXECUTE FUNCTION audit_entry_before_insert()",
    f"""
    CREATE FUNCTION audit_entry_seal() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
        head_sequence bigint;
        head_hash varchar(64);
        new_sequence bigint;
        new_prev varchar(64);
    BEGIN
        PERFORM pg_advisory_xact_lock({CHAIN_LOCK_KEY});
        SELECT sequence, hash INTO head_sequence, head_hash FROM audit_entry
            WHERE sequence IS NOT NULL ORDER BY sequence DESC LIMIT 1;
        IF head_sequence IS NULL THEN
            new_sequence := 1;
            new_prev := repeat('0', 64);
        ELSE
            new_sequence := head_sequence + 1;
            new_prev := head_hash;
        END IF;
        UPDATE audit_entry SET sequence = new_sequence, prev_hash = new_prev,
            hash = encode(sha256(convert_to(new_prev || ':' || new_sequence::text || ':' || digest, 'UTF8')), 'hex')
            WHERE id = NEW.id AND sequence IS NULL;
        RETURN NULL;
    END $$
    """,
    "CREATE CONSTRAINT TRIGGER audit_entry_seal AFTER INSERT ON audit_entry "
    "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION audit_entry_seal()",
    """
    CREATE FUNCTION audit_entry_guard() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP = 'UPDATE' THEN
            IF OLD.sequence IS NULL AND pg_trigger_depth() > 1
               AND (to_jsonb(NEW) - 'sequence' - 'prev_hash' - 'hash')
                   = (to_jsonb(OLD) - 'sequence' - 'prev_hash' - 'hash') THEN
                RETURN NEW;
            END IF;
            RAISE EXCEPTION 'audit ledger is append-only: UPDATE refused (entry %)', OLD.id;
        END IF;
        IF coalesce(current_setting('stepwise.audit_prune', true), '') = 'on'
           AND OLD.sequence <= (SELECT coalesce(max((payload::jsonb ->> 'through_sequence')::bigint), 0)
                                FROM audit_entry WHERE action = 'audit.pruned') THEN
            RETURN OLD;
        END IF;
        RAISE EXCEPTION 'audit ledger is append-only: DELETE refused (entry %)', OLD.id;
    END $$
    """,
    "CREATE TRIGGER audit_entry_guard BEFORE UPDATE OR DELETE ON audit_entry "
    "FOR EACH ROW EXECUTE FUNCTION audit_entry_guard()",
    """
    CREATE FUNCTION audit_entry_no_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION 'audit ledger is append-only: TRUNCATE refused';
    END $$
    """,
    "CREATE TRIGGER audit_entry_no_truncate BEFORE TRUNCATE ON audit_entry "
    "FOR EACH STATEMENT EXECUTE FUNCTION audit_entry_no_truncate()",
]
PG_REVERSE = [
    "DROP TABLE IF EXISTS audit_entry",
    "DROP FUNCTION IF EXISTS audit_entry_before_insert()",
    "DROP FUNCTION IF EXISTS audit_entry_seal()",
    "DROP FUNCTION IF EXISTS audit_entry_guard()",
    "DROP FUNCTION IF EXISTS audit_entry_no_truncate()",
]

SQLITE_FORWARD = [
    "CREATE TRIGGER audit_entry_no_update BEFORE UPDATE ON audit_entry "
    "BEGIN SELECT RAISE(ABORT, 'audit ledger is append-only: UPDATE refused'); END",
    "CREATE TRIGGER audit_entry_no_delete BEFORE DELETE ON audit_entry "
    "BEGIN SELECT RAISE(ABORT, 'audit ledger is append-only: DELETE refused'); END",
    "CREATE TRIGGER audit_entry_delete_covered BEFORE DELETE ON audit_entry "
    "WHEN OLD.sequence IS NULL OR OLD.sequence > (SELECT coalesce(max(CAST(json_extract(payload, "
    "'$.through_sequence') AS INTEGER)), 0) FROM audit_entry WHERE action = 'audit.pruned') "
    "BEGIN SELECT RAISE(ABORT, 'audit ledger is append-only: only entries covered by a prune checkpoint "
    "may be deleted'); END",
]
SQLITE_REVERSE = ["DROP TABLE IF EXISTS audit_entry"]


def create_ledger(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor not in ("postgresql", "sqlite"):
        raise RuntimeError(f"the audit ledger supports PostgreSQL and SQLite, not {vendor}")
    schema_editor.create_model(apps.get_model("audit", "AuditEntry"))
    # Indexes are deferred by the schema editor; run them before the triggers reference them.
    for statement in schema_editor.deferred_sql:
        schema_editor.execute(statement, params=None)
    schema_editor.deferred_sql.clear()
    for statement in PG_FORWARD if vendor == "postgresql" else SQLITE_FORWARD:
        schema_editor.execute(statement, params=None)


def drop_ledger(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    for statement in PG_REVERSE if vendor == "postgresql" else SQLITE_REVERSE:
        schema_editor.execute(statement, params=None)


class Migration(migrations.Migration):

    initial = True

    dependencies = [
    ]

    operations = [
        migrations.CreateModel(
            name='AuditEntry',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('sequence', models.BigIntegerField(help_text="Position in the chain: the previous entry's + 1.", null=True, unique=True)),
                ('created_at', models.DateTimeField(db_index=True)),
                ('actor', models.CharField(help_text='"user:alice", "worker:host", "service:reaper"', max_length=200)),
                ('actor_kind', models.CharField(choices=[('user', 'User'), ('service', 'Service'), ('worker', 'Worker'), ('system', 'System')], max_length=16)),
                ('action', models.CharField(help_text='What happened: "step.completed", ...', max_length=64)),
                ('subject_type', models.CharField(choices=[('workflow', 'Workflow'), ('run', 'Run'), ('step', 'Step'), ('approval', 'Approval'), ('budget', 'Budget'), ('ledger', 'Ledger')], max_length=16)),
                ('subject_id', models.CharField(max_length=100)),
                ('team', models.CharField(blank=True, max_length=50)),
                ('workflow', models.CharField(blank=True, max_length=100)),
                ('workflow_version', models.PositiveIntegerField(blank=True, null=True)),
                ('definition_digest', models.CharField(blank=True, help_text="SHA-256 of the workflow version's definition.", max_length=64)),
                ('run_id', models.UUIDField(blank=True, null=True)),
                ('step_name', models.CharField(blank=True, max_length=64)),
                ('event_id', models.BigIntegerField(blank=True, help_text='The outbox event this entry records, if any.', null=True)),
                ('proposal_hash', models.CharField(blank=True, max_length=64)),
                ('model', models.CharField(blank=True, max_length=100)),
                ('prompt_version', models.CharField(blank=True, max_length=80)),
                ('idempotency_key', models.CharField(blank=True, max_length=255)),
                ('correlation_id', models.CharField(blank=True, help_text='An identifier assigned outside Stepwise.', max_length=255)),
                ('outcome', models.CharField(blank=True, max_length=32)),
                ('payload', models.TextField(default='{}')),
                ('payload_ref', models.CharField(blank=True, help_text='Where data kept out of the ledger lives.', max_length=255)),
                ('digest', models.CharField(help_text='SHA-256 of the canonical entry.', max_length=64)),
                ('prev_hash', models.CharField(blank=True, max_length=64, null=True)),
                ('hash', models.CharField(blank=True, help_text="SHA-256(prev_hash ':' sequence ':' digest).", max_length=64, null=True)),
            ],
            options={
                'verbose_name': 'audit entry',
                'verbose_name_plural': 'audit ledger',
                'db_table': 'audit_entry',
                'ordering': [models.OrderBy(models.F('sequence'), nulls_last=True), 'id'],
                'managed': False,
                'indexes': [
                    models.Index(fields=['run_id', 'sequence'], name='audit_entry_run'),
                    models.Index(fields=['action', 'created_at'], name='audit_entry_action'),
                    models.Index(fields=['actor', 'created_at'], name='audit_entry_actor'),
                    models.Index(fields=['workflow', 'created_at'], name='audit_entry_workflow'),
                ],
            },
        ),
        migrations.RunPython(create_ledger, drop_ledger),
    ]
