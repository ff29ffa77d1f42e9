"""The platform and backend become settings of the connection. What the bridge's headers
said is kept as `reported_*` (the columns renamed: existing rows keep their values), and
the settings start empty, which keeps today's behaviour until someone sets them."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("puppet_connection", "0002_puppetconnection_bridge_backend_and_more"),
    ]

    operations = [
        migrations.RenameField(model_name="puppetconnection", old_name="platform", new_name="reported_platform"),
        migrations.RenameField(model_name="puppetconnection", old_name="bridge_backend", new_name="reported_backend"),
        migrations.AddField(
            model_name="puppetconnection",
            name="platform",
            field=models.CharField(
                blank=True,
                choices=[("", "unknown"), ("pe", "Puppet Enterprise"), ("oss", "open source Puppet")],
                help_text="Puppet Enterprise needs an environment for every run; open source Puppet (without a"
                " backend set) takes only runs on a list of nodes.",
                max_length=8,
            ),
        ),
        migrations.AddField(
            model_name="puppetconnection",
            name="backend",
            field=models.CharField(
                blank=True,
                choices=[("", "unknown"), ("orchestrator", "the PE orchestrator"), ("bolt", "Bolt"), ("ssh", "SSH")],
                help_text="The orchestrator runs everything; Bolt runs on a list of nodes, and task runs; SSH"
                " runs only on a list of nodes.",
                max_length=16,
            ),
        ),
    ]
