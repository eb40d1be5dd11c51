"""Large JSON values kept out of the database row: stored once, by content hash, as artifacts.

A value in a step's input or output (or a run's, a map item's, an event's) whose canonical JSON
is longer than `STEPWISE_ARTIFACT_BYTES` is written to the artifact storage
(`STORAGES["artifacts"]`: a directory under var/ in the embedded default, an S3-compatible
bucket through django-storages in production) under the SHA-256 of its text. The row holds a
reference in its place:

    {"$artifact": "sha256:<hex>", "bytes": <length of the text>}

`ArtifactJSONField` does both on its own: it offloads as it saves and reads the value back as
it loads, so the engine, the API and the executors see the value itself. Content addressing
stores a value once however many rows hold it: the output of a step and the input of every
step downstream of it (which holds that output) point at one file, and saving a step row again
as it moves from state to state rewrites a reference, not the value.

Only what is too long is moved: a value over the threshold has its own long parts offloaded
first (an input's upstream outputs each become their own artifact), and is stored whole only
if what is left is still too long. A value read back is checked against its hash; a missing or
altered artifact raises `ArtifactError` instead of handing the next step something else.
"""
import hashlib
import json
import os
import threading
import time
from collections import OrderedDict

from django.conf import settings
from django.core.files.base import ContentFile
from django.core.files.storage import storages
from django.core.signals import setting_changed
from django.db import models
from django.dispatch import receiver

from .hashing import canonical_json

MARKER = "$artifact"
ALIAS = "artifacts"


class ArtifactError(RuntimeError):
    """An artifact a row refers to is missing from the storage, or its content is not the one
    its hash names."""


def is_reference(value: object) -> bool:
    return (isinstance(value, dict) and len(value) == 2 and isinstance(value.get(MARKER), str)
            and value[MARKER].startswith("sha256:") and isinstance(value.get("bytes"), int))


def threshold() -> int:
    """The longest value kept in the row, in bytes of canonical JSON (0: every value is)."""
    return settings.STEPWISE_ARTIFACT_BYTES


def offload(value: object, limit: float | None = None) -> object:
    """`value` with every part longer than `limit` stored as an artifact and replaced by its
    reference. A value that is not JSON (NaN, a date) is returned as it is, for the field to
    refuse as it always has."""
    limit = threshold() if limit is None else limit
    if not isinstance(value, dict | list | str):
        return value
    if limit <= 0:
        limit = float("inf")  # nothing is long, but what looks like a reference is still kept as data
    try:
        return _shrink(value, limit)
    except (TypeError, ValueError):
        return value


def _shrink(value: object, limit: float) -> object:
    text = canonical_json(value)
    if is_reference(value):
        # Data that only looks like a reference (a caller's input) is stored as what it is, so
        # reading it back gives that data, never the artifact it names.
        return store(text)
    if len(text) <= limit and (MARKER not in text or isinstance(value, str)):
        return value
    if isinstance(value, dict):
        value = {key: _shrink(item, limit) for key, item in value.items()}
    elif isinstance(value, list):
        value = [_shrink(item, limit) for item in value]
    else:
        return store(text)
    text = canonical_json(value)
    return value if len(text) <= limit else store(text)


def restore(value: object) -> object:
    """`value` with every artifact reference in it replaced by the value it stands for."""
    if is_reference(value):
        return json.loads(load(value[MARKER]))
    if isinstance(value, dict):
        return {key: restore(item) for key, item in value.items()}
    if isinstance(value, list):
        return [restore(item) for item in value]
    return value


def storage_name(digest: str) -> str:
    hexdigest = digest.removeprefix("sha256:")
    return f"sha256/{hexdigest[:2]}/{hexdigest}.json"


def store(text: str) -> dict:
    """Write `text` (canonical JSON) as an artifact, once, and return its reference."""
    data = text.encode()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    if not _STORED.has(digest):
        _write_or_refresh(storages[ALIAS], storage_name(digest), data)
        _STORED.add(digest)
        _READ.put(digest, data)
    return {MARKER: digest, "bytes": len(data)}


def _write_or_refresh(storage, name: str, data: bytes) -> None:
    """Save the artifact, or, when it is there already, make its modification time now: the
    collector (retention.artifacts) deletes only what is unreferenced and was last written or
    refreshed longer ago than its grace period, so what this process is about to reference
    stays (docs/operations.md#retention)."""
    try:
        path = storage.path(name)
    except NotImplementedError:  # a bucket: saving again overwrites (file_overwrite) and refreshes it
        storage.save(name, ContentFile(data))
        return
    try:
        os.utime(path)
    except FileNotFoundError:
        storage.save(name, ContentFile(data))


def load(digest: str) -> str:
    """The text of the artifact `digest`, checked against it. Raises ArtifactError."""
    data = _READ.get(digest)
    if data is None:
        try:
            with storages[ALIAS].open(storage_name(digest), "rb") as handle:
                data = handle.read()
        except (FileNotFoundError, OSError) as exc:
            raise ArtifactError(f"artifact {digest} is missing from the artifact storage") from exc
        if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
            raise ArtifactError(f"artifact {digest} does not match its hash: it was altered")
        _READ.put(digest, data)
    return data.decode()


class _Recent:
    """What this process last wrote or read, bounded by bytes. Artifacts never change (their
    name is their content's hash), so nothing here can be stale."""

    def __init__(self):
        self._lock = threading.Lock()
        self._items: OrderedDict[str, bytes] = OrderedDict()
        self._size = 0

    def get(self, digest: str) -> bytes | None:
        with self._lock:
            data = self._items.get(digest)
            if data is not None:
                self._items.move_to_end(digest)
            return data

    def put(self, digest: str, data: bytes) -> None:
        limit = settings.STEPWISE_ARTIFACT_CACHE_BYTES
        if len(data) > limit:
            return
        with self._lock:
            if digest not in self._items:
                self._items[digest] = data
                self._size += len(data)
            while self._size > limit:
                self._size -= len(self._items.popitem(last=False)[1])

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._size = 0


class _Stored:
    """The artifacts this process knows are in the storage, so saving a row again does not ask
    the storage (a request, on S3) for each of its references. Each is remembered for at most
    `STEPWISE_ARTIFACT_MEMORY_S`, shorter than the collector's grace period, so this process
    never references an artifact it last wrote or refreshed long enough ago to be collected."""

    LIMIT = 100_000

    def __init__(self):
        self._digests: dict[str, float] = {}

    def has(self, digest: str) -> bool:
        since = self._digests.get(digest)
        return since is not None and time.monotonic() - since < settings.STEPWISE_ARTIFACT_MEMORY_S

    def add(self, digest: str) -> None:
        if len(self._digests) >= self.LIMIT:
            self._digests.clear()
        self._digests[digest] = time.monotonic()

    def clear(self) -> None:
        self._digests.clear()


_READ = _Recent()
_STORED = _Stored()


@receiver(setting_changed)
def _storage_changed(*, setting: str, **_) -> None:
    """Tests that point the artifacts elsewhere start from an empty memory of them."""
    if setting in {"STORAGES", "STEPWISE_ARTIFACT_BYTES", "STEPWISE_ARTIFACT_CACHE_BYTES",
                   "STEPWISE_ARTIFACT_MEMORY_S"}:
        _READ.clear()
        _STORED.clear()


class ArtifactJSONField(models.JSONField):
    """A JSONField whose long values live in the artifact storage (module docstring)."""

    def get_db_prep_save(self, value, connection):
        return super().get_db_prep_save(offload(value), connection)

    def from_db_value(self, value, expression, connection):
        if isinstance(value, str) and MARKER not in value:
            return super().from_db_value(value, expression, connection)
        return restore(super().from_db_value(value, expression, connection))
