from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("orchestrator", "0033_sso_group_mappings"),
    ]

    operations = [
        migrations.AddField(
            model_name="mapitem",
            name="attestation",
            field=models.JSONField(
                blank=True, null=True,
                help_text="The record the worker signed as the item's attempt succeeded "
                          "(engine/attestation.py); the join reads no output without one that holds."),
        ),
    ]
