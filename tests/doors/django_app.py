"""A Django process on an empty database, as a new project meets the poller: ``check``
warns, ``migrate`` makes the tables, ``transaction.atomic()`` commits a message or rolls
it back. Run by test_django.py (a process of its own: Django's settings are global),
on Django's psycopg2 backend when the first argument says so. Prints JSON."""

from __future__ import annotations

import io
import json
import sys

from sqlalchemy.engine import make_url


def main(url: str, driver: str) -> None:
    if driver == "psycopg2":  # Django takes psycopg 3 when it can import it
        sys.modules["psycopg"] = None  # type: ignore[assignment]
        import django.db.backends.postgresql.base

        del sys.modules["psycopg"]
    import django
    from django.conf import settings

    u = make_url(url)
    settings.configure(
        USE_TZ=True,
        INSTALLED_APPS=["poller.contrib.django"],
        DATABASES={"default": {
            "ENGINE": "django.db.backends.postgresql", "NAME": u.database, "HOST": u.host,
            "PORT": str(u.port), "USER": u.username, "PASSWORD": u.password or "",
        }},
    )  # fmt: skip
    django.setup()
    from django.core.management import call_command
    from django.db import connection, transaction

    from poller.contrib import django as outbox

    def check() -> str:
        said = io.StringIO()
        call_command("check", stderr=said, stdout=said)  # as a new project runs it
        return said.getvalue()

    before = check()
    call_command("migrate", "poller", verbosity=0)
    after = check()
    from poller.endpoints.registry import create_endpoint
    from poller.store.db import sync_engine

    engine = sync_engine(url)
    with engine.begin() as conn:
        create_endpoint(conn, "billing", "http://127.0.0.1:9/billing")
    engine.dispose()
    message = {"endpoint": "billing", "event_type": "order.paid", "payload": {"id": 1}}
    with transaction.atomic():
        kept = outbox.enqueue(**message, idempotency_key="kept")
    with transaction.atomic():
        outbox.enqueue(**message, idempotency_key="undone")
        transaction.set_rollback(True)
    with connection.cursor() as cursor:
        cursor.execute("SELECT id, idempotency_key FROM poller_outbox")
        rows = cursor.fetchall()
    print(json.dumps({
        "driver": type(connection.connection).__module__, "before": before, "after": after,
        "kept": kept, "rows": rows,
    }))  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
