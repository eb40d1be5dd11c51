"""Where signed checkpoints are kept: a directory, or an S3-compatible bucket with object lock.

A checkpoint is worth what its store protects: one kept beside the database can be removed by
whoever can rewrite the ledger. Settings choose the store (docs/audit.md#where-checkpoints-live):

- `STORAGES["audit_checkpoints"]`, set by settings.py when AUDIT_CHECKPOINT_S3_BUCKET is: any
  Django storage backend; for S3, `LockedS3Storage` (django-storages), which writes each
  object under an object-lock retention so that no credential can delete or overwrite it
  before the retention ends;
- otherwise the directory AUDIT_CHECKPOINT_DIR, written whole under a temporary name and then
  renamed, so a reader never sees half a file.

A store only names, reads and writes whole files (`checkpoint-*.json`); what they mean is
`audit.anchoring`'s. This module must not read the ledger.
"""
from __future__ import annotations

import fnmatch
import os
from datetime import timedelta
from pathlib import Path
from typing import Protocol

from django.conf import settings
from django.core.files.base import ContentFile
from django.core.files.storage import Storage, storages
from storages.backends.s3 import S3Storage

from orchestrator.engine.clock import now

ALIAS = "audit_checkpoints"
PATTERN = "checkpoint-*.json"


class CheckpointStore(Protocol):
    def names(self) -> list[str]:
        """The checkpoint files' names, sorted."""

    def read(self, name: str) -> bytes: ...

    def write(self, name: str, data: bytes) -> None: ...

    def describe(self) -> str:
        """Where this is, for messages and for `CheckpointRecord.store`."""


class DirectoryStore:
    def __init__(self, directory: Path):
        self.directory = Path(directory)

    def names(self) -> list[str]:
        if not self.directory.is_dir():
            return []
        return sorted(path.name for path in self.directory.glob(PATTERN))

    def read(self, name: str) -> bytes:
        return (self.directory / name).read_bytes()

    def write(self, name: str, data: bytes) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / name
        temporary = path.with_name(f".{name}.tmp")
        with temporary.open("wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)

    def describe(self) -> str:
        return f"directory {self.directory}"


class StorageStore:
    """A Django storage backend (django-storages' S3 in production)."""

    def __init__(self, storage: Storage):
        self.storage = storage

    def names(self) -> list[str]:
        return sorted(name for name in self.storage.listdir("")[1] if fnmatch.fnmatch(name, PATTERN))

    def read(self, name: str) -> bytes:
        with self.storage.open(name, "rb") as handle:
            return handle.read()

    def write(self, name: str, data: bytes) -> None:
        saved = self.storage.save(name, ContentFile(data))
        if saved != name:  # the backend renamed it: the record would name another object
            raise OSError(f"the checkpoint store wrote {saved!r} instead of {name!r}")

    def describe(self) -> str:
        bucket = getattr(self.storage, "bucket_name", None)
        if bucket:
            prefix = getattr(self.storage, "location", "")
            return f"bucket s3://{bucket}/{prefix}".rstrip("/")
        return f"storage {type(self.storage).__name__}"


class LockedS3Storage(S3Storage):
    """S3Storage whose uploads carry an object-lock retention of `retain_days` (COMPLIANCE
    mode unless `lock_mode` says GOVERNANCE), on top of whatever default retention the bucket
    has. The bucket must have been created with object lock enabled."""

    def __init__(self, *, retain_days: int = 0, lock_mode: str = "COMPLIANCE", **options):
        self.retain_days, self.lock_mode = retain_days, lock_mode
        super().__init__(**options)

    def get_object_parameters(self, name):
        parameters = super().get_object_parameters(name)
        if self.retain_days:
            parameters.update(ObjectLockMode=self.lock_mode,
                              ObjectLockRetainUntilDate=now() + timedelta(days=self.retain_days))
        return parameters


def checkpoint_store() -> CheckpointStore:
    """The store settings name: STORAGES["audit_checkpoints"] if set, else the directory."""
    if ALIAS in settings.STORAGES:
        return StorageStore(storages[ALIAS])
    return DirectoryStore(Path(settings.AUDIT_CHECKPOINT_DIR))
