"""Every SQL statement the runtime issues, named, with what it guarantees.

Statements use ``:name`` parameters and ``CAST(… AS …)`` (never ``::``) so the
same text runs through SQLAlchemy's ``text()`` and, after a mechanical rewrite,
through plain psycopg (see loadtest/claims.py, which measures the difference).
Batches travel as arrays or one JSON document and are unnested server-side:
one statement per batch, never one per row.

Each is a :class:`Statement` (SQLAlchemy ``text()`` with its name and its
psycopg text), passed by object: ``conn.execute(queries.ENQUEUE_ONE, …)``,
``db.fetch(conn, queries.CLAIM_BATCH, …)``. ``STATEMENTS`` maps each name to
its SQL; tests/integration/test_queries.py runs every one against the
migrated schema.

The statements live in one module per part of the flow — ``enqueue``,
``claims``, ``health``, ``cluster`` (election, shards), ``maintenance``, ``ordering``,
``publish`` (fan-out, replay), ``reports`` (operational events, stats), ``cancel``
(operators' holds: cancel, pause), ``endpoints`` (the registry), ``tokens`` (the
API's tokens), ``requests`` (the API's idempotency keys, opened portal links) — and are all
reachable here as ``queries.NAME``.

Statements whose shape depends on what is asked (a list's filters, the fields an
update changes) are built with SQLAlchemy Core, each by a function (or a constant) of
the module of its concern, with a comment saying what it reads or writes — ``admin``
(the operators' lists, retry, purge: Core only), ``catalog`` (Core only), ``cancel``,
``endpoints`` (the registry and its keys), ``reports`` (stats) — and reached through
that module (``queries.endpoints.page(…)``); a module holding both lists its text
statements in ``__all__``. No module outside
poller/store builds a statement (tests/unit/test_imports.py checks it).
"""

from __future__ import annotations

from poller.store.queries._registry import STATEMENTS, Statement
from poller.store.queries.cancel import *  # noqa: F403
from poller.store.queries.claims import *  # noqa: F403
from poller.store.queries.cluster import *  # noqa: F403
from poller.store.queries.doors import *  # noqa: F403
from poller.store.queries.endpoints import *  # noqa: F403
from poller.store.queries.enqueue import *  # noqa: F403
from poller.store.queries.health import *  # noqa: F403
from poller.store.queries.maintenance import *  # noqa: F403
from poller.store.queries.ordering import *  # noqa: F403
from poller.store.queries.publish import *  # noqa: F403
from poller.store.queries.reports import *  # noqa: F403
from poller.store.queries.requests import *  # noqa: F403
from poller.store.queries.tokens import *  # noqa: F403

__all__ = ["STATEMENTS", "Statement"]
