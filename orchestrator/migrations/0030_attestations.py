from django.db import migrations, models

import orchestrator.engine.clock


class Migration(migrations.Migration):

    dependencies = [
        ("orchestrator", "0029_model_routes"),
    ]

    operations = [
        migrations.AddField(
            model_name="steprun",
            name="attestation",
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="stepattempt",
            name="attestation",
            field=models.JSONField(
                blank=True, null=True,
                help_text="The record the worker signed as the attempt succeeded (engine/attestation.py)."),
        ),
        migrations.CreateModel(
            name="WorkerKey",
            fields=[
                ("key_id", models.CharField(max_length=40, primary_key=True, serialize=False)),
                ("public_key", models.CharField(help_text="Base64 of the raw 32-byte public key.", max_length=64)),
                ("process", models.CharField(blank=True, help_text="The worker or process that registered it.",
                                             max_length=200)),
                ("provisioned", models.BooleanField(
                    default=False, help_text="Added by an operator before any process used it.")),
                ("registered_at", models.DateTimeField(default=orchestrator.engine.clock.now)),
                ("revoked_at", models.DateTimeField(blank=True, null=True)),
                ("revoked_by", models.CharField(blank=True, max_length=200)),
            ],
            options={"ordering": ["-registered_at"]},
        ),
    ]
