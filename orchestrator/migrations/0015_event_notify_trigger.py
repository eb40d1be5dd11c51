"""Every INSERT into the outbox sends `NOTIFY stepwise_events` from the database (PostgreSQL).

A statement-level trigger on orchestrator_event calls pg_notify in the inserting transaction:
PostgreSQL delivers it at commit, and only then, and folds a transaction's repeats into one, so
the live pages' relay (orchestrator.web.live.relay) wakes once per committed change, as it did when
the engine sent the NOTIFY itself, without a statement of its own in every transaction.

SQLite has no NOTIFY: the relay polls there, and this migration does nothing.
Keep this SQL frozen: a change to the trigger is a new migration.
"""
from django.db import migrations

CHANNEL = "stepwise_events"

PG_FORWARD = [
    f"""
    CREATE FUNCTION orchestrator_event_notify() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM pg_notify('{CHANNEL}', '');
        RETURN NULL;
    END $$
    """,
    "CREATE TRIGGER orchestrator_event_notify AFTER INSERT ON orchestrator_event "
    "FOR EACH STATEMENT EXECUTE FUNCTION orchestrator_event_notify()",
]
PG_REVERSE = [
    "DROP TRIGGER IF EXISTS orchestrator_event_notify ON orchestrator_event",
    "DROP FUNCTION IF EXISTS orchestrator_event_notify()",
]


def _run(statements):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            for statement in statements:
                schema_editor.execute(statement, params=None)
    return run


class Migration(migrations.Migration):

    dependencies = [
        ("orchestrator", "0014_artifacts"),
    ]

    operations = [
        migrations.RunPython(_run(PG_FORWARD), _run(PG_REVERSE)),
    ]
