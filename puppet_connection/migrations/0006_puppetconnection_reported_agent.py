"""What a connection's bridge calls itself (its User-Agent's first product, `relay-bridge/0.1.0`),
shown on the connection's page. Empty until the bridge next calls. A platform or backend not
set is said so (it was 'unknown'): choices only, the table does not change."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("puppet_connection", "0005_platform_help_text"),
    ]

    operations = [
        migrations.AddField(
            model_name="puppetconnection",
            name="reported_agent",
            field=models.CharField(blank=True, editable=False, max_length=64),
        ),
        migrations.AlterField(
            model_name="puppetconnection",
            name="backend",
            field=models.CharField(
                blank=True,
                choices=[
                    ("", "not set"),
                    ("orchestrator", "the PE orchestrator"),
                    ("bolt", "Bolt"),
                    ("ssh", "SSH"),
                ],
                help_text="The orchestrator runs everything; Bolt runs on a list of nodes, and task runs; SSH runs only on a list of nodes.",
                max_length=16,
            ),
        ),
        migrations.AlterField(
            model_name="puppetconnection",
            name="platform",
            field=models.CharField(
                blank=True,
                choices=[("", "not set"), ("pe", "Puppet Enterprise"), ("oss", "open source Puppet")],
                help_text="On Puppet Enterprise a Puppet run (type run) needs an environment; open source Puppet (without a backend set) takes only runs on a list of nodes.",
                max_length=8,
            ),
        ),
        migrations.AlterField(
            model_name="puppetconnection",
            name="reported_platform",
            field=models.CharField(
                blank=True,
                choices=[("", "not set"), ("pe", "Puppet Enterprise"), ("oss", "open source Puppet")],
                editable=False,
                max_length=8,
            ),
        ),
    ]
