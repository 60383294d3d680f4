"""The poller's revision 0027 (a broker URL's sealed credentials), by its own Alembic
scripts as 0001 does."""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations

POLLER_REVISION = "0027"


def upgrade(apps: Any, schema_editor: Any) -> None:
    from poller.contrib.django.schema import upgrade_database

    upgrade_database(schema_editor.connection)


class Migration(migrations.Migration):  # type: ignore[misc]
    atomic = False  # Alembic migrates on its own connection, in its own transactions
    dependencies: ClassVar[list[tuple[str, str]]] = [("poller", "0001_poller_tables")]
    operations: ClassVar[list[Any]] = [
        migrations.RunPython(upgrade, migrations.RunPython.noop, elidable=False)
    ]
