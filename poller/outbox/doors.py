"""The doors into the outbox: whatever connection an application holds, the same write.

A write into the outbox is one call of a function the migrations made
(db/sql/0026_doors.sql) in the caller's transaction; this module runs such calls on
every kind of connection an application may hold — and nothing here commits:

===========================================  =================================
connection                                    with
===========================================  =================================
SQLAlchemy ``Session``, ``Connection``         ``enqueue``, ``publish`` …
SQLAlchemy ``AsyncSession``, ``AsyncConnection``  ``enqueue_async`` …
psycopg 3 ``Connection``                       ``enqueue`` …
psycopg 3 ``AsyncConnection``                  ``enqueue_async`` …
asyncpg ``Connection`` (or a pool's)           ``enqueue_async`` …
psycopg2 connection                            ``enqueue`` …
Django's connection (``poller.contrib.django``)  ``enqueue`` …
===========================================  =================================

A :class:`Door` (or :class:`AsyncDoor`) runs a registered statement
(poller/store/queries/doors.py) in the driver's own parameter style, opens a savepoint
for a batch (a refusal then leaves the caller's transaction usable, and none of the
batch's rows), and turns the database's refusals (SQLSTATEs of class ``WP``) into
the errors of poller/errors.py, the same on every door. Rows come back as tuples.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Generator, Iterator, Mapping, Sequence
from typing import Any

from poller.errors import ConnectionNotSupported, PollerError, from_sqlstate
from poller.store.queries import Statement

SAVEPOINT = "poller_write"
Steps = Generator[tuple[Statement, Mapping[str, Any]], list[Sequence[Any]], Any]
"""A write's statements, sans I/O: each ``(statement, params)`` yielded gets its rows
back; what the generator returns is the write's result. One definition of a write
for the synchronous and the asynchronous doors."""
SYNC_KINDS = "a SQLAlchemy Session or Connection, a psycopg Connection or a psycopg2 connection"
ASYNC_KINDS = (
    "a SQLAlchemy AsyncSession or AsyncConnection, a psycopg AsyncConnection or an asyncpg "
    "Connection"
)


def refusal(exc: BaseException) -> PollerError | None:
    """The error of poller/errors.py a driver's exception is, if the database's doors
    raised it (a ``WP`` SQLSTATE): found on the exception, or what SQLAlchemy or Django
    wrapped in it."""
    seen: BaseException | None = exc
    for _ in range(4):
        if seen is None:
            return None
        code = getattr(seen, "sqlstate", None) or getattr(seen, "pgcode", None)
        if isinstance(code, str) and code.startswith("WP"):
            diag = getattr(seen, "diag", None)
            message = getattr(diag, "message_primary", None) or getattr(seen, "message", None)
            detail = getattr(diag, "message_detail", None) or getattr(seen, "detail", None)
            return from_sqlstate(code, str(message or seen), detail)
        seen = getattr(seen, "orig", None) or seen.__cause__
    return None


def _kind(conn: Any) -> str:
    module = type(conn).__module__
    top = module.partition(".")[0]  # psycopg's public classes say "psycopg"
    if top == "sqlalchemy":
        from sqlalchemy import Connection
        from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
        from sqlalchemy.orm import Session

        if isinstance(conn, Session | Connection):
            return "sqlalchemy"
        if isinstance(conn, AsyncSession | AsyncConnection):
            return "sqlalchemy-async"
    if top == "psycopg":
        import psycopg

        if isinstance(conn, psycopg.AsyncConnection):
            return "psycopg-async"
        if isinstance(conn, psycopg.Connection):
            return "psycopg"
    if top == "psycopg2":
        return "psycopg2"
    if top == "asyncpg":
        return "asyncpg"
    if top == "django" and hasattr(conn, "cursor") and hasattr(conn, "alias"):
        return "django"
    return type(conn).__qualname__


class Door:
    """A synchronous connection of any kind the module docstring lists."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.kind = _kind(conn)
        if self.kind not in ("sqlalchemy", "psycopg", "psycopg2", "django"):
            shown = (
                "an async one: use the _async function"
                if "async" in self.kind
                else (
                    self.kind
                    if self.kind != "asyncpg"
                    else "an asyncpg one: use the _async function"
                )
            )
            raise ConnectionNotSupported(f"takes {SYNC_KINDS}, not {shown}")

    def run(self, statement: Statement, params: Mapping[str, Any]) -> list[Sequence[Any]]:
        """The statement's rows; a refusal of the doors raises its error."""
        try:
            if self.kind == "sqlalchemy":
                return [tuple(row) for row in self.conn.execute(statement, params).all()]
            if self.kind == "psycopg":
                return list(self.conn.execute(statement.psycopg, params).fetchall())
            with contextlib.closing(self.conn.cursor()) as cursor:  # psycopg2, Django
                cursor.execute(statement.psycopg, params)
                return list(cursor.fetchall())
        except Exception as exc:
            if (error := refusal(exc)) is not None:
                raise error from None
            raise

    def drive(self, steps: Steps) -> Any:
        """Run a write's steps; return what they return."""
        rows: list[Sequence[Any]] | None = None
        try:
            while True:
                statement, params = steps.send(rows)  # type: ignore[arg-type]
                rows = self.run(statement, params)
        except StopIteration as done:
            return done.value

    @contextlib.contextmanager
    def savepoint(self) -> Iterator[None]:
        """A savepoint around a batch, when the connection is in a transaction: a refusal
        undoes the batch alone, and the caller's transaction goes on."""
        if self.kind == "sqlalchemy":
            with self.conn.begin_nested():
                yield
            return
        if self.kind == "django":
            from django.db import transaction

            with transaction.atomic(using=self.conn.alias):
                yield
            return
        if getattr(self.conn, "autocommit", False):  # one statement: atomic by itself
            yield
            return
        self._plain(f"SAVEPOINT {SAVEPOINT}")
        try:
            yield
        except BaseException:
            self._plain(f"ROLLBACK TO SAVEPOINT {SAVEPOINT}")
            raise
        self._plain(f"RELEASE SAVEPOINT {SAVEPOINT}")

    def _plain(self, sql: str) -> None:
        if self.kind == "psycopg":
            self.conn.execute(sql)
            return
        with contextlib.closing(self.conn.cursor()) as cursor:
            cursor.execute(sql)


class AsyncDoor:
    """An asynchronous connection of any kind the module docstring lists."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.kind = _kind(conn)
        if self.kind not in ("sqlalchemy-async", "psycopg-async", "asyncpg"):
            shown = (
                "a synchronous one: use the function without _async"
                if self.kind in ("sqlalchemy", "psycopg", "psycopg2", "django")
                else self.kind
            )
            raise ConnectionNotSupported(f"takes {ASYNC_KINDS}, not {shown}")

    async def run(self, statement: Statement, params: Mapping[str, Any]) -> list[Sequence[Any]]:
        """The statement's rows; a refusal of the doors raises its error."""
        try:
            if self.kind == "sqlalchemy-async":
                return [tuple(row) for row in (await self.conn.execute(statement, params)).all()]
            if self.kind == "psycopg-async":
                cursor = await self.conn.execute(statement.psycopg, params)
                return list(await cursor.fetchall())
            args = [params[name] for name in statement.order]
            return [tuple(record) for record in await self.conn.fetch(statement.asyncpg, *args)]
        except Exception as exc:
            if (error := refusal(exc)) is not None:
                raise error from None
            raise

    async def drive(self, steps: Steps) -> Any:
        """Run a write's steps; return what they return."""
        rows: list[Sequence[Any]] | None = None
        try:
            while True:
                statement, params = steps.send(rows)  # type: ignore[arg-type]
                rows = await self.run(statement, params)
        except StopIteration as done:
            return done.value

    @contextlib.asynccontextmanager
    async def savepoint(self) -> AsyncIterator[None]:
        """As :meth:`Door.savepoint`."""
        if self.kind == "sqlalchemy-async":
            async with self.conn.begin_nested():
                yield
            return
        if self.kind == "asyncpg":
            if not self.conn.is_in_transaction():  # one statement: atomic by itself
                yield
                return
            async with self.conn.transaction():  # nested: a savepoint
                yield
            return
        if self.conn.autocommit:
            yield
            return
        await self.conn.execute(f"SAVEPOINT {SAVEPOINT}")
        try:
            yield
        except BaseException:
            await self.conn.execute(f"ROLLBACK TO SAVEPOINT {SAVEPOINT}")
            raise
        await self.conn.execute(f"RELEASE SAVEPOINT {SAVEPOINT}")
