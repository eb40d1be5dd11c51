"""Team members get a role (docs/permissions.md): the plain member list becomes memberships.

Existing members become editors (they could save workflows, start and cancel runs before);
the global redrive permission gives way to the operator role in each team.
"""
import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


def copy_members(apps, schema_editor):
    Team = apps.get_model("orchestrator", "Team")
    TeamMembership = apps.get_model("orchestrator", "TeamMembership")
    for team in Team.objects.all():
        TeamMembership.objects.bulk_create(
            TeamMembership(team=team, user=user, role="editor") for user in team.members.all())


class Migration(migrations.Migration):

    dependencies = [
        ("orchestrator", "0006_run_compensation_lease"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="TeamMembership",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False,
                                           verbose_name="ID")),
                ("role", models.CharField(choices=[
                    ("member", "member: sees the team's workflows and runs, starts runs"),
                    ("editor", "editor: member, and saves new versions of workflows"),
                    ("operator", "operator: member, and cancels, resumes, retries, skips and redrives"),
                    ("owner", "owner: every action in the team")], default="member", max_length=16)),
                ("team", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE,
                                           related_name="memberships", to="orchestrator.team")),
                ("user", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE,
                                           related_name="team_memberships",
                                           to=settings.AUTH_USER_MODEL)),
            ],
            options={"ordering": ["team", "user"]},
        ),
        migrations.AddConstraint(
            model_name="teammembership",
            constraint=models.UniqueConstraint(fields=("team", "user"), name="one_membership_per_team"),
        ),
        migrations.RunPython(copy_members, migrations.RunPython.noop),
        migrations.RemoveField(model_name="team", name="members"),
        migrations.AddField(
            model_name="team",
            name="members",
            field=models.ManyToManyField(blank=True, related_name="teams",
                                         through="orchestrator.TeamMembership",
                                         to=settings.AUTH_USER_MODEL),
        ),
        migrations.AlterModelOptions(name="deadletter", options={"ordering": ["-created_at"]}),
    ]
