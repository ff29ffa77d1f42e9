"""Output metadata moves from the step's credential to the step run (workflows 0006), so that
whatever shows a step's outputs masks its sensitive ones from the same row."""

from typing import Any

from django.db import migrations


def to_the_step(apps: Any, schema_editor: Any) -> None:
    StepCredential = apps.get_model("stepruntime", "StepCredential")
    StepRun = apps.get_model("workflows", "StepRun")
    for credential in StepCredential.objects.exclude(output_metadata={}).iterator():
        step = StepRun.objects.get(pk=credential.step_run_id)
        step.output_metadata = {**credential.output_metadata, **(step.output_metadata or {})}
        step.save(update_fields=["output_metadata"])


def to_the_credential(apps: Any, schema_editor: Any) -> None:
    StepCredential = apps.get_model("stepruntime", "StepCredential")
    StepRun = apps.get_model("workflows", "StepRun")
    for step in StepRun.objects.exclude(output_metadata={}).iterator():
        StepCredential.objects.filter(step_run_id=step.pk).update(output_metadata=step.output_metadata)


class Migration(migrations.Migration):
    dependencies = [
        ("stepruntime", "0002_step_output_metadata"),
        ("workflows", "0006_step_output_metadata"),
    ]

    operations = [
        migrations.RunPython(to_the_step, to_the_credential),
        migrations.RemoveField(model_name="stepcredential", name="output_metadata"),
    ]
