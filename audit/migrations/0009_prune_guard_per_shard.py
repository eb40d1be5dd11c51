"""The DELETE guard honours each shard's prune anchor.

Migration 0002's guard let a prune delete any entry whose sequence was at or below the highest
`through_sequence` of any prune checkpoint, whatever its shard. Since the ledger has shards
(migration 0006), sequences count within a shard, so that bound said nothing about the others.

- PostgreSQL, audit_entry_guard: inside a prune (`stepwise.audit_prune = 'on'`) an entry may be
  deleted only when a prune checkpoint covers it in its own shard: shard 0's `through_sequence`
  at the payload's top level, shard N's under `shards -> 'N'`. UPDATE is refused as before.
- SQLite: nothing changes (one shard).

Keep this SQL frozen: a change to the triggers is a new migration.
"""
from importlib import import_module

from django.db import migrations

PG_FORWARD = [
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
           AND OLD.sequence <= (
               SELECT coalesce(max(CASE WHEN OLD.shard = 0
                                        THEN (payload::jsonb ->> 'through_sequence')::bigint
                                        ELSE (payload::jsonb -> 'shards' -> OLD.shard::text
                                              ->> 'through_sequence')::bigint END), 0)
               FROM audit_entry WHERE action = 'audit.pruned') THEN
            RETURN OLD;
        END IF;
        RAISE EXCEPTION 'audit ledger is append-only: DELETE refused (entry %)', OLD.id;
    END $$
    """,
]


def _previous_guard() -> str:
    statements = import_module("audit.migrations.0002_seal_carries_head").PG_FORWARD
    [text] = [s for s in statements if "FUNCTION audit_entry_guard() RETURNS" in s]
    return text


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for statement in PG_FORWARD:
            schema_editor.execute(statement, params=None)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(_previous_guard(), params=None)


class Migration(migrations.Migration):

    dependencies = [("audit", "0008_seal_shards_from_inserts")]

    operations = [migrations.RunPython(forward, backward)]
