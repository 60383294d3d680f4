"""The poller's tables, made by its own Alembic scripts (what ``poller db upgrade``
runs) in the database Django migrates. A release of webhook-poller with a new Alembic
revision adds a Django migration here that runs them again (tests/doors check that the
newest names :data:`poller.store.migrate.HEAD`), so ``manage.py migrate`` keeps the tables
current. Unapplying leaves the tables: ``poller db downgrade`` removes them on purpose."""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations

POLLER_REVISION = "0026"


def upgrade(apps: Any, schema_editor: Any) -> None:
    from poller.contrib.django.schema import upgrade_database

    upgrade_database(schema_editor.connection)


class Migration(migrations.Migration):  # type: ignore[misc]
    initial = True
    atomic = False  # Alembic migrates on its own connection, in its own transactions
    dependencies: ClassVar[list[tuple[str, str]]] = []
    operations: ClassVar[list[Any]] = [
        migrations.RunPython(upgrade, migrations.RunPython.noop, elidable=False)
    ]
