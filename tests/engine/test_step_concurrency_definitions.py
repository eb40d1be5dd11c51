"""A step's `concurrency` in a definition: its key is a template over the run's input only, it
belongs to steps a worker runs (agent, tool) and never to a map's item, which is no step."""
import pytest

from orchestrator.engine.definitions.problems import DefinitionInvalid
from orchestrator.engine.services.workflows import workflow_save
from tests.factories import SETUP

pytestmark = pytest.mark.django_db

KEYED = {"key": "{{ input.customer }}", "limit": 1}


def save(team, *steps):
    return workflow_save(team=team, definition={
        "name": "keyed-steps", "input_schema": {"type": "object"}, "steps": list(steps)},
        actor=SETUP)[0]


def problems_of(team, *steps) -> str:
    with pytest.raises(DefinitionInvalid) as refused:
        save(team, *steps)
    return str(refused.value)


def test_a_tool_or_agent_step_takes_a_concurrency_key_over_the_input(team):
    version = save(team, {"name": "refund", "type": "tool", "tool": "core.echo", "concurrency": KEYED})

    assert version.normalized["steps"][0]["concurrency"] == KEYED


def test_a_key_that_reads_a_step_s_output_is_refused_with_its_path(team):
    first = {"name": "look", "type": "tool", "tool": "core.echo"}
    keyed = {"name": "refund", "type": "tool", "tool": "core.echo", "after": ["look"],
             "concurrency": {"key": "{{ steps.look.output.customer }}", "limit": 1}}

    assert "steps[1].concurrency.key" in problems_of(team, first, keyed)


@pytest.mark.parametrize("step", [
    {"name": "each", "type": "map", "over": "input.items",
     "item": {"type": "tool", "tool": "core.echo", "concurrency": KEYED}},
    {"name": "refund", "type": "tool", "tool": "core.echo", "concurrency": {"key": "x", "limit": 0}},
])
def test_a_map_item_takes_no_key_and_a_limit_is_at_least_one(team, step):
    assert "concurrency" in problems_of(team, step)
