"""A run's callback secret is stored sealed (orchestrator.engine.sealing.CALLBACK_SECRETS), like webhook
secrets: the plain `secret` column is sealed into `sealed_secret`, then dropped."""
from django.db import migrations, models


def seal(apps, schema_editor):
    from orchestrator.engine.sealing import CALLBACK_SECRETS

    RunCallback = apps.get_model("notifications", "RunCallback")
    for callback in RunCallback.objects.only("id", "secret").iterator():
        RunCallback.objects.filter(id=callback.id).update(
            sealed_secret=CALLBACK_SECRETS.seal(callback.secret))


def unseal(apps, schema_editor):
    from orchestrator.engine.sealing import CALLBACK_SECRETS

    RunCallback = apps.get_model("notifications", "RunCallback")
    for callback in RunCallback.objects.only("id", "sealed_secret").iterator():
        RunCallback.objects.filter(id=callback.id).update(
            secret=CALLBACK_SECRETS.unseal(callback.sealed_secret))


class Migration(migrations.Migration):

    dependencies = [
        ("notifications", "0002_run_callbacks"),
    ]

    operations = [
        migrations.AddField(
            model_name="runcallback",
            name="sealed_secret",
            field=models.TextField(default="", help_text="The client's signing secret, sealed "
                                   "(orchestrator.engine.sealing.CALLBACK_SECRETS)."),
            preserve_default=False,
        ),
        migrations.AlterField(
            model_name="runcallback",
            name="secret",
            field=models.CharField(blank=True, default="", max_length=200),
        ),
        migrations.RunPython(seal, unseal),
        migrations.RemoveField(model_name="runcallback", name="secret"),
    ]
