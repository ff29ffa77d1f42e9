"""A connection says whether its bridge has PuppetDB: open source Puppet then takes `query`
scopes. Off for every existing connection, which keeps today's behaviour."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("puppet_connection", "0003_platform_and_backend_settings"),
    ]

    operations = [
        migrations.AddField(
            model_name="puppetconnection",
            name="puppetdb",
            field=models.BooleanField(
                default=False,
                help_text="The bridge has PuppetDB (its puppetdb_url): open source Puppet then also takes runs"
                " whose scope is a PuppetDB query, which the bridge resolves to nodes.",
                verbose_name="PuppetDB",
            ),
        ),
    ]
