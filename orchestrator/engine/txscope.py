"""Values that live exactly as long as the current transaction's work that set them.

A `TransactionMemo` remembers something true only inside the transaction that made it true
(the audit chain's head after this transaction's last append on SQLite; that this transaction
already sent its NOTIFY), so the next use in the same transaction need not ask the database
again. It must forget on every way that work can be undone or end: a commit, a rollback, and a
rollback to a savepoint taken before the value was set.

Django already tracks exactly that for `transaction.on_commit` callbacks: one registered inside
a savepoint is dropped when the savepoint rolls back, and all are dropped (or run) when the
transaction ends. So the memo registers a no-op marker with `on_commit` when it is set, and is
valid only while that marker is still pending. This module must not touch the database itself.
"""
from __future__ import annotations

from django.db import connection, transaction


class TransactionMemo:
    """One value per connection, valid until the transaction (or the savepoint) that set it
    ends. `get()` returns None outside a transaction or once the value no longer holds."""

    def __init__(self, name: str) -> None:
        self.attr = f"_stepwise_memo_{name}"

    def get(self):
        held = getattr(connection, self.attr, None)
        if held is None or not connection.in_atomic_block:
            return None
        marker, index, value = held
        pending = connection.run_on_commit
        # Callbacks are only appended, or filtered out by a savepoint rollback: the marker is
        # still at its index exactly when nothing registered before it was dropped.
        if index < len(pending) and pending[index][1] is marker:
            return value
        setattr(connection, self.attr, None)
        return None

    def set(self, value) -> None:
        """Remember `value` for the rest of the current transaction (it must be in one)."""
        if not connection.in_atomic_block:
            return
        def marker() -> None:
            """A pending on-commit callback that does nothing: its presence is what matters
            (a new function each time, so each `set` is told apart by identity)."""

        transaction.on_commit(marker)
        setattr(connection, self.attr, (marker, len(connection.run_on_commit) - 1, value))
