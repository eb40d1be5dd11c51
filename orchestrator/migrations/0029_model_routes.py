from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("orchestrator", "0028_capacity_classes"),
    ]

    operations = [
        migrations.AddField(
            model_name="stepattempt",
            name="routes",
            field=models.JSONField(
                blank=True, default=list,
                help_text="Each model route the attempt's calls tried or skipped, in order: route, "
                          "provider, model_id, outcome, error class, tokens, cost, duration."),
        ),
    ]
