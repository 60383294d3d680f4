"""Database URLs and engines.

Users write ordinary ``postgresql://`` URLs; SQLAlchemy needs the driver named
(``postgresql+psycopg://``). When no URL is configured, the embedded server
under ``POLLER_DATA_DIR`` is started (or found running) and used.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

import psycopg
from psycopg import pq
from psycopg.rows import namedtuple_row, tuple_row
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from poller.errors import ConfigurationError
from poller.settings import Settings
from poller.store.queries import Statement

TRANSIENT: tuple[type[BaseException], ...] = (
    OperationalError,  # connection lost, server restarting, deadlock, lock or statement timeout
    InterfaceError,  # connection closed under us
    PoolTimeout,  # every pooled connection busy (or being re-established)
    psycopg.OperationalError,
    psycopg.InterfaceError,
    OSError,
)
"""Database errors worth retrying with backoff. Anything else (a ProgrammingError, a
DataError, a bug) is not transient: the loop that meets it crashes the service."""


def is_transient(exc: BaseException) -> bool:
    """True for the errors of a database that is away or busy, not of a wrong statement."""
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    return isinstance(exc, TRANSIENT)


_SCHEMES = {"postgres", "postgresql", "postgresql+psycopg", "postgresql+psycopg_async"}


def sqlalchemy_url(url: str) -> str:
    """``postgresql://…`` → ``postgresql+psycopg://…``; refuse anything not PostgreSQL."""
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise ConfigurationError(f"POLLER_DATABASE_URL: not a database URL ({exc})") from None
    if parsed.drivername not in _SCHEMES:
        raise ConfigurationError(
            f"POLLER_DATABASE_URL: must be a postgresql:// URL (got scheme {parsed.drivername!r})"
        )
    return parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


def libpq_url(url: str) -> str:
    """The plain libpq form of a URL, for psycopg.connect()."""
    return sqlalchemy_url(url).replace("postgresql+psycopg://", "postgresql://", 1)


def database_url(settings: Settings, *, create: bool = False) -> str:
    """The configured URL, or the embedded server's (started if it is stopped).

    Without ``POLLER_DATABASE_URL`` the embedded server is looked for as git
    looks for ``.git`` (poller/local/embedded.py ``default_data_dir``). A new, empty
    one is made only with ``create`` (``poller embedded start``, ``db upgrade``):
    any other command says there is none instead of starting an empty database.
    """
    if settings.database_url:
        return settings.database_url
    from poller.local.embedded import EmbeddedPostgres, default_data_dir

    data_dir = default_data_dir(settings.data_dir)
    server = EmbeddedPostgres(data_dir)
    if not create and not server.exists:
        raise ConfigurationError(
            f"no POLLER_DATABASE_URL, and no embedded PostgreSQL in {data_dir} or any folder "
            "above it: run `poller embedded start` (or `poller db upgrade`) there first"
        )
    return server.start()


def sync_engine(url: str, **kwargs: Any) -> Engine:
    """Engine for the CLI and admin paths (pre-ping: a stale pooled connection is replaced).

    Like every engine here it hides SQL parameters from errors: a failed
    ``INSERT`` of an endpoint would otherwise print its signing secret."""
    kwargs.setdefault("pool_pre_ping", True)
    kwargs.setdefault("hide_parameters", True)
    return create_engine(sqlalchemy_url(url), **kwargs)


def poller_engine(url: str, settings: Settings, **kwargs: Any) -> AsyncEngine:
    """The service's engine. Its sessions end any transaction left idle for
    max(5 s, lease TTL): a poller frozen mid-claim (SIGSTOP, a VM pause) would
    otherwise hold its shard's fence row locked and keep the next leader out.
    Behind PgBouncer in transaction mode set this on the role instead."""
    timeout_ms = int(max(5.0, settings.lease_ttl) * 1000)
    engine = async_engine(url, **kwargs)

    @event.listens_for(engine.sync_engine, "connect")
    def _session_settings(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute(f"SET idle_in_transaction_session_timeout = {timeout_ms}")
        cursor.close()
        dbapi_connection.commit()  # a SET in a transaction rolled back later would be undone

    return engine


_CHECKED: set[str] = set()  # statements whose columns fetch() has checked


async def fetch(
    conn: AsyncConnection,
    statement: Statement,
    params: Mapping[str, Any],
    *,
    columns: tuple[str, ...] | None = None,
) -> list[Any]:
    """Run ``statement`` (one of poller/store/queries/) on ``conn``'s psycopg connection
    itself, in the transaction ``conn`` has open; rows as named tuples — or, given the
    ``columns`` the statement must return (checked against what it did return), as plain
    tuples, which cost less per row.

    The claim path's statements go this way: SQLAlchemy's text() compilation and
    result processing cost about a third of what the driver does for the same
    statement (loadtest/claims.py measures both). A connection the statement found
    broken (not a deadlock or a timeout on a live one) is invalidated, as SQLAlchemy
    would have done, so the pool drops it.
    """
    raw = await conn.get_raw_connection()
    driver: psycopg.AsyncConnection[Any] = raw.driver_connection  # type: ignore[assignment]
    factory: Any = namedtuple_row if columns is None else tuple_row
    try:
        async with driver.cursor(row_factory=factory) as cursor:
            return await _rows(cursor, statement, params, columns)
    except (psycopg.OperationalError, psycopg.InterfaceError):
        if driver.broken or driver.closed:  # not for a deadlock or a timeout: the link is fine
            await conn.invalidate()
        raise


async def _rows(
    cursor: psycopg.AsyncCursor[Any],
    statement: Statement,
    params: Mapping[str, Any],
    columns: tuple[str, ...] | None,
) -> list[Any]:
    await cursor.execute(statement.psycopg, params)
    result = cursor.pgresult
    if result is None or result.status != pq.ExecStatus.TUPLES_OK:
        return []
    if columns is not None and statement.name not in _CHECKED:  # once: it costs
        got = tuple(c.name for c in cursor.description or ())
        if got != columns:  # pragma: no cover - a schema slip
            raise RuntimeError(f"{statement.name} returns {got}, expected {columns}")
        _CHECKED.add(statement.name)
    return await cursor.fetchall()


# Rows of the outbox move between its partial indexes at every claim and completion,
# leaving dead entries behind until a vacuum. A plain index scan marks the dead
# entries it meets, so the next scan skips them; a bitmap scan cannot, and the
# completion's read every dead entry of the in-flight index (7,500 for 155 live
# rows, 564 heap pages, in a 20,000-message drain). Both connections scan plainly.
QUEUE_SETTINGS = ("SET enable_bitmapscan = off",)
# A plan made once for all values is made with the statistics of that moment, and
# kept until they change: the first claim of a fresh poller may meet an empty outbox
# that autovacuum will not analyze for a minute, while a backlog arrives. Reading a
# whole table is the right plan for an empty one and the wrong one for every claim
# after it (a 20,000-message drain ran at half its rate, PostgreSQL at three times
# the CPU per delivery), so these plans read tables through their indexes wherever
# an index serves.
GENERIC_PLAN_SETTINGS = ("SET plan_cache_mode = force_generic_plan", "SET enable_seqscan = off")


async def autocommit_connection(
    url: str, *, generic_plans: bool = True
) -> psycopg.AsyncConnection[Any]:
    """A connection for :class:`Autocommit`: every statement prepared at once, and with
    ``generic_plans`` planned once (a generic plan), not at every claim — CLAIM_BATCH's
    custom plan took longer to make (0.9 ms) than to run (0.7 ms), and its shape depends
    on no value it is given. Without it PostgreSQL chooses, as on the engine's
    connections (COMPLETE_BATCH: its best join depends on how many outcomes come).

    Its time zone is UTC: psycopg then reads a ``timestamptz`` as a datetime in
    ``datetime.UTC``, a third cheaper than in the server's zone (a ``ZoneInfo``,
    even for ``Etc/UTC``), and so is every sum on it; the instant is the same."""
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    await conn.execute("SET TimeZone TO 'UTC'")
    for setting in QUEUE_SETTINGS + (GENERIC_PLAN_SETTINGS if generic_plans else ()):
        await conn.execute(setting)
    conn.prepare_threshold = 0
    return conn


class Autocommit:
    """An autocommit psycopg connection to an engine's database, for statements that are
    a transaction on their own: CLAIM_BATCH fences, claims and returns in one.

    Through the engine, the same statement paid for SQLAlchemy's pool and transaction
    and for two round trips more (BEGIN, COMMIT): about 1,440 µs of the poller's CPU
    for a 32-row claim, against about 500 µs on its own
    (docs/explanation/performance.md). The connection is opened on first
    use; one a statement found broken is dropped (the error is raised: the caller
    retries transient ones, and the next statement opens another). No transaction is
    ever left open on it: what it locks is held for one statement, or for the two of a
    governed claim (:meth:`fetch_then`), sent one after the other.
    """

    def __init__(self, engine: AsyncEngine, *, generic_plans: bool = True) -> None:
        self._url = libpq_url(engine.url.render_as_string(hide_password=False))
        self._generic_plans = generic_plans  # see autocommit_connection()
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._opening = asyncio.Lock()

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        async with self._opening:
            if self._conn is None or self._conn.closed:
                self._conn = await autocommit_connection(
                    self._url, generic_plans=self._generic_plans
                )
            return self._conn

    async def fetch(
        self,
        statement: Statement,
        params: Mapping[str, Any],
        *,
        columns: tuple[str, ...] | None = None,
    ) -> list[Any]:
        """:func:`fetch`, as one statement of its own (committed when it returns)."""
        conn = self._conn
        if conn is None or conn.closed:  # opened on first use, or again after a break
            conn = await self._connection()
        factory: Any = namedtuple_row if columns is None else tuple_row
        try:
            async with conn.cursor(row_factory=factory) as cursor:
                return await _rows(cursor, statement, params, columns)
        except (psycopg.OperationalError, psycopg.InterfaceError):
            if conn.broken or conn.closed:
                await self.close()
            raise

    async def fetch_then(
        self,
        statement: Statement,
        params: Mapping[str, Any],
        then: Statement,
        then_params: Callable[[list[Any]], Mapping[str, Any] | None],
        *,
        columns: tuple[str, ...] | None = None,
    ) -> list[Any]:
        """``statement``'s rows, and ``then`` with what ``then_params`` makes of them (None:
        nothing to run), in one transaction: committed when it returns, or rolled back
        whole. A governed claim and the spending of what it took (SPEND_TOKENS)."""
        conn = self._conn
        if conn is None or conn.closed:  # opened on first use, or again after a break
            conn = await self._connection()
        factory: Any = namedtuple_row if columns is None else tuple_row
        try:
            async with conn.transaction(), conn.cursor(row_factory=factory) as cursor:
                rows = await _rows(cursor, statement, params, columns)
                if (follow := then_params(rows)) is not None:
                    await _rows(cursor, then, follow, None)
            return rows
        except (psycopg.OperationalError, psycopg.InterfaceError):
            if conn.broken or conn.closed:
                await self.close()
            raise

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()


def async_engine(url: str, **kwargs: Any) -> AsyncEngine:
    """The poller's engine. No pre-ping: it would cost a round trip per transaction on the
    hot path; the service retries a transaction that meets a dropped connection instead."""
    kwargs.setdefault("pool_pre_ping", False)
    kwargs.setdefault("hide_parameters", True)  # no payload or secret in an error message
    return create_async_engine(sqlalchemy_url(url), **kwargs)
