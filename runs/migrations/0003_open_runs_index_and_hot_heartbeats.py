"""Heartbeats as HOT updates: no index on a column a heartbeat writes (the expiry sweep finds
open runs by a partial index on their status), and room on each page of runs_run for the
new version of a row (fillfactor 80, PostgreSQL only; pages written from now on)."""

from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps


def set_fillfactor(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor, value: int | None = 80) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    table = schema_editor.quote_name("runs_run")
    if value is None:
        schema_editor.execute(f"ALTER TABLE {table} RESET (fillfactor)")
    else:
        schema_editor.execute(f"ALTER TABLE {table} SET (fillfactor = {int(value)})")


def reset_fillfactor(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    set_fillfactor(apps, schema_editor, None)


class Migration(migrations.Migration):
    dependencies = [
        ("puppet_connection", "0002_puppetconnection_bridge_backend_and_more"),
        ("runs", "0002_accepted_at_and_stored_results"),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="run",
            name="runs_run_status_b5cad3_idx",
        ),
        migrations.RemoveIndex(
            model_name="run",
            name="runs_run_status_a7f069_idx",
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                condition=models.Q(("status__in", ("pending", "accepted", "in-progress"))),
                fields=["status"],
                name="runs_run_open_idx",
            ),
        ),
        migrations.RunPython(set_fillfactor, reset_fillfactor),
    ]
