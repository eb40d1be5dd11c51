from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('audit', '0003_h40c_checkpoints_verifications'),
    ]

    operations = [
        migrations.AddField(
            model_name='ledgerverification',
            name='mode',
            field=models.CharField(default='full', max_length=16),
        ),
        migrations.AddField(
            model_name='ledgerverification',
            name='from_sequence',
            field=models.BigIntegerField(blank=True, help_text='The first entry this verification walked.', null=True),
        ),
        migrations.AddField(
            model_name='ledgerverification',
            name='through_sequence',
            field=models.BigIntegerField(blank=True, help_text='The last entry it found intact.', null=True),
        ),
        migrations.AddField(
            model_name='ledgerverification',
            name='through_hash',
            field=models.CharField(blank=True, max_length=64),
        ),
        migrations.AddField(
            model_name='ledgerverification',
            name='base_checkpoint',
            field=models.CharField(blank=True, help_text='The signed checkpoint an incremental one started from.', max_length=255),
        ),
    ]
