"""Django's PostgreSQL engine; the writes the fast store holds go before any statement Django
sends (its cursors send them first) and with the transaction's COMMIT (one pipeline) instead
of in a round trip of their own. Nothing else differs."""
from django.db.backends.postgresql import base
from django.db.backends.utils import CursorDebugWrapper, CursorWrapper

from .. import compiled


class DatabaseWrapper(base.DatabaseWrapper):
    # Read by `writes_behind`: writes may be held on this engine, whose cursors and COMMIT send them.
    holds_writes = True

    def make_cursor(self, cursor):
        return _SendsHeldFirst(cursor, self)

    def make_debug_cursor(self, cursor):
        return _SendsHeldFirstLogged(cursor, self)

    def _commit(self):
        if self.connection is None or not compiled.commit_behind(self):
            super()._commit()

    def _rollback(self):
        compiled.forget_behind(self)
        super()._rollback()

    def _close(self):
        compiled.forget_behind(self)
        super()._close()


class _HeldFirst:
    """Django's cursor: the store's held writes are sent, and answered, before its statement,
    so the database runs every statement in the order the service asked for it."""

    def execute(self, sql, params=None):
        compiled.flush_on(self.db)
        return super().execute(sql, params)

    def executemany(self, sql, param_list):
        compiled.flush_on(self.db)
        return super().executemany(sql, param_list)


class _SendsHeldFirst(_HeldFirst, CursorWrapper):
    pass


class _SendsHeldFirstLogged(_HeldFirst, CursorDebugWrapper):
    """`_SendsHeldFirst`, logging its statements (DEBUG, `CaptureQueriesContext`)."""
