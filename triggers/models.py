"""Triggers, their firings and the dead letters of queue events: rows only.

A `Trigger` belongs to a team and names the workflow it starts. Every time it fires, a `Firing`
row records the firing's key (the schedule's slot, the webhook's delivery id, the message's id,
the caller's idempotency key) under a unique constraint, so the same key never starts a second
run, and links the run it started: that link is how a run says which trigger started it. A
schedule's slot that could start no run is kept as a `refused` firing with its reason, so the
trigger's firings show it.

The services in `triggers.services` write these rows; nothing here dispatches, calls the
network or writes another row. A trigger is disabled, never deleted, so every run keeps the
trigger that started it.
"""
import uuid

from django.conf import settings
from django.db import models
from django_celery_beat.models import PeriodicTask

from orchestrator.engine.clock import now
from orchestrator.models import Run, Team, Workflow


class TriggerKind(models.TextChoices):
    SCHEDULE = "schedule", "schedule: a cron expression or a fixed interval, fired by beat"
    WEBHOOK = "webhook", "webhook: a signed HTTP POST to the trigger's own URL"
    QUEUE = "queue", "queue event: a message on RabbitMQ or a Redis stream"
    API = "api", "API: a program with a token fires it"


class WhenLimited(models.TextChoices):
    """What happens to a firing past the trigger's rate or the team's cap on unfinished runs."""

    REFUSE = "refuse", "refuse it (429 to a webhook, a dead letter for a queue event)"
    QUEUE = "queue", "hold it and start it when the rate and the team's cap allow"


class Uncorrelated(models.TextChoices):
    """What an event does whose `correlate` names a key no wait step waits with."""

    REFUSE = "refuse", "refuse it (409 to a webhook or the API, a dead letter for a queue event)"
    START = "start", "start a run, as an event without a key does"


class MissedSlots(models.TextChoices):
    """What a schedule does with the slots that passed while beat was not running."""

    SKIP = "skip", "skip them (the latest slot still runs, late)"
    CATCH_UP = "catch_up", "catch up: run the most recent ones, at most catch_up_max"


class Trigger(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="triggers")
    name = models.SlugField(max_length=64)
    description = models.CharField(max_length=200, blank=True)
    kind = models.CharField(max_length=16, choices=TriggerKind.choices)
    workflow = models.ForeignKey(Workflow, on_delete=models.PROTECT, related_name="triggers")
    workflow_version = models.PositiveIntegerField(
        null=True, blank=True, help_text="Pin a version; empty runs the latest.")
    enabled = models.BooleanField(default=True)
    input_template = models.JSONField(
        null=True, blank=True,
        help_text="How the event becomes the run input: a JSON value whose strings are "
                  "templates ({{ payload.x }}); a string that is one {{ expression }} keeps the "
                  "value's type. Empty: the payload itself is the input.")
    filter = models.TextField(
        blank=True, help_text="A CEL condition on the event (payload, message, headers); an "
                              "event for which it is false is acknowledged and ignored.")
    # Correlation (docs/triggers.md#correlated-events): an event that resumes a waiting run.
    correlate = models.TextField(
        blank=True, help_text="A CEL expression over the event (payload, headers, message) "
                              "giving a correlation key: the event is delivered as a signal to "
                              "the wait step of this workflow waiting with that key, instead of "
                              "starting a run. Null or empty: the event starts a run.")
    uncorrelated = models.CharField(max_length=16, choices=Uncorrelated.choices,
                                    default=Uncorrelated.REFUSE)
    # Debounce (docs/triggers.md#debounce-and-coalesce): a burst of events starts one run.
    debounce_s = models.PositiveIntegerField(
        null=True, blank=True, help_text="Hold each event this many seconds; a newer event of the "
                                         "same group in that time takes its place and waits "
                                         "again, so a burst starts one run, with the last "
                                         "event's input. Empty: every event starts its own run.")
    debounce_key = models.TextField(
        blank=True, help_text="A CEL expression over the event giving its group (one run per "
                              "customer, say). Empty: all of the trigger's events are one group.")
    debounce_max_s = models.PositiveIntegerField(
        null=True, blank=True, help_text="The longest a group's first event is held while newer "
                                         "ones keep coming. Empty: ten times debounce_s.")
    # Its runs' capacity class (docs/operations.md#capacity); blank: the workflow's.
    capacity = models.CharField(
        max_length=16, blank=True, default="",
        help_text="The capacity class its runs go to (interactive, batch, evaluation or one the "
                  "deployment adds). Empty: the workflow's own (`capacity` in its definition).")
    # Admission control (docs/triggers.md#admission-control).
    max_per_minute = models.PositiveIntegerField(
        default=60, help_text="Runs this trigger may start in any 60 seconds.")
    when_limited = models.CharField(max_length=16, choices=WhenLimited.choices,
                                    default=WhenLimited.REFUSE)
    max_queued = models.PositiveIntegerField(
        default=100, help_text="Firings held at most while limited; past it they are refused.")
    # Schedules.
    cron = models.CharField(max_length=100, blank=True,
                            help_text='Five fields: minute hour day-of-month month day-of-week, '
                                      'e.g. "*/15 9-17 * * mon-fri".')
    timezone = models.CharField(max_length=64, default="UTC",
                                help_text="The time zone the cron expression is read in.")
    interval_s = models.PositiveIntegerField(null=True, blank=True,
                                             help_text="A fixed interval instead of cron.")
    missed_slots = models.CharField(max_length=16, choices=MissedSlots.choices,
                                    default=MissedSlots.SKIP)
    catch_up_max = models.PositiveSmallIntegerField(
        default=3, help_text="With catch_up: the most missed slots run after an outage.")
    schedule_anchor = models.DateTimeField(
        null=True, blank=True, help_text="Slots start after this (the schedule's last change).")
    last_slot = models.DateTimeField(null=True, blank=True,
                                     help_text="The newest slot handled.")
    periodic_task = models.OneToOneField(PeriodicTask, null=True, blank=True,
                                         on_delete=models.SET_NULL, related_name="stepwise_trigger")
    # Webhooks. The secret is kept encrypted (triggers.sealing) and shown once.
    secret_ciphertext = models.TextField(blank=True, editable=False)
    secret_fingerprint = models.CharField(max_length=16, blank=True, editable=False,
                                          help_text="Identifies the secret without revealing it.")
    previous_secret_ciphertext = models.TextField(blank=True, editable=False)
    previous_secret_until = models.DateTimeField(
        null=True, blank=True, editable=False,
        help_text="The secret replaced by the last rotation is accepted until then.")
    replay_window_s = models.PositiveIntegerField(
        default=300, help_text="A webhook whose timestamp is further than this from now is refused.")
    max_body_bytes = models.PositiveIntegerField(
        default=256 * 1024, help_text="The largest webhook body or queue message accepted.")
    # Queue events.
    source = models.CharField(max_length=64, blank=True,
                              help_text="A broker named in STEPWISE_EVENT_SOURCES.")
    exchange = models.CharField(max_length=200, blank=True,
                                help_text="RabbitMQ: the topic exchange to bind to.")
    binding_key = models.CharField(max_length=200, blank=True,
                                   help_text='RabbitMQ: the routing-key pattern, e.g. "tickets.*".')
    queue = models.CharField(max_length=200, blank=True,
                             help_text="RabbitMQ: the queue to consume (default stepwise.<team>.<name>).")
    stream = models.CharField(max_length=200, blank=True, help_text="Redis: the stream key.")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    # Who last changed its settings or rotated its secret, and how many times it was changed:
    # with created_by, the people a run it starts names as having set it in motion.
    updated_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    revision = models.PositiveIntegerField(
        default=1, help_text="1 when created; one more at every change of settings or secret.")
    created_at = models.DateTimeField(default=now)
    updated_at = models.DateTimeField(default=now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="trigger_name_per_team")]
        ordering = ["team", "name"]

    def __str__(self) -> str:
        return f"{self.team}/{self.name} ({self.kind})"

    @property
    def queue_name(self) -> str:
        return self.queue or f"stepwise.{self.team.slug}.{self.name}"

    @property
    def stream_group(self) -> str:
        """Each trigger reads a stream through a consumer group of its own."""
        return f"stepwise.{self.id}"


class Firing(models.Model):
    """One time a trigger fired, by its key; at most one run per (trigger, key), ever."""

    class State(models.TextChoices):
        QUEUED = "queued", "queued: held by admission control"
        DEBOUNCING = "debouncing", "debouncing: held until its group is quiet for debounce_s"
        COALESCED = "coalesced", "coalesced: a newer event of its group took its place"
        STARTED = "started"
        SIGNALLED = "signalled", "signalled: delivered to a waiting run (correlated)"
        REFUSED = "refused", "refused: started no run (see reason and problems)"

    trigger = models.ForeignKey(Trigger, on_delete=models.PROTECT, related_name="firings")
    key = models.CharField(max_length=200, help_text='"slot:<time>", "delivery:<id>", '
                                                      '"message:<id>", "request:<key>".')
    state = models.CharField(max_length=16, choices=State.choices)
    run = models.OneToOneField(Run, null=True, blank=True, on_delete=models.PROTECT,
                               related_name="trigger_firing")
    signalled_run = models.ForeignKey(
        Run, null=True, blank=True, on_delete=models.PROTECT, related_name="correlated_firings",
        help_text="The waiting run a correlated event was delivered to as a signal.")
    input = models.JSONField(null=True, blank=True, help_text="The run input, kept while queued.")
    origin = models.JSONField(default=dict, blank=True,
                              help_text="What fired it: the slot, delivery or message.")
    fired_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                 on_delete=models.SET_NULL, related_name="+",
                                 help_text="The person who fired a programmatic trigger.")
    reason = models.CharField(max_length=32, blank=True,
                              help_text="Why a refused firing started no run: invalid_input, "
                                        "template_failed, rate, quota, budget, ...")
    problems = models.JSONField(default=list, blank=True, help_text='[{"path", "message"}, ...]')
    created_at = models.DateTimeField(default=now)
    started_at = models.DateTimeField(null=True, blank=True, db_index=True)
    # Debounce: the event's group, when the group's first held event came, when this one is
    # let go if nothing newer comes, and the newer firing that took a coalesced one's place.
    group = models.CharField(max_length=200, blank=True)
    held_since = models.DateTimeField(null=True, blank=True)
    due_at = models.DateTimeField(null=True, blank=True)
    coalesced_into = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT,
                                       related_name="coalesced")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["trigger", "key"], name="one_firing_per_key"),
                       models.UniqueConstraint(fields=["trigger", "group"], name="one_held_event_per_group",
                                               condition=models.Q(state="debouncing"))]
        indexes = [models.Index(fields=["trigger", "state", "created_at"], name="firing_trigger_state"),
                   models.Index(fields=["state", "due_at"], name="firing_due"),
                   models.Index(fields=["trigger", "started_at"], name="firing_trigger_started")]
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.trigger.name} {self.key} ({self.state})"


class EventDeadLetter(models.Model):
    """A queue event that could not start a run, kept with its reason until someone replays it."""

    class Status(models.TextChoices):
        OPEN = "open"
        REPLAYED = "replayed"

    trigger = models.ForeignKey(Trigger, on_delete=models.PROTECT, related_name="dead_letters")
    key = models.CharField(max_length=200, help_text='"message:<id>"')
    body = models.TextField(blank=True, help_text="The message body (only its start if too large).")
    body_complete = models.BooleanField(default=True)
    meta = models.JSONField(default=dict, blank=True,
                            help_text="Routing key, properties and headers, or stream fields.")
    reason_class = models.CharField(max_length=32, help_text="malformed, too_large, "
                                    "filter_failed, invalid_input, refused")
    problems = models.JSONField(default=list, help_text='[{"path", "message"}, ...]')
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.OPEN)
    attempts = models.PositiveIntegerField(default=1, help_text="Deliveries and replays that failed.")
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(default=now, db_index=True)
    replayed_at = models.DateTimeField(null=True, blank=True)
    replayed_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                    on_delete=models.SET_NULL, related_name="+")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["trigger", "key"],
                                               name="one_event_dead_letter_per_key")]
        ordering = ["-created_at"]
        verbose_name = "event dead letter"

    def __str__(self) -> str:
        return f"{self.trigger.name} {self.key}: {self.reason_class}"


class RefusalTally(models.Model):
    """Webhook posts a trigger refused before they were authenticated (too large, unsigned,
    badly signed, out of the replay window), counted per trigger and minute: anyone can send
    them, so each is a row update here, and the minute becomes one ledger entry with the count
    once it has passed (`triggers.services.webhooks.refusal_tallies_record`)."""

    trigger = models.ForeignKey(Trigger, on_delete=models.CASCADE, related_name="refusal_tallies")
    minute = models.DateTimeField(help_text="The minute the refusals arrived in (its start).")
    count = models.PositiveIntegerField(default=0)
    reasons = models.JSONField(default=dict, help_text="How many of each reason.")
    first_problem = models.CharField(max_length=500, blank=True,
                                     help_text="What the first refusal of the minute said.")
    recorded = models.BooleanField(default=False, help_text="Written to the ledger.")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["trigger", "minute"],
                                               name="refusal_tally_per_minute")]
        indexes = [models.Index(fields=["recorded", "minute"], name="refusal_tally_due")]

    def __str__(self) -> str:
        return f"{self.trigger_id} {self.minute:%Y-%m-%d %H:%M}: {self.count} refused"
