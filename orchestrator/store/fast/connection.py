"""What the fast store sets up on each new PostgreSQL connection (`connection_created`).

- Timestamps read by psycopg's C loader: Django registers a loader of its own that derives
  from psycopg's pure-Python one (Django ticket #36960: the C class cannot be subclassed), so
  with the C implementation installed every `timestamptz` was still parsed in Python.
- psycopg's cache of parsed statements raised to hold the compiled INSERTs: psycopg caches
  how it parses placeholders only for statements of at most `MAX_CACHED_STATEMENT_PARAMS`
  values, so that an ORM's INSERTs of any number of rows do not fill its cache; the compiled
  ones are a bounded set (a statement per model and row count up to `MAX_COMPILED_ROWS`).

Both touch psycopg internals (docs/architecture.md, "What the fast store relies on"); each
raises when they are not what it expects, and tests/store/test_internals.py checks them.
"""
from __future__ import annotations

from datetime import datetime
from functools import cache

from django.conf import settings

from .compiled import MAX_COMPILED_ROWS

# The widest model's largest compiled INSERT (a ledger entry has 25 columns).
CACHED_PARAMS = MAX_COMPILED_ROWS * 32


def set_up(sender=None, connection=None, **kwargs) -> None:
    """`connection_created` receiver: prepare a new PostgreSQL connection for the fast store."""
    if connection is None or connection.vendor != "postgresql":
        return
    let_psycopg_cache_compiled_statements()
    if settings.USE_TZ:
        read_timestamps_in_c(connection)


def let_psycopg_cache_compiled_statements() -> None:
    """Raise psycopg's bound on the values of a statement whose parsing it caches."""
    from psycopg import _queries

    if not isinstance(_queries.MAX_CACHED_STATEMENT_PARAMS, int):
        raise RuntimeError("psycopg._queries.MAX_CACHED_STATEMENT_PARAMS changed: see "
                           "docs/architecture.md, 'What the fast store relies on'")
    if _queries.MAX_CACHED_STATEMENT_PARAMS < CACHED_PARAMS:
        _queries.MAX_CACHED_STATEMENT_PARAMS = CACHED_PARAMS


def read_timestamps_in_c(connection) -> None:
    """A connection's `timestamptz` columns read by the driver's C loader, then given the
    connection's time zone as Django's own loader gives it. Without psycopg's C
    implementation, Django's loader stays."""
    from psycopg.postgres import adapters, types
    from psycopg.pq import Format

    oid = types["timestamptz"].oid
    optimised = adapters.get_loader(oid, Format.TEXT)
    if optimised is None or optimised.__module__.startswith("psycopg."):
        return  # the pure-Python implementation: nothing faster to delegate to
    connection.connection.adapters.register_loader(
        "timestamptz", _timestamptz_loader(optimised, connection.timezone))


@cache
def _timestamptz_loader(optimised: type, timezone) -> type:
    """A loader giving what Django's `BaseTzLoader` gives: the value parsed (here by
    `optimised`, in the connection's time zone), then `.replace(tzinfo=timezone)`."""
    from psycopg.adapt import Loader

    class TimestamptzLoader(Loader):
        # Django's `create_cursor` compares this with the connection's own time zone and
        # registers its loader again, per cursor, where they differ.
        timezone = None

        def __init__(self, oid: int, context=None) -> None:
            super().__init__(oid, context)
            self._parse = optimised(oid, context).load

        def load(self, data) -> datetime:
            return self._parse(data).replace(tzinfo=self.timezone)

    TimestamptzLoader.timezone = timezone
    return TimestamptzLoader
