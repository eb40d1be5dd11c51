"""The ledger partitioned into shards (issue 50): one chain per shard, each sealed under its own
lock, so audited commits of different shards never wait for each other.

- A `shard` column (existing entries: shard 0, their chain unchanged, so a ledger written
  before this migration verifies as it did). `sequence` counts within a shard: the global
  UNIQUE on it becomes UNIQUE (shard, sequence), with a plain index on `sequence` kept for
  the readers that order by it.
- PostgreSQL, audit_entry_seal: the first seal of a transaction takes the advisory lock of
  every shard the transaction has unsealed entries in (727001 + shard), in ascending shard
  order, so two transactions writing several shards cannot wait for each other in a cycle;
  each shard's head is read under its own lock and carried, per shard, in a
  transaction-local setting (`stepwise.audit_head` for shard 0, as migration 0002 carried
  the one head, `stepwise.audit_head_<shard>` for the others). An entry whose shard was not locked at the first seal (one written after
  `seal_pending`) takes its shard's lock when it is sealed.
- SQLite keeps one shard (its writer lock serializes every transaction anyway): the column
  is added, the table's UNIQUE on `sequence` stays.

Same formulas (audit/chain.py). Keep this SQL frozen: a change to the triggers is a new
migration.
"""
from importlib import import_module

from django.db import migrations, models

CHAIN_LOCK_KEY = 727001

PG_FORWARD = [
    "ALTER TABLE audit_entry ADD COLUMN shard integer NOT NULL DEFAULT 0",
    "CREATE INDEX audit_entry_sequence ON audit_entry (sequence)",
    """
    DO $$
    DECLARE
        name text;
    BEGIN
        FOR name IN SELECT conname FROM pg_constraint
                    WHERE conrelid = 'audit_entry'::regclass AND contype = 'u'
                      AND conkey = ARRAY[(SELECT attnum FROM pg_attribute
                                          WHERE attrelid = 'audit_entry'::regclass
                                            AND attname = 'sequence')]::smallint[] LOOP
            EXECUTE 'ALTER TABLE audit_entry DROP CONSTRAINT ' || quote_ident(name);
        END LOOP;
    END $$
    """,
    "CREATE UNIQUE INDEX audit_entry_shard_sequence ON audit_entry (shard, sequence)",
    "CREATE INDEX audit_entry_unsealed ON audit_entry (shard) WHERE sequence IS NULL",
    f"""
    CREATE OR REPLACE FUNCTION audit_entry_seal() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
        head_setting text := CASE WHEN NEW.shard = 0 THEN 'stepwise.audit_head'
                                  ELSE 'stepwise.audit_head_' || NEW.shard::text END;
        carried text[] := string_to_array(current_setting(head_setting, true), ':');
        pending integer;
        head_sequence bigint;
        head_hash varchar(64);
        new_sequence bigint;
        new_prev varchar(64);
        new_hash varchar(64);
        sealed integer;
    BEGIN
        IF carried[1] IS NOT DISTINCT FROM txid_current()::text THEN
            head_sequence := carried[2]::bigint;
            head_hash := carried[3];
        ELSE
            IF current_setting('stepwise.audit_locked', true) IS DISTINCT FROM txid_current()::text THEN
                FOR pending IN SELECT DISTINCT shard FROM audit_entry
                               WHERE sequence IS NULL ORDER BY shard LOOP
                    PERFORM pg_advisory_xact_lock({CHAIN_LOCK_KEY} + pending);
                END LOOP;
                PERFORM set_config('stepwise.audit_locked', txid_current()::text, true);
            END IF;
            PERFORM pg_advisory_xact_lock({CHAIN_LOCK_KEY} + NEW.shard);
            SELECT sequence, hash INTO head_sequence, head_hash FROM audit_entry
                WHERE shard = NEW.shard AND sequence IS NOT NULL ORDER BY sequence DESC LIMIT 1;
        END IF;
        IF head_sequence IS NULL THEN
            new_sequence := 1;
            new_prev := repeat('0', 64);
        ELSE
            new_sequence := head_sequence + 1;
            new_prev := head_hash;
        END IF;
        new_hash := encode(sha256(convert_to(new_prev || ':' || new_sequence::text || ':' || NEW.digest, 'UTF8')), 'hex');
        UPDATE audit_entry SET sequence = new_sequence, prev_hash = new_prev, hash = new_hash
            WHERE id = NEW.id AND sequence IS NULL;
        GET DIAGNOSTICS sealed = ROW_COUNT;
        IF sealed = 1 THEN
            PERFORM set_config(head_setting,
                               txid_current()::text || ':' || new_sequence::text || ':' || new_hash, true);
        END IF;
        RETURN NULL;
    END $$
    """,
]
PG_REVERSE = [
    "DROP INDEX IF EXISTS audit_entry_unsealed",
    "DROP INDEX IF EXISTS audit_entry_shard_sequence",
    "ALTER TABLE audit_entry ADD CONSTRAINT audit_entry_sequence_key UNIQUE (sequence)",
    "DROP INDEX IF EXISTS audit_entry_sequence",
    "ALTER TABLE audit_entry DROP COLUMN shard",
]
SQLITE_FORWARD = [
    "ALTER TABLE audit_entry ADD COLUMN shard integer NOT NULL DEFAULT 0",
    "CREATE INDEX audit_entry_sequence ON audit_entry (sequence)",
]
SQLITE_REVERSE = [
    "DROP INDEX IF EXISTS audit_entry_sequence",
    "ALTER TABLE audit_entry DROP COLUMN shard",
]


def forward(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    for statement in PG_FORWARD if vendor == "postgresql" else SQLITE_FORWARD:
        schema_editor.execute(statement, params=None)


def backward(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        previous = import_module("audit.migrations.0002_seal_carries_head")
        schema_editor.execute(previous.PG_FORWARD[0], params=None)
    for statement in PG_REVERSE if vendor == "postgresql" else SQLITE_REVERSE:
        schema_editor.execute(statement, params=None)


class Migration(migrations.Migration):

    dependencies = [("audit", "0005_ledger_api_retention")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddField(
                    model_name="auditentry",
                    name="shard",
                    field=models.IntegerField(default=0),
                ),
                migrations.AlterField(
                    model_name="auditentry",
                    name="sequence",
                    field=models.BigIntegerField(
                        help_text="Position in its shard's chain: the previous entry's + 1.", null=True),
                ),
                migrations.AddIndex(
                    model_name="auditentry",
                    index=models.Index(fields=["sequence"], name="audit_entry_sequence"),
                ),
            ],
            database_operations=[migrations.RunPython(forward, backward)],
        ),
        migrations.AddField(
            model_name="checkpointrecord",
            name="heads",
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.AddField(
            model_name="ledgerverification",
            name="through_heads",
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.AddField(
            model_name="checkpointrecord",
            name="root",
            field=models.CharField(blank=True, max_length=64),
        ),
    ]
