"""The ledger's seal and guard on PostgreSQL, cheaper per entry (issue 16), same chain.

- audit_entry_seal: the first entry a transaction seals takes the chain lock and reads the head,
  as before; it then keeps the head it wrote in a transaction-local setting
  (`stepwise.audit_head`, bound to the transaction's id), so the transaction's next entries
  chain onto it without reading the head again: the lock is already theirs until the
  transaction ends, so no one else can have moved it. A savepoint rolled back takes back both
  its seals and the setting; a value left from another transaction is never read.
- audit_entry_guard: the seal's own UPDATE is recognised by comparing the row with its chain
  fields put back (a record comparison), not by turning both versions into JSON.

Same formulas (audit/chain.py), same order (the commit order), same refusals. Keep this SQL
frozen: a change to the triggers is a new migration.
"""
from importlib import import_module

from django.db import migrations

CHAIN_LOCK_KEY = 727001

PG_FORWARD = [
    f"""
    CREATE OR REPLACE FUNCTION audit_entry_seal() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
        carried text[] := string_to_array(current_setting('stepwise.audit_head', true), ':');
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
            PERFORM pg_advisory_xact_lock({CHAIN_LOCK_KEY});
            SELECT sequence, hash INTO head_sequence, head_hash FROM audit_entry
                WHERE sequence IS NOT NULL ORDER BY sequence DESC LIMIT 1;
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
            PERFORM set_config('stepwise.audit_head',
                               txid_current()::text || ':' || new_sequence::text || ':' || new_hash, true);
        END IF;
        RETURN NULL;
    END $$
    """,
    """
    CREATE OR REPLACE FUNCTION audit_entry_guard() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
        unchained audit_entry;
    BEGIN
        IF TG_OP = 'UPDATE' THEN
            IF OLD.sequence IS NULL AND pg_trigger_depth() > 1 THEN
                unchained := NEW;
                unchained.sequence := OLD.sequence;
                unchained.prev_hash := OLD.prev_hash;
                unchained.hash := OLD.hash;
                IF unchained IS NOT DISTINCT FROM OLD THEN
                    RETURN NEW;
                END IF;
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
]


def _initial_function(name: str) -> str:
    """Migration 0001's text of `name`, made to replace the function this one installed."""
    initial = import_module("audit.migrations.0001_initial")
    [text] = [s for s in initial.PG_FORWARD if f"CREATE FUNCTION {name}()" in s]
    return text.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for statement in PG_FORWARD:
            schema_editor.execute(statement, params=None)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for name in ("audit_entry_seal", "audit_entry_guard"):
            schema_editor.execute(_initial_function(name), params=None)


class Migration(migrations.Migration):

    dependencies = [("audit", "0001_initial")]

    operations = [migrations.RunPython(forward, backward)]
