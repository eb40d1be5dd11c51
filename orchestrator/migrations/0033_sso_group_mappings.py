import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("orchestrator", "0032_list_indexes"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="SsoGrant",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("kind", models.CharField(choices=[("team", "Team"), ("group", "Group"), ("staff", "Staff")], max_length=8)),
                ("name", models.CharField(blank=True, max_length=150)),
                ("user", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="sso_grants", to=settings.AUTH_USER_MODEL)),
            ],
            options={
                "constraints": [models.UniqueConstraint(fields=("user", "kind", "name"), name="one_sso_grant_per_target")],
            },
        ),
    ]
