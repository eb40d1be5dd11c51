"""Where signed checkpoints are kept: a directory, or an S3-compatible bucket with object lock.

A checkpoint is worth what its store protects: one kept beside the database can be removed by
whoever can rewrite the ledger. Settings choose the store (docs/audit.md#where-checkpoints-live):

- `STORAGES["audit_checkpoints"]`, set by settings.py when AUDIT_CHECKPOINT_S3_BUCKET is: any
  Django storage backend; for S3, `audit.s3.LockedS3Storage` (django-storages), which writes each
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
from pathlib import Path
from typing import Protocol

from django.conf import settings
from django.core.files.base import ContentFile
from django.core.files.storage import Storage, storages

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


def checkpoint_store() -> CheckpointStore:
    """The store settings name: STORAGES["audit_checkpoints"] if set, else the directory."""
    if ALIAS in settings.STORAGES:
        return StorageStore(storages[ALIAS])
    return DirectoryStore(Path(settings.AUDIT_CHECKPOINT_DIR))
