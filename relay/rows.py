"""Rows read with SQL written once per process, for the few hot paths where Django compiling
a query costs more than the database answering it: the step runtime API's credential and
what a step's spec is evaluated with (docs/performance.md "Performance": the credential's select_related
over five tables took 2.2 ms, of which its statement 0.55 ms, and 0.2 ms once prepared).

Values go through the converters the ORM applies to each field (a JSONField's decoding, the
backend's own), and instances are made as the ORM makes them (Model.from_db: the same
signals, the same state), so what a caller gets is what the queryset would have given.
Statements go through Django's cursor: its error mapping, its query log, any database.
"""

import functools
from collections.abc import Callable, Sequence
from typing import Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field, Model

Converter = Callable[[Any, Any, BaseDatabaseWrapper], Any]


class Columns:
    """Some of a model's columns (`names`, else its concrete fields but `exclude`) as
    `alias.column`, and a row's values back as Python values or as an instance (the fields
    not read left deferred, as QuerySet.only() leaves them)."""

    def __init__(
        self, model: type[Model], alias: str, names: Sequence[str] | None = None, exclude: Sequence[str] = ()
    ) -> None:
        self.model = model
        self.alias = alias
        self.fields: list[Field] = (
            [field for field in model._meta.concrete_fields if field.name not in exclude]
            if names is None
            else [model._meta.get_field(name) for name in names]  # type: ignore[misc]
        )
        self.attnames = [field.attname for field in self.fields]
        self.names_given = names is not None
        self.ordered = [f.attname for f in model._meta.concrete_fields if f.attname in self.attnames]
        self._converters: dict[str, list[tuple[int, list[Converter], Any]]] = {}

    def __len__(self) -> int:
        return len(self.fields)

    def sql(self, connection: BaseDatabaseWrapper) -> str:
        quote = connection.ops.quote_name
        return ", ".join(f"{self.alias}.{quote(field.column)}" for field in self.fields)

    def table(self, connection: BaseDatabaseWrapper) -> str:
        return f"{connection.ops.quote_name(self.model._meta.db_table)} {self.alias}"

    def values(self, row: Sequence[Any], start: int, connection: BaseDatabaseWrapper) -> list[Any]:
        """This model's values in `row` from `start` on, converted as the ORM converts them."""
        values = list(row[start : start + len(self.fields)])
        for index, converters, column in self._converters_for(connection):
            value = values[index]
            for converter in converters:
                value = converter(value, column, connection)
            values[index] = value
        return values

    def instance(self, row: Sequence[Any], start: int, connection: BaseDatabaseWrapper) -> Model:
        values = self.values(row, start, connection)
        if self.names_given:  # Model.from_db takes the values in the model's field order
            by_name = dict(zip(self.attnames, values, strict=True))
            return self.model.from_db(
                connection.alias, self.ordered, [by_name[attname] for attname in self.ordered]
            )
        return self.model.from_db(connection.alias, self.attnames, values)

    def _converters_for(self, connection: BaseDatabaseWrapper) -> list[tuple[int, list[Converter], Any]]:
        # What SQLCompiler.get_converters finds for these columns: the backend's and the
        # field's (from_db_value), worked out once per database.
        kept = self._converters.get(connection.alias)
        if kept is None:
            kept = []
            for index, field in enumerate(self.fields):
                column = field.get_col(self.alias)
                found = connection.ops.get_db_converters(column) + column.get_db_converters(connection)
                if found:
                    kept.append((index, found, column))
            self._converters[connection.alias] = kept
        return kept


class Select:
    """`SELECT <names> FROM <model's table> WHERE <where[0]> = %s AND …`: the rows' values,
    converted, or (`instances`) the model's instances with those fields loaded, the others
    deferred. Filters compare fields (a foreign key by its column) with values prepared as
    the ORM prepares them (a UUID as SQLite keeps it). `lock`: FOR UPDATE, where the database
    has it (select_for_update's rule: SQLite, which locks the whole database at BEGIN
    IMMEDIATE, does not)."""

    def __init__(
        self, model: type[Model], names: Sequence[str] | None, where: Sequence[str], lock: bool = False
    ) -> None:
        self.columns = Columns(model, "t", names)
        self.where: list[Field] = [model._meta.get_field(name) for name in where]  # type: ignore[misc]
        self.lock = lock
        self.statements: dict[str, str] = {}

    def _rows(self, values: Sequence[Any]) -> tuple[BaseDatabaseWrapper, list[tuple[Any, ...]]]:
        using = self.columns.model._default_manager.db
        connection = connections[using]
        sql = self.statements.get(using)
        if sql is None:
            quote = connection.ops.quote_name
            conditions = " AND ".join(f"t.{quote(field.column)} = %s" for field in self.where)
            lock = " FOR UPDATE" if self.lock and connection.features.has_select_for_update else ""
            sql = self.statements[using] = (
                f"SELECT {self.columns.sql(connection)} FROM {self.columns.table(connection)}"  # noqa: S608
                f" WHERE {conditions}{lock}"
            )
        pairs = zip(self.where, values, strict=True)
        params = [field.get_db_prep_value(value, connection) for field, value in pairs]
        return connection, fetch(using, sql, params)

    def __call__(self, *values: Any) -> list[list[Any]]:
        connection, found = self._rows(values)
        return [self.columns.values(row, 0, connection) for row in found]

    def instances(self, *values: Any) -> list[Model]:
        connection, found = self._rows(values)
        return [self.columns.instance(row, 0, connection) for row in found]


class Chain:
    """`model`'s row whose `where` field is %s, with the rows its foreign keys lead to one
    after the other (`links`: a step run's run, then that run's workflow), as
    select_related("run__workflow") loads them, in one statement written once per database.
    `exclude`: fields of a model left deferred. The models along the chain are looked up at
    first use, when every app is loaded (a link to the user model is a name until then)."""

    def __init__(
        self,
        model: type[Model],
        links: Sequence[str],
        where: str,
        exclude: dict[type[Model], Sequence[str]] | None = None,
    ) -> None:
        self.model, self.link_names, self.where_name = model, tuple(links), where
        self.exclude = exclude or {}
        self.statements: dict[str, str] = {}

    @functools.cached_property
    def links(self) -> list[Any]:
        found, model = [], self.model
        for name in self.link_names:
            field = model._meta.get_field(name)
            found.append(field)
            model = field.related_model  # type: ignore[assignment]
        return found

    @functools.cached_property
    def columns(self) -> list[Columns]:
        chain: list[type[Model]] = [self.model, *(link.related_model for link in self.links)]
        return [Columns(m, f"t{i}", exclude=self.exclude.get(m, ())) for i, m in enumerate(chain)]

    @functools.cached_property
    def where(self) -> Field:
        return self.model._meta.get_field(self.where_name)  # type: ignore[return-value]

    def sql(self, connection: BaseDatabaseWrapper) -> str:
        sql = self.statements.get(connection.alias)
        if sql is None:
            quote = connection.ops.quote_name
            joins = "".join(
                f" INNER JOIN {to.table(connection)}"
                f" ON {to.alias}.{quote(link.target_field.column)} = {source.alias}.{quote(link.column)}"
                for source, to, link in zip(self.columns[:-1], self.columns[1:], self.links, strict=True)
            )
            first = self.columns[0]
            sql = self.statements[connection.alias] = (
                f"SELECT {', '.join(c.sql(connection) for c in self.columns)}"  # noqa: S608
                f" FROM {first.table(connection)}{joins} WHERE {first.alias}.{quote(self.where.column)} = %s"
            )
        return sql

    def __call__(self, value: Any) -> Model | None:
        using = self.model._default_manager.db
        connection = connections[using]
        found = fetch(using, self.sql(connection), [self.where.get_db_prep_value(value, connection)])
        if not found:
            return None  # `where` is meant to be unique: one row or none
        chain, start = [], 0
        for columns in self.columns:
            chain.append(columns.instance(found[0], start, connection))
            start += len(columns)
        for link, source, to in zip(self.links, chain[:-1], chain[1:], strict=True):
            link.set_cached_value(source, to)
            if link.one_to_one:  # as select_related, the other side too (a step run's credential)
                link.remote_field.set_cached_value(to, source)
        return chain[0]


def fetch(using: str, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
    connection = connections[using]
    with _prepared_cursor(connection) if _prepares(connection) else connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def _prepares(connection: BaseDatabaseWrapper) -> bool:
    # Not while queries are logged (DEBUG, a test counting them): a prepared statement's
    # execution leaves psycopg no text for Django's log.
    if connection.vendor != "postgresql" or connection.queries_logged:
        return False
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    return is_psycopg3


def _prepared_cursor(connection: BaseDatabaseWrapper) -> Any:
    """Django's cursor (its error mapping, its query log) over a psycopg 3 cursor that binds
    on the server and prepares each statement the first time its connection sees it, as the
    asynchronous pool's do (relay.adb): PostgreSQL then neither parses nor plans it again.
    Django's own cursors bind on the client, which never prepares, so only these do."""
    from django.db.backends.postgresql.base import ServerBindingCursor

    connection.ensure_connection()
    with connection.wrap_database_errors:
        raw = connection.connection
        if raw.prepare_threshold is None:  # Django's default: nothing prepared
            raw.prepare_threshold = 0
        return connection._prepare_cursor(ServerBindingCursor(raw))
