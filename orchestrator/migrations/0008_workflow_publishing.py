"""Workflows get a published version, a publish-on-save policy and an archive date.

Each existing workflow publishes its latest version, which is what its runs started until now.
"""
import django.db.models.deletion
from django.db import migrations, models


def publish_latest(apps, schema_editor):
    Workflow = apps.get_model("orchestrator", "Workflow")
    for workflow in Workflow.objects.all():
        latest = workflow.versions.order_by("-number").first()
        if latest is not None:
            Workflow.objects.filter(pk=workflow.pk).update(active_version=latest)


class Migration(migrations.Migration):

    dependencies = [
        ("orchestrator", "0007_team_membership_roles"),
    ]

    operations = [
        migrations.AddField(
            model_name="workflow",
            name="active_version",
            field=models.ForeignKey(
                blank=True, help_text="The version runs and triggers start (none: nothing published yet).",
                null=True, on_delete=django.db.models.deletion.PROTECT, related_name="+",
                to="orchestrator.workflowversion"),
        ),
        migrations.AddField(
            model_name="workflow",
            name="archived_at",
            field=models.DateTimeField(blank=True, help_text="Archived: no new runs start.", null=True),
        ),
        migrations.AddField(
            model_name="workflow",
            name="publish_on_save",
            field=models.BooleanField(
                default=True, help_text="Saving a version publishes it when the saver may publish; "
                "off: saved versions are drafts until someone publishes one."),
        ),
        migrations.RunPython(publish_latest, migrations.RunPython.noop),
    ]
