"""docs/definitions.md stays true: its YAML examples are valid definitions."""

from __future__ import annotations

import re
from pathlib import Path

from orchestrator.engine.definitions import parse_definition_text

DOCS = Path(__file__).resolve().parents[2] / "docs" / "definitions.md"


def test_every_yaml_example_in_the_docs_is_valid(validate):
    blocks = re.findall(r"```yaml\n(.*?)```", DOCS.read_text(), flags=re.DOTALL)

    assert len(blocks) >= 2
    for block in blocks:
        assert validate(parse_definition_text(block)) == []
