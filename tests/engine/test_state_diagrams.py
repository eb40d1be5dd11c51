"""The published state diagrams are generated from the code and must be current."""
from pathlib import Path

from django.conf import settings

from orchestrator.management.commands.stepwise_state_diagrams import render


def test_docs_state_machines_matches_the_declared_transitions():
    published = (Path(settings.BASE_DIR) / "docs" / "state-machines.md").read_text()
    assert published == render(), "run: python manage.py stepwise_state_diagrams"


def test_every_declared_run_transition_appears_in_the_diagram():
    assert "cancelling --> cancelled: cancel" in render()
    assert "waiting --> running: resume" in render()
