"""DRF's authtoken kept API keys in the clear (and its admin listed them). Each key becomes a
digest-only user token (relay.models.UserToken, `legacy`), so it keeps working, and DRF's
table, its migration records and its content types go. A key not in DRF's own format (40
hex digits; an admin could type any) is revoked instead, and said so."""

import logging
import re

from django.apps.registry import Apps
from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor

from relay import tokens

log = logging.getLogger(__name__)
DRF_TABLE = "authtoken_token"
DRF_KEY_RE = re.compile(r"^[0-9a-f]{40}$")  # as relay.models.LEGACY_KEY_RE, which may change


def digest_drf_keys(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    connection = schema_editor.connection
    if DRF_TABLE not in connection.introspection.table_names():
        return  # a database made after DRF's authtoken left
    UserToken = apps.get_model("relay", "UserToken")
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT key, user_id, created FROM {schema_editor.quote_name(DRF_TABLE)}")
        rows = cursor.fetchall()
    pepper_id = tokens.current_pepper_id()
    lookups = set(UserToken.objects.values_list("token_lookup", flat=True))
    for key, user_id, created in rows:
        lookup = key[: tokens.LOOKUP_LENGTH]
        if not DRF_KEY_RE.match(key) or lookup in lookups:
            log.warning("the API key of user id %s is revoked (not DRF's format): make a new one", user_id)
            continue
        lookups.add(lookup)
        UserToken.objects.create(
            owner_id=user_id,
            name="API key from before",
            created=created,
            legacy=True,
            token_lookup=lookup,
            token_pepper_id=pepper_id,
            token_digest=tokens.digest(key, pepper_id),
        )
    schema_editor.execute(schema_editor.sql_delete_table % {"table": schema_editor.quote_name(DRF_TABLE)})
    with connection.cursor() as cursor:
        # Were authtoken installed again, it would make its table afresh.
        cursor.execute("DELETE FROM django_migrations WHERE app = %s", ["authtoken"])
    apps.get_model("contenttypes", "ContentType").objects.filter(app_label="authtoken").delete()


class Migration(migrations.Migration):
    dependencies = [
        ("relay", "0001_user_tokens"),
        # For the content types' delete to reach their permissions and admin log entries.
        ("contenttypes", "0002_remove_content_type_name"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("admin", "0003_logentry_add_action_flag_choices"),
    ]

    operations = [migrations.RunPython(digest_drf_keys, migrations.RunPython.noop)]
