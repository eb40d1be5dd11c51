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


@pytest.fixture
def sent(monkeypatch):
    """(task, queue) of every message sent, as it is sent (a chord's, header and body, too)."""
    messages = []
    monkeypatch.setattr("orchestrator.engine.dispatch.current_app.send_task",
                        lambda name, args, **options: messages.append((name.rsplit(".", 1)[-1],
                                                                       options.get("queue"))))

    def chord(header, app=None):
        return lambda body: messages.extend(
            [(s.task.rsplit(".", 1)[-1], s.options["queue"]) for s in header]
            + [(body.task.rsplit(".", 1)[-1], body.options["queue"])])

    monkeypatch.setattr("orchestrator.engine.dispatch.chord", chord)
    return messages
