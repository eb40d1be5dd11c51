"""The audit ledger: one append-only, hash-chained row per decision Stepwise makes or acts on.

Owns the `AuditEntry` table. It is not a debug log and not the outbox (`orchestrator.Event`):
entries outlive runs (no foreign keys, so deleting a run never touches its evidence), carry the
versions and hashes that explain a decision, and hold only redacted data.

Rows are written only by `audit.services.audit_record`. The database itself refuses UPDATE,
DELETE and TRUNCATE (triggers installed by migration 0001), so this model must not grow
`save()` logic or signals. The model is unmanaged on purpose: Django's `flush` (and therefore
the test runner) skips unmanaged tables, so no tool that "empties the database" can reach the
ledger; schema changes are hand-written in migrations (see 0001 for the pattern).
"""
import json

from django.conf import settings
from django.db import models
from django.db.models import F

GENESIS_HASH = "0" * 64


class ActorKind(models.TextChoices):
    USER = "user"
    SERVICE = "service"
    WORKER = "worker"
    SYSTEM = "system"


class SubjectType(models.TextChoices):
    WORKFLOW = "workflow"
    RUN = "run"
    STEP = "step"
    APPROVAL = "approval"
    BUDGET = "budget"
    LEDGER = "ledger"
    TRIGGER = "trigger"


class AuditEntry(models.Model):
    """One ledger entry. `sequence`, `prev_hash` and `hash` link it into the chain.

    On SQLite the chain fields are filled when the row is inserted; on PostgreSQL a deferred
    trigger fills them when the recording transaction commits (see `audit.chain`), so they are
    NULL only inside a transaction that has not committed yet.
    """

    id = models.BigAutoField(primary_key=True)
    sequence = models.BigIntegerField(null=True,
                                      help_text="Position in its shard's chain: the previous entry's + 1.")
    created_at = models.DateTimeField(db_index=True)
    actor = models.CharField(max_length=200, help_text='"user:alice", "worker:host", "service:reaper"')
    actor_kind = models.CharField(max_length=16, choices=ActorKind.choices)
    action = models.CharField(max_length=64, help_text='What happened: "step.completed", ...')
    subject_type = models.CharField(max_length=16, choices=SubjectType.choices)
    subject_id = models.CharField(max_length=100)
    team = models.CharField(max_length=50, blank=True)
    workflow = models.CharField(max_length=100, blank=True)
    workflow_version = models.PositiveIntegerField(null=True, blank=True)
    definition_digest = models.CharField(max_length=64, blank=True,
                                         help_text="SHA-256 of the workflow version's definition.")
    run_id = models.UUIDField(null=True, blank=True)
    step_name = models.CharField(max_length=64, blank=True)
    event_id = models.BigIntegerField(null=True, blank=True,
                                      help_text="The outbox event this entry records, if any.")
    proposal_hash = models.CharField(max_length=64, blank=True)
    model = models.CharField(max_length=100, blank=True)
    prompt_version = models.CharField(max_length=80, blank=True)
    idempotency_key = models.CharField(max_length=255, blank=True)
    correlation_id = models.CharField(max_length=255, blank=True,
                                      help_text="An identifier assigned outside Stepwise.")
    outcome = models.CharField(max_length=32, blank=True)
    # Canonical JSON text, redacted. Text rather than JSON so that the bytes hashed are the
    # bytes stored: a JSON column may renormalize numbers (jsonb turns 1e+20 into an integer).
    payload = models.TextField(default="{}")
    payload_ref = models.CharField(max_length=255, blank=True,
                                   help_text="Where data kept out of the ledger lives.")
    digest = models.CharField(max_length=64, help_text="SHA-256 of the canonical entry.")
    # Which chain the entry is linked into (`audit.chain.shard_of`); `sequence` counts within it.
    shard = models.IntegerField(default=0)
    # NULL, not "", until the entry is chained (PostgreSQL: until its transaction commits).
    prev_hash = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001
    hash = models.CharField(max_length=64, null=True, blank=True,  # noqa: DJ001
                            help_text="SHA-256(prev_hash ':' sequence ':' digest).")

    class Meta:
        managed = False
        db_table = "audit_entry"
        ordering = [F("sequence").asc(nulls_last=True), "id"]
        verbose_name = "audit entry"
        verbose_name_plural = "audit ledger"
        indexes = [
            models.Index(fields=["run_id", "sequence"], name="audit_entry_run"),
            models.Index(fields=["sequence"], name="audit_entry_sequence"),
            models.Index(fields=["action", "created_at"], name="audit_entry_action"),
            models.Index(fields=["actor", "created_at"], name="audit_entry_actor"),
            models.Index(fields=["workflow", "created_at"], name="audit_entry_workflow"),
        ]

    def __str__(self) -> str:
        return f"#{self.sequence or '?'} {self.action} by {self.actor}"

    @property
    def data(self) -> dict:
        """The redacted payload, parsed."""
        return json.loads(self.payload)


class CheckpointRecord(models.Model):
    """That a signed checkpoint was written, and where: the database's note of it, not the
    checkpoint (the file in the checkpoint store is, and only its signature is trusted).

    `audit_verify` fails when a checkpoint recorded here, of an entry still in the ledger, is
    missing from its store (`audit.anchoring`); the schedule reads the newest one to decide
    whether a checkpoint is due without listing the store.
    """

    name = models.CharField(max_length=255, unique=True, help_text="The file's name in the store.")
    sequence = models.BigIntegerField(db_index=True)
    hash = models.CharField(max_length=64)
    created_at = models.DateTimeField(help_text="When it was signed (the signed time).")
    reason = models.CharField(max_length=32)
    key_id = models.CharField(max_length=64)
    store = models.CharField(max_length=255, help_text="Where it was written.")
    # With entries in more than shard 0: {shard: [sequence, hash]} of every head it signed
    # (`sequence` and `hash` above are shard 0's), and their Merkle root.
    heads = models.JSONField(default=dict, blank=True)
    root = models.CharField(max_length=64, blank=True)

    class Meta:
        ordering = ["-sequence", "-created_at"]
        verbose_name = "ledger checkpoint"

    def __str__(self) -> str:
        return f"checkpoint of sequence {self.sequence} ({self.name})"


class LedgerVerification(models.Model):
    """One verification of the whole ledger asked for by an auditor (admin → *Verify ledger*),
    run on the `audit` queue; the row is its progress and its result."""

    class State(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        PASSED = "passed"
        FAILED = "failed"   # the ledger does not verify: `result` says why
        ERROR = "error"     # it could not be checked (no key, the store unreachable)

    FINISHED = (State.PASSED, State.FAILED, State.ERROR)

    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                     related_name="+")
    requested_by_label = models.CharField(max_length=200)
    allow_missing_checkpoint = models.BooleanField(default=False)
    state = models.CharField(max_length=16, choices=State.choices, default=State.QUEUED)
    created_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    entries_total = models.BigIntegerField(null=True, blank=True)
    entries_checked = models.BigIntegerField(default=0)
    stage = models.CharField(max_length=64, blank=True)
    result = models.TextField(blank=True)
    warnings = models.JSONField(default=list, blank=True)
    #: "full" walks the whole chain; "incremental" only what follows the newest signed
    #: checkpoint that an earlier verification found intact (`ledger_check`).
    mode = models.CharField(max_length=16, default="full")
    from_sequence = models.BigIntegerField(null=True, blank=True,
                                           help_text="The first entry this verification walked.")
    through_sequence = models.BigIntegerField(null=True, blank=True,
                                              help_text="The last entry it found intact.")
    through_hash = models.CharField(max_length=64, blank=True)
    # With entries in more than shard 0: {shard: [sequence, hash]}, each shard's last entry it
    # found intact (`through_sequence` and `through_hash` are shard 0's).
    through_heads = models.JSONField(default=dict, blank=True)
    base_checkpoint = models.CharField(max_length=255, blank=True,
                                       help_text="The signed checkpoint an incremental one started from.")

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name = "ledger verification"

    def __str__(self) -> str:
        return f"verification {self.pk} ({self.state})"

    @property
    def finished(self) -> bool:
        return self.state in self.FINISHED


class LedgerExport(models.Model):
    """One export of the ledger asked for by an auditor (admin → *Export ledger*), written by
    the `audit` queue's worker (it signs the manifest's checkpoint) into the shared storage
    (`STORAGES["artifacts"]`, under `audit-exports/`), from where the auditor downloads it."""

    class State(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        DONE = "done"
        ERROR = "error"

    FINISHED = (State.DONE, State.ERROR)

    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                     on_delete=models.SET_NULL, related_name="+")
    requested_by_label = models.CharField(max_length=200)
    format = models.CharField(max_length=8, default="jsonl")
    state = models.CharField(max_length=16, choices=State.choices, default=State.QUEUED)
    created_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    entries = models.BigIntegerField(null=True, blank=True)
    file = models.CharField(max_length=255, blank=True, help_text="Its name in the storage.")
    manifest = models.CharField(max_length=255, blank=True)
    result = models.TextField(blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name = "ledger export"

    def __str__(self) -> str:
        return f"export {self.pk} ({self.state})"

    @property
    def finished(self) -> bool:
        return self.state in self.FINISHED
