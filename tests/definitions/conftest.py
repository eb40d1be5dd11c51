"""Shared fixtures for definition tests: a valid support workflow and the registries."""

from __future__ import annotations

import copy

import pytest
import yaml

from orchestrator.engine.definitions import validate_definition

from .examples import (
    MODELS,
    ROUTING_WORKFLOW_YAML,
    SUPPORT_WORKFLOW_YAML,
    TOOLS,
    WORKFLOWS,
)


@pytest.fixture(scope="session")
def _support_workflow_doc() -> dict:

    return yaml.safe_load(SUPPORT_WORKFLOW_YAML)


@pytest.fixture
def support_workflow(_support_workflow_doc) -> dict:
    """A fresh, valid definition each test may change freely."""
    return copy.deepcopy(_support_workflow_doc)


@pytest.fixture
def validate():
    """validate_definition with the test registries."""

    def run(doc):
        return validate_definition(doc, tools=TOOLS, models=MODELS, workflows=WORKFLOWS.get)

    return run


@pytest.fixture(scope="session")
def _routing_workflow_doc() -> dict:

    return yaml.safe_load(ROUTING_WORKFLOW_YAML)


@pytest.fixture
def routing_workflow(_routing_workflow_doc) -> dict:
    """A fresh, valid definition with a router, a map step and a sub-workflow."""
    return copy.deepcopy(_routing_workflow_doc)
