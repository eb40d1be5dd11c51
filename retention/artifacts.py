"""Artifact garbage collection: deletes an artifact (orchestrator/engine/artifacts.py) that no
row references and that was last written or refreshed longer ago than
`STEPWISE_ARTIFACT_GC_GRACE_S`.

References are read from every `ArtifactJSONField` of every model (runs, steps, map items,
events, signals, cached results, evaluation cases, ...), from the ledger's payloads and
`payload_ref`, and from inside the artifacts those name (a large value's own long parts are
artifacts of their own).

Why the grace period is safe beside running work: a process remembers that an artifact exists
for at most `STEPWISE_ARTIFACT_MEMORY_S`, and when it first relies on one it finds in the
storage it refreshes its modification time. So an artifact a process may still reference in a
row not yet committed was written or refreshed less than the memory plus the transaction's
length ago, which the grace period exceeds; the collector reads the rows first and the
modification time after, each just before deciding on its artifact.
"""
import re
import time
from datetime import timedelta

from django.apps import apps
from django.conf import settings
from django.core.files.storage import storages
from django.db.models import TextField
from django.db.models.functions import Cast

from audit.models import AuditEntry
from orchestrator.engine.artifacts import (
    ALIAS,
    MARKER,
    ArtifactError,
    ArtifactJSONField,
    load,
    storage_name,
)
from orchestrator.engine.clock import now

DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
ROOT = "sha256"


def _texts():
    """The raw text of every stored value that may hold a reference (not restored)."""
    for model in apps.get_models():
        if model._meta.proxy:
            continue
        for f in model._meta.get_fields():
            if isinstance(f, ArtifactJSONField) and f.concrete and f.model is model:
                yield from (model._base_manager.annotate(_text=Cast(f.name, TextField()))
                            .filter(_text__contains=MARKER).values_list("_text", flat=True)
                            .iterator(chunk_size=2000))
    yield from AuditEntry.objects.filter(payload__contains=MARKER).values_list("payload", flat=True).iterator(
        chunk_size=2000)
    yield from AuditEntry.objects.filter(payload_ref__contains="sha256:").values_list(
        "payload_ref", flat=True).iterator(chunk_size=2000)


def referenced() -> set[str]:
    """Every artifact digest a row references, directly or inside another artifact."""
    found = set()
    for text in _texts():
        found.update(DIGEST.findall(text))
    frontier = list(found)
    while frontier:
        try:
            text = load(frontier.pop())
        except ArtifactError:
            continue  # missing already: nothing inside it to keep
        if MARKER in text:
            inner = set(DIGEST.findall(text)) - found
            found |= inner
            frontier.extend(inner)
    return found


def stored() -> list[str]:
    """The digests of every artifact in the storage."""
    storage = storages[ALIAS]
    if not storage.exists(ROOT):
        return []
    digests = []
    for prefix in storage.listdir(ROOT)[0]:
        digests.extend("sha256:" + name.removesuffix(".json")
                       for name in storage.listdir(f"{ROOT}/{prefix}")[1] if name.endswith(".json"))
    return digests


def artifacts_collect(*, deadline: float | None = None) -> int:
    """Delete the unreferenced artifacts older than the grace period; how many were deleted.
    Stops at `deadline` (a `time.monotonic()` value); the next sweep carries on."""
    storage = storages[ALIAS]
    keep = referenced()  # rows first, the modification times after (module docstring)
    grace = timedelta(seconds=settings.STEPWISE_ARTIFACT_GC_GRACE_S)
    deleted = 0
    for digest in stored():
        if digest in keep:
            continue
        if deadline is not None and time.monotonic() >= deadline:
            break
        name = storage_name(digest)
        try:
            if storage.get_modified_time(name) >= now() - grace:
                continue
            storage.delete(name)
        except FileNotFoundError:
            continue
        deleted += 1
    return deleted
