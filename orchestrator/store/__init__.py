"""The store: how services read and write the engine's rows.

Services, selectors and the ledgers go through these functions; models stay plain Django
models and the entry points never come here. Which implementation runs them is chosen once,
by the setting `STEPWISE_STORE`:

- `"reference"` (`store.reference`): Django's public ORM API only.
- `"fast"` (`store.fast`, the default): the same rows written by statements compiled once;
  on PostgreSQL the writes a service does not read back are held and sent together (psycopg's
  pipeline mode), the last of them with the COMMIT.

Both give the same rows and raise the same errors; the engine's suite runs on each
(`make test-stores`). A block of held writes (`held_writes`) is a service's unit of work:
its writes are sent, and their errors raised, at `flush()`, at the block's end, before any
read of this store and before any statement Django sends itself.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from types import ModuleType
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, models
from django.db.models import QuerySet

STORES = ("reference", "fast")


@cache
def implementation() -> ModuleType:
    """The store `STEPWISE_STORE` names, imported once."""
    name = settings.STEPWISE_STORE
    if name == "fast":
        from . import fast
        return fast
    if name == "reference":
        from . import reference
        return reference
    raise ImproperlyConfigured(f"STEPWISE_STORE must be one of {', '.join(STORES)}, not {name!r}")


class Read:
    """A read defined once, `build(*values) -> QuerySet`, run with new values by `rows(*values)`.

    `placeholders` are values of the filters' types (the fast store compiles the queryset
    with them once per process). Values are given as the database takes them
    (`field.get_db_prep_value`), in the order the queryset's filters take them; only plain
    filters on model columns belong here (no expressions, no `IN` lists of varying length).
    """

    def __init__(self, build: Callable[..., QuerySet], *placeholders: Any) -> None:
        self._build = build
        self._placeholders = placeholders
        self._read = None

    def rows(self, *values: Any, using: str = DEFAULT_DB_ALIAS) -> list[models.Model]:
        """The instances the queryset gives for `values`."""
        return self._chosen().rows(*values, using=using)

    def _chosen(self):
        if self._read is None:
            self._read = implementation().Read(self._build, *self._placeholders)
        return self._read


def read_together(*reads: tuple[Read, tuple], using: str = DEFAULT_DB_ALIAS) -> list[list[models.Model]]:
    """The rows of each `(read, values)`, the reads sent together where the store can (the
    fast store on PostgreSQL: one round trip), run in the order given. Only for reads whose
    values do not depend on an earlier read's rows."""
    return implementation().read_together(*((read._chosen(), values) for read, values in reads), using=using)


def build_row(model: type[models.Model], /, **fields: Any) -> models.Model:
    """A new, unsaved row of `model` with `fields`, as `model(**fields)` builds it."""
    return implementation().build_row(model, **fields)


def insert_rows(objs: list[models.Model], *, using: str = DEFAULT_DB_ALIAS, keys: bool = True) -> None:
    """Insert `objs`, new rows of one model, each given the key the database made for it, as
    `bulk_create` does. `keys=False`: the caller reads none of the new keys now, so in a
    `held_writes` block the INSERT may be held (the keys are set when it is flushed)."""
    implementation().insert_rows(objs, using=using, keys=keys)


def insert_json_rows(model: type[models.Model], rows: list[dict], *, using: str = DEFAULT_DB_ALIAS) -> bool:
    """Insert `rows` of `model` given as JSON values (every column but the automatic key,
    timestamps and UUIDs as text) and return True; False when this store does not (the
    caller inserts instances). The new keys are not read; in a `held_writes` block the
    INSERT may be held until the COMMIT."""
    return implementation().insert_json_rows(model, rows, using=using)


def update_rows(model: type[models.Model], *, where: dict[str, Any], values: dict[str, Any],
                using: str = DEFAULT_DB_ALIAS, count: bool = True) -> int | None:
    """`model.objects.filter(**where).update(**values)` for plain values and equality filters
    on the model's own columns: the number of rows written. `count=False`: None, and in a
    `held_writes` block the UPDATE may be held."""
    return implementation().update_rows(model, where=where, values=values, using=using, count=count)


def save_row(obj: models.Model, fields: tuple[str, ...] | list[str] | None = None) -> None:
    """`obj.save(update_fields=fields)` (every column when None). A state machine's row
    (django-fsm's `ConcurrentTransitionMixin`) is written only while its state is the one it
    was read in: `ConcurrentTransition` otherwise. In a `held_writes` block the UPDATE may be
    held: then that error is raised where the block is flushed."""
    implementation().save_row(obj, fields)


@contextmanager
def held_writes(service: str, *, using: str = DEFAULT_DB_ALIAS) -> Iterator[None]:
    """`service`'s unit of work, inside its transaction: the writes in the block whose answer
    the service does not read may be held and sent together. They are sent, and what they
    raise is raised (with a note naming `service`), at `flush()`, at the block's end, before
    any read of this store or any statement Django sends; a block inside another is the outer
    one's."""
    with implementation().held_writes(using, by=service):
        yield


def flush(using: str = DEFAULT_DB_ALIAS) -> None:
    """Send the held writes now: the point where their errors (a constraint,
    `ConcurrentTransition`) are raised."""
    implementation().flush(using)


def set_up() -> None:
    """At start (`AppConfig.ready`): what the chosen store needs on each new connection."""
    implementation().set_up()
