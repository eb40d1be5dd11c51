"""The fast store: the engine's rows read and written by statements compiled once
(`compiled`), held writes sent together in psycopg's pipeline mode and with the COMMIT (the
engine `postgresql`), and what each new connection is given (`connection`).

It gives what `orchestrator.store.reference` gives; everything here is there only for speed.
Nothing outside `orchestrator.store` imports it (an import contract checks that).
"""
from __future__ import annotations

from django.db import DatabaseError, models

from .compiled import (
    CompiledRead,
    build_row,
    flush,
    insert_json_rows,
    insert_rows,
    read_together,
    update_row,
    update_rows,
    writes_behind,
)

Read = CompiledRead
held_writes = writes_behind

__all__ = ["Read", "build_row", "flush", "held_writes", "insert_json_rows", "insert_rows",
           "read_together", "save_row", "set_up", "update_rows"]


def save_row(obj: models.Model, fields: tuple[str, ...] | list[str] | None = None) -> None:
    """`obj.save(update_fields=fields)` (every column when None) of a saved row, with one
    UPDATE built once; a new row, or a whole save whose row is gone, goes through Django's save."""
    if obj._state.adding:
        obj.save(update_fields=fields)
        return
    if fields is not None:
        fields = tuple(fields)
        if not fields:
            return  # as Django: nothing to write
    if not update_row(obj, fields):
        if fields is not None:
            raise DatabaseError("Save with update_fields did not affect any rows.")
        obj.save()  # the row is gone: Django inserts it again


def set_up() -> None:
    """At start (`AppConfig.ready`): every new PostgreSQL connection is set up for this store."""
    from django.db.backends.signals import connection_created

    from .connection import set_up as set_up_connection

    connection_created.connect(set_up_connection, dispatch_uid="stepwise-fast-store")
