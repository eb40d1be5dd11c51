"""The reference store: the engine's rows read and written through Django's public ORM API
only (querysets, `save`, `bulk_create`, `QuerySet.update`).

It is what the fast store (`orchestrator.store.fast`) must give: the engine's suite runs on
both (`make test-stores`). Every write is sent when it is asked for, so a held-writes block
holds nothing and `flush` has nothing to send.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from django.db import DEFAULT_DB_ALIAS, models
from django.db.models import QuerySet
from django.utils.dateparse import parse_datetime
from django_fsm import ConcurrentTransitionMixin


class Read:
    """A read defined once by `build(*values) -> QuerySet`; `rows(*values)` lists its rows.

    The placeholders say the values' types (the fast store compiles the queryset with them);
    the values are given as the database takes them (`field.get_db_prep_value`), which on
    SQLite is text for a timestamp or a UUID: read back here into the placeholder's type, as
    a queryset's filters take it."""

    def __init__(self, build: Callable[..., QuerySet], *placeholders: Any) -> None:
        self._build = build
        self._types = [type(placeholder) for placeholder in placeholders]

    def rows(self, *values: Any, using: str = DEFAULT_DB_ALIAS) -> list[models.Model]:
        if len(values) != len(self._types):
            raise TypeError(f"this read takes {len(self._types)} values, {len(values)} given")
        given = [_as_python(kind, value) for kind, value in zip(self._types, values, strict=True)]
        return list(self._build(*given).using(using))


def _as_python(kind: type, value: Any) -> Any:
    if type(value) is not str or kind is str:
        return value
    if kind is datetime:  # the database's text of an aware value, in UTC
        parsed = parse_datetime(value)
        return parsed if parsed is None or parsed.tzinfo else parsed.replace(tzinfo=UTC)
    if kind is UUID:
        return UUID(value)
    return value


def read_together(*reads: tuple[Read, tuple], using: str = DEFAULT_DB_ALIAS) -> list[list[models.Model]]:
    """The rows of each `(read, values)`, read one after the other in the order given."""
    return [read.rows(*values, using=using) for read, values in reads]


def build_row(model: type[models.Model], /, **fields: Any) -> models.Model:
    """A new, unsaved row: `model(**fields)`."""
    return model(**fields)


def insert_rows(objs: list[models.Model], *, using: str = DEFAULT_DB_ALIAS, keys: bool = True) -> None:
    """Insert `objs`, new rows of one model, each given the key the database made for it.

    A state machine's rows are saved one by one (`save(force_insert=True)`): django-fsm notes
    the state each is saved in, which guards its next save."""
    if not objs:
        return
    model = type(objs[0])
    if issubclass(model, ConcurrentTransitionMixin):
        for obj in objs:
            obj.save(force_insert=True, using=using)
        return
    model._base_manager.using(using).bulk_create(objs)


def insert_json_rows(model: type[models.Model], rows: list[dict], *, using: str = DEFAULT_DB_ALIAS) -> bool:
    """False: the caller inserts instances (only the fast store inserts rows given as JSON)."""
    return False


def update_rows(model: type[models.Model], *, where: dict[str, Any], values: dict[str, Any],
                using: str = DEFAULT_DB_ALIAS, count: bool = True) -> int | None:
    """`model.objects.filter(**where).update(**values)`: the number of rows written (None
    with `count=False`)."""
    written = model._base_manager.using(using).filter(**where).update(**values)
    return written if count else None


def save_row(obj: models.Model, fields: tuple[str, ...] | list[str] | None = None) -> None:
    """`obj.save(update_fields=fields)`: django-fsm's guard refuses a row whose state moved."""
    obj.save(update_fields=fields)


@contextmanager
def held_writes(using: str = DEFAULT_DB_ALIAS, *, by: str = "") -> Iterator[None]:
    """Every write in the block is sent when it is asked for."""
    yield


def flush(using: str = DEFAULT_DB_ALIAS) -> None:
    """Nothing is held."""


def set_up() -> None:
    """Nothing to set up."""
