"""SQL the ledger needs at run time, identical to what migration 0001 installed.

The prune needs it: on SQLite the DELETE guard is dropped inside the prune's transaction and
recreated from this text before it commits (`audit.services.audit_prune`). The migration keeps
its own frozen copy; `tests/audit/test_append_only.py` checks that the two still agree.
`audit_verify` uses `missing_guards` to say when someone has switched a guard off.
"""
from django.db import connection

SQLITE_NO_DELETE = (
    "CREATE TRIGGER audit_entry_no_delete BEFORE DELETE ON audit_entry "
    "BEGIN SELECT RAISE(ABORT, 'audit ledger is append-only: DELETE refused'); END"
)
GUARDS = {
    "postgresql": ("audit_entry_before_insert", "audit_entry_seal", "audit_entry_guard",
                   "audit_entry_no_truncate"),
    "sqlite": ("audit_entry_no_update", "audit_entry_no_delete", "audit_entry_delete_covered"),
}


def missing_guards() -> list[str]:
    """The ledger's triggers that are absent or disabled in this database."""
    expected = GUARDS.get(connection.vendor, ())
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT tgname FROM pg_trigger WHERE tgrelid = 'audit_entry'::regclass"
                           " AND NOT tgisinternal AND tgenabled <> 'D'")
        else:
            cursor.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'"
                           " AND tbl_name = 'audit_entry'")
        present = {row[0] for row in cursor.fetchall()}
    return [name for name in expected if name not in present]
