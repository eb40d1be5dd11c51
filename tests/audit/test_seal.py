"""The seal on PostgreSQL (audit migration 0002): a transaction's first entry takes the chain
lock and reads the head; its next entries chain onto the head it carries, a head carried by
another transaction is never read, a savepoint rolled back gives its places back, and the seal's
UPDATE may change the chain fields only — from inside any trigger."""
import pytest
from django.db import DatabaseError, connection, transaction

from audit.chain import seal_pending, verify_ledger
from audit.models import AuditEntry
from audit.services import audit_record

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.skipif("connection.vendor != 'postgresql'",
                                 reason="the ledger is sealed by a trigger on PostgreSQL only")]


def record(n: int) -> AuditEntry:
    return audit_record(action="test.event", actor="service:test", subject_type="ledger",
                        subject_id=n, payload={"n": n})


def scalar(sql: str, params=()):
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()[0]


def chained(ids: list[int]) -> list[AuditEntry]:
    entries = sorted(AuditEntry.objects.filter(id__in=ids), key=lambda e: e.sequence)
    for before, after in zip(entries, entries[1:], strict=False):
        assert (after.sequence, after.prev_hash) == (before.sequence + 1, before.hash)
    return entries


def test_a_transactions_later_entries_chain_onto_the_head_it_carries():
    with transaction.atomic():
        record(0)  # a head to chain onto
    with transaction.atomic():
        ids = [record(n).id for n in (1, 2, 3)]
        seal_pending()
        carried = scalar("SELECT current_setting('stepwise.audit_head', true)")
        txid = scalar("SELECT txid_current()")
    last = chained(ids)[-1]
    assert carried == f"{txid}:{last.sequence}:{last.hash}"
    assert scalar("SELECT current_setting('stepwise.audit_head', true)") in ("", None)  # gone with it
    assert verify_ledger().ok


def test_a_head_carried_by_another_transaction_is_never_read():
    with transaction.atomic():
        record(1)
        other = scalar("SELECT txid_current()")
    with connection.cursor() as cursor:  # left for the session, as a careless SET would
        cursor.execute("SELECT set_config('stepwise.audit_head', %s, false)",
                       [f"{other}:999:{'f' * 64}"])
    try:
        with transaction.atomic():
            entry = record(2)
        entries = AuditEntry.objects.order_by("-sequence")[:2]
        assert entries[0].id == entry.id and entries[0].sequence == entries[1].sequence + 1
        assert entries[0].prev_hash == entries[1].hash
        assert verify_ledger().ok
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET stepwise.audit_head")


def test_a_savepoint_rolled_back_after_sealing_gives_its_places_back():
    with transaction.atomic():
        kept = record(1).id
        try:
            with transaction.atomic():
                record(2)
                seal_pending()  # sealed inside the savepoint: the head moved, and is carried
                raise RuntimeError("the savepoint is rolled back")
        except RuntimeError:
            pass
        after = record(3).id
    first, second = chained([kept, after])
    assert second.sequence == first.sequence + 1
    assert verify_ledger().ok


@pytest.mark.parametrize("change", ["payload = '{\"forged\": true}'", "actor = 'user:mallory'",
                                    "digest = repeat('0', 64)"])
def test_an_update_from_inside_a_trigger_may_change_the_chain_fields_only(change):
    """The guard lets the seal's UPDATE through (depth > 1, chain fields only); another
    trigger's UPDATE of an unsealed entry, changing anything else, is refused."""
    with connection.cursor() as cursor:
        cursor.execute("CREATE TEMP TABLE poke (entry_id bigint)")
        cursor.execute(f"""
            CREATE FUNCTION pg_temp.poke_entry() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                UPDATE audit_entry SET {change}, sequence = 7, prev_hash = 'p', hash = 'h'
                    WHERE id = NEW.entry_id;
                RETURN NULL;
            END $$""")
        cursor.execute("CREATE TRIGGER poke AFTER INSERT ON poke FOR EACH ROW "
                       "EXECUTE FUNCTION pg_temp.poke_entry()")
    try:
        with pytest.raises(DatabaseError, match="append-only: UPDATE refused"), transaction.atomic():
            entry = record(1)  # not sealed until COMMIT
            with connection.cursor() as cursor:
                cursor.execute("INSERT INTO poke VALUES (%s)", [entry.id])
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE poke")
            cursor.execute("DROP FUNCTION pg_temp.poke_entry()")
