"""The seal learns which shards a transaction wrote from its inserts, not from a scan.

Migration 0006's seal found the shards to lock by scanning the unsealed entries
(`SELECT DISTINCT shard ... WHERE sequence IS NULL`) at each transaction's first seal. That
scan walks the partial index `audit_entry_unsealed`, which keeps an entry for every row sealed
since the last vacuum, so each audited commit paid for the ones before it.

- PostgreSQL, audit_entry_before_insert: besides clearing the chain fields, records the row's
  shard in the transaction-local setting `stepwise.audit_shards` (`<txid>:|0|3|`), once per
  shard.
- audit_entry_seal: the first seal of a transaction locks the shards of that list in ascending
  order, as 0006's did the ones it found; the rest is 0006's.
- `audit_entry_unsealed` is dropped: nothing reads through it any more.
- SQLite: nothing changes (one shard, one writer).

Keep this SQL frozen: a change to the triggers is a new migration.
"""
from importlib import import_module

from django.db import migrations

CHAIN_LOCK_KEY = 727001

PG_FORWARD = [
    """
    CREATE OR REPLACE FUNCTION audit_entry_before_insert() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
        written text := current_setting('stepwise.audit_shards', true);
        mine text := txid_current()::text || ':';
    BEGIN
        NEW.sequence := NULL;
        NEW.prev_hash := NULL;
        NEW.hash := NULL;
        IF written IS NULL OR left(written, length(mine)) <> mine THEN
            PERFORM set_config('stepwise.audit_shards', mine || '|' || NEW.shard::text || '|', true);
        ELSIF position('|' || NEW.shard::text || '|' IN written) = 0 THEN
            PERFORM set_config('stepwise.audit_shards', written || NEW.shard::text || '|', true);
        END IF;
        RETURN NEW;
    END $$
    """,
    f"""
    CREATE OR REPLACE FUNCTION audit_entry_seal() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
        head_setting text := CASE WHEN NEW.shard = 0 THEN 'stepwise.audit_head'
                                  ELSE 'stepwise.audit_head_' || NEW.shard::text END;
        carried text[] := string_to_array(current_setting(head_setting, true), ':');
        written text := current_setting('stepwise.audit_shards', true);
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
                IF left(written, length(txid_current()::text) + 1) = txid_current()::text || ':' THEN
                    FOR pending IN SELECT DISTINCT s::integer FROM unnest(string_to_array(
                                       trim(both '|' FROM split_part(written, ':', 2)), '|')) AS s
                                   ORDER BY 1 LOOP
                        PERFORM pg_advisory_xact_lock({CHAIN_LOCK_KEY} + pending);
                    END LOOP;
                END IF;
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
    "DROP INDEX IF EXISTS audit_entry_unsealed",
]


def _function(module: str, name: str) -> str:
    statements = import_module(f"audit.migrations.{module}").PG_FORWARD
    [text] = [s for s in statements if f"FUNCTION {name}() RETURNS" in s]
    return text.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for statement in PG_FORWARD:
            schema_editor.execute(statement, params=None)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(_function("0001_initial", "audit_entry_before_insert"), params=None)
        schema_editor.execute(_function("0006_ledger_partitions", "audit_entry_seal"), params=None)
        schema_editor.execute("CREATE INDEX IF NOT EXISTS audit_entry_unsealed ON audit_entry (shard) "
                              "WHERE sequence IS NULL", params=None)


class Migration(migrations.Migration):

    dependencies = [("audit", "0007_ledger_lookup_indexes")]

    operations = [migrations.RunPython(forward, backward)]
