"""Fixtures of the retention tests: artifacts in a directory of the test's own."""
import os
import time
from pathlib import Path

import pytest

from orchestrator.engine.artifacts import storage_name
from orchestrator.engine.services.workflows import workflow_save
from tests.audit.conftest import old_and_new  # noqa: F401 - a fixture the ledger's tests share
from tests.factories import SETUP

HOUR = 3600


@pytest.fixture
def root(settings, tmp_path) -> Path:
    """The artifacts in a directory of this test's own, values over 1,000 bytes moved there."""
    settings.STORAGES = {**settings.STORAGES, "artifacts": {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": tmp_path / "artifacts"}}}
    settings.STEPWISE_ARTIFACT_BYTES = 1000
    settings.STEPWISE_ARTIFACT_GC_GRACE_S = HOUR
    return tmp_path / "artifacts"


def path(root: Path, digest: str) -> Path:
    return root / storage_name(digest)


def age(root: Path, seconds: float) -> None:
    """Make every artifact look written `seconds` ago."""
    then = time.time() - seconds
    for file in root.rglob("*.json"):
        os.utime(file, (then, then))


def echo(team):
    definition = {"name": "echo", "input_schema": {"type": "object"}, "steps": [
        {"name": "s", "type": "tool", "tool": "core.echo", "params": {"got": "{{ input.a }}"}}]}
    return workflow_save(team=team, definition=definition, actor=SETUP)[0]
