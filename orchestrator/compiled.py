"""Reads on the engine's hot path, compiled by the ORM once per connection and then run with
new values.

Every transition of a run locks it and reads its steps. Building those querysets (joins,
deferred fields, the lock clause) and compiling them cost the worker more CPU than the database
spent running them. A `CompiledRead` keeps what the ORM computed for one such queryset: the
statement, the converters of its columns and how the columns map onto the models that
`select_related` joins. Each call sends the statement with its own values and builds the
instances as `QuerySet.__iter__` would.

It must not change what a read returns: `tests/engine/test_compiled.py` compares every compiled
read with its queryset. Only filters whose values are plain parameters belong here (no
expressions, no `IN` lists whose length varies).
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import Model, QuerySet
from django.db.models.query import get_related_populators
from django.db.transaction import TransactionManagementError


@dataclass(frozen=True)
class _Plan:
    sql: str
    arity: int
    model: type[Model]
    init_list: list[str]
    span: slice
    converters: dict
    populators: list
    compiler: Any
    locks: bool


class CompiledRead:
    """`build(*placeholders)` once per connection, then `rows(*values)` with the values in the
    order the queryset's filters take them.

    The placeholders only have to be of the filters' types: their values are replaced. Compiling
    needs what running the queryset needs (a transaction, for `select_for_update`).
    """

    def __init__(self, build: Callable[..., QuerySet], *placeholders: Any) -> None:
        self._build = build
        self._placeholders = placeholders
        self._plans = threading.local()  # a connection belongs to one thread

    def rows(self, *values: Any, using: str = DEFAULT_DB_ALIAS) -> list[Model]:
        """The instances the queryset would give for `values` (already in the database's form:
        `field.get_db_prep_value`, where Python's differs)."""
        connection = connections[using]
        plan = self._plan(connection, using)
        if plan.locks and connection.get_autocommit():
            # What the queryset raises: a row lock outside a transaction is released at once.
            raise TransactionManagementError("select_for_update cannot be used outside of a transaction.")
        if len(values) != plan.arity:
            raise TypeError(f"this read takes {plan.arity} values, {len(values)} given")
        with connection.cursor() as cursor:
            cursor.execute(plan.sql, values)
            fetched = cursor.fetchall()
        if plan.converters:
            fetched = plan.compiler.apply_converters(fetched, plan.converters)
        found = []
        for row in fetched:
            obj = plan.model.from_db(using, plan.init_list, row[plan.span])
            for populator in plan.populators:
                populator.populate(row, obj)
            found.append(obj)
        return found

    def _plan(self, connection, using: str) -> _Plan:
        plans = self._plans.__dict__
        key = (using, id(connection), connection.vendor)
        plan = plans.get(key)
        if plan is None:
            plan = plans[key] = self._compile(using)
        return plan

    def _compile(self, using: str) -> _Plan:
        queryset = self._build(*self._placeholders)
        compiler = queryset.query.get_compiler(using=using)
        sql, params = compiler.as_sql()
        if compiler.annotation_col_map or compiler.has_extra_select or queryset._prefetch_related_lookups:
            raise ValueError("a compiled read holds model columns only")
        select, klass_info = compiler.select, compiler.klass_info
        first, last = klass_info["select_fields"][0], klass_info["select_fields"][-1] + 1
        fields = [column[0] for column in select[0:compiler.col_count]]
        return _Plan(
            sql=sql, arity=len(params), model=klass_info["model"],
            init_list=[column[0].target.attname for column in select[first:last]],
            span=slice(first, last), converters=compiler.get_converters(fields),
            populators=get_related_populators(klass_info, select, using), compiler=compiler,
            locks=bool(queryset.query.select_for_update))

