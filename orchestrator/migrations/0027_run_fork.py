import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("orchestrator", "0026_reruns"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="forked_from",
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT,
                                    related_name="forks", to="orchestrator.run"),
        ),
        migrations.AddField(
            model_name="run",
            name="fork_step",
            field=models.CharField(blank=True, max_length=64),
        ),
        migrations.AddField(
            model_name="run",
            name="fork_edits",
            field=models.JSONField(blank=True, default=dict),
        ),
    ]
