"""Workflows written in Python (stepwise_client.builder) are the definitions their YAML is: each
example in examples/ has a Python form (examples/python/) whose `to_dict()` equals the YAML
parsed, so validation, versioning and the JSON Schema apply unchanged. The management command
saves one from its module."""
from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from orchestrator.engine.definitions import parse_definition_text
from orchestrator.models import WorkflowVersion
from stepwise_client.builder import Workflow, definition_of, load_definition

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
YAML_FILES = sorted(EXAMPLES.glob("*.yaml"))


def python_form(path: Path):
    return importlib.import_module(f"examples.python.{path.stem.replace('-', '_')}").workflow


@pytest.mark.parametrize("path", YAML_FILES, ids=[p.stem for p in YAML_FILES])
def test_each_example_written_in_python_equals_its_yaml(path):
    assert python_form(path).to_dict() == parse_definition_text(path.read_text())


def test_every_python_example_has_its_yaml():
    stems = {p.stem.replace("-", "_") for p in YAML_FILES}
    modules = {p.stem for p in (EXAMPLES / "python").glob("*.py")} - {"__init__"}
    assert modules == stems


def test_a_keyword_left_out_is_left_out_and_steps_are_referenced_by_handle():
    wf = Workflow("tiny", input_schema={"type": "object"})
    first = wf.tool("first", tool="core.echo")
    refine = wf.loop("refine", max_iterations=2, until="steps.check.output.ok", after=[first])
    draft = refine.agent("draft", model="fast", prompt="p", output_schema={"type": "object"})
    refine.tool("check", tool="core.echo", after=[draft])
    assert wf.to_dict() == {
        "name": "tiny", "input_schema": {"type": "object"},
        "steps": [
            {"name": "first", "type": "tool", "tool": "core.echo"},
            {"name": "refine", "type": "loop", "after": ["first"], "max_iterations": 2,
             "until": "steps.check.output.ok",
             "body": [
                 {"name": "draft", "type": "agent", "model": "fast", "prompt": "p",
                  "output_schema": {"type": "object"}},
                 {"name": "check", "type": "tool", "tool": "core.echo", "after": ["draft"]},
             ]},
        ],
    }
    with pytest.raises(ValueError, match="already defined"):
        wf.tool("first", tool="core.echo")


def test_definition_of_takes_a_workflow_or_a_dict_and_refuses_anything_else():
    assert definition_of({"name": "x"}) == {"name": "x"}
    with pytest.raises(TypeError):
        definition_of(42)
    with pytest.raises(ValueError, match="module:attribute"):
        load_definition("examples.python.support")


@pytest.mark.django_db
def test_the_command_saves_a_python_workflow_as_its_yaml_would_be(team, requester, capsys):
    call_command("workflow_save_py", "examples.python.lead_routing:workflow", team=team.slug,
                 user=requester.username)
    version = WorkflowVersion.objects.get(workflow__name="lead-routing")
    assert version.definition == parse_definition_text((EXAMPLES / "lead-routing.yaml").read_text())
    call_command("workflow_save_py", str(EXAMPLES / "python" / "lead_routing.py") + ":workflow",
                 team=team.slug, user=requester.username)
    assert "unchanged" in capsys.readouterr().out
    assert WorkflowVersion.objects.filter(workflow__name="lead-routing").count() == 1


@pytest.mark.django_db
def test_the_command_refuses_an_invalid_workflow_with_paths_and_a_person_without_the_permission(
        team, requester, outsider):
    with pytest.raises(CommandError, match="unknown step"):
        call_command("workflow_save_py", "tests.definitions.test_builder:BROKEN", team=team.slug,
                     user=requester.username)
    with pytest.raises(CommandError):
        call_command("workflow_save_py", "examples.python.lead_routing:workflow", team=team.slug,
                     user=outsider.username)
    assert not WorkflowVersion.objects.exists()


BROKEN = Workflow("broken", input_schema={"type": "object"})
BROKEN.tool("only", tool="core.echo", after=["missing"])
