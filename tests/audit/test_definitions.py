"""The definition format's optional `audit` section: validated, defaulted, documented."""
import pytest
from django.conf import settings

from orchestrator.engine.definitions import normalize_definition, validate_definition
from orchestrator.integrations.tools.registry import load_tool_modules, tool_param_schemas
from tests.factories import example_definition

from .conftest import SENSITIVE


def problems(doc):
    load_tool_modules()
    return [(p.path, p.message) for p in validate_definition(
        doc, tools=tool_param_schemas(), models=settings.STEPWISE_MODELS.keys())]


def with_audit(audit) -> dict:
    return {**example_definition("support"), "audit": audit}


def test_a_definition_may_declare_sensitive_paths_and_reference_storage():
    assert problems(with_audit({"sensitive": [*SENSITIVE, "input.docs.*.text", "steps.*.output.token"],
                                "store_prompts": "reference"})) == []


def test_without_the_section_the_defaults_are_filled_in():
    normalized = normalize_definition(example_definition("support"))
    assert normalized["audit"] == {"sensitive": [], "store_prompts": "inline"}


def test_normalizing_keeps_what_the_author_wrote():
    normalized = normalize_definition(with_audit({"sensitive": SENSITIVE}))
    assert normalized["audit"] == {"sensitive": SENSITIVE, "store_prompts": "inline"}
    assert normalize_definition(normalized) == normalized


@pytest.mark.parametrize("audit, path, fragment", [
    ({"sensitive": ["output.reply"]}, "audit.sensitive[0]", "must match"),
    ({"sensitive": ["steps.draft.input.x"]}, "audit.sensitive[0]", "must match"),
    ({"sensitive": ["steps.drfat.output.reply"]}, "audit.sensitive[0]", "unknown step 'drfat'"),
    ({"store_prompts": "somewhere"}, "audit.store_prompts", "somewhere"),
    ({"redact": ["input.x"]}, "audit.redact", "unknown field 'redact'"),
    ({"sensitive": "input.x"}, "audit.sensitive", "must be a list"),
])
def test_a_bad_audit_section_is_rejected_with_its_path(audit, path, fragment):
    found = problems(with_audit(audit))

    assert any(p == path and fragment in m for p, m in found), found


def test_the_definitions_docs_describe_the_audit_section():
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[2] / "docs" / "definitions.md").read_text()
    assert "`audit`" in docs and "store_prompts" in docs and "sensitive" in docs
