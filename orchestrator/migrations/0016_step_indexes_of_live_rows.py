"""Steps indexed for what looks for them, and only those rows (issue 16).

The reaper looks for running steps past their lease, retrying steps due, running or waiting
steps past their deadline, queued steps waiting too long; the metrics count queued steps per
queue. The three `(state, ...)` indexes held an entry for every step, in every state, and each
of a step's state changes wrote one into each of them: a step ends in `completed` (most of the
rows) and starts `blocked`, and no query looks for those. The partial indexes hold the rows the
queries look for. The foreign keys `StepRun.run` and `StepAttempt.step` lose their own index:
the unique constraints `step_name_per_run` (run, name) and `attempt_number_unique` (step, number)
begin with them and serve the same lookups.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('orchestrator', '0015_event_notify_trigger'),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name='steprun',
            name='step_state_lease',
        ),
        migrations.RemoveIndex(
            model_name='steprun',
            name='step_state_next_attempt',
        ),
        migrations.RemoveIndex(
            model_name='steprun',
            name='step_state_deadline',
        ),
        migrations.AlterField(
            model_name='stepattempt',
            name='step',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='attempt_records', to='orchestrator.steprun'),
        ),
        migrations.AlterField(
            model_name='steprun',
            name='run',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='steps', to='orchestrator.run'),
        ),
        migrations.AddIndex(
            model_name='steprun',
            index=models.Index(condition=models.Q(('state', 'running')), fields=['lease_expires_at'], name='step_running_lease'),
        ),
        migrations.AddIndex(
            model_name='steprun',
            index=models.Index(condition=models.Q(('state', 'retrying')), fields=['next_attempt_at'], name='step_retrying_next_attempt'),
        ),
        migrations.AddIndex(
            model_name='steprun',
            index=models.Index(condition=models.Q(('state__in', ['running', 'waiting'])), fields=['deadline_at'], name='step_live_deadline'),
        ),
        migrations.AddIndex(
            model_name='steprun',
            index=models.Index(condition=models.Q(('state', 'queued')), fields=['queue', 'queued_at'], name='step_queued'),
        ),
    ]
