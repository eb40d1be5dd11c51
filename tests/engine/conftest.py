"""Fixtures the engine's tests share."""
import pytest

HANDED = "test.claim_handed"


@pytest.fixture
def handed():
    """A tool that keeps the params each call was handed; registered for one test only."""
    from orchestrator.integrations.tools import registry

    calls: list[dict] = []

    @registry.tool(HANDED, params_schema={"type": "object"})
    def claim_handed(params, ctx):
        calls.append(params)
        return {"done": True}

    yield calls
    registry._TOOLS.pop(HANDED, None)
