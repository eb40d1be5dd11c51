"""Fixtures for provider tests: a fake OpenAI/Anthropic server and models registered on it."""
import pytest

from audit.services import external_call_authorize
from budgets.services import cost_of
from orchestrator.engine.executors import ExecContext, execute
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from tests.factories import SETUP
from tests.support.fake_llm import FakeLLM


@pytest.fixture
def fake_llm():
    with FakeLLM() as server:
        yield server


@pytest.fixture
def openai_config(fake_llm, monkeypatch) -> dict:
    monkeypatch.setenv("FAKE_OPENAI_KEY", "sk-test-openai")
    return {"provider": "openai", "base_url": fake_llm.openai_base_url, "model_id": "gpt-test",
            "api_key_env": "FAKE_OPENAI_KEY", "timeout_s": 5,
            "input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0}


@pytest.fixture
def anthropic_config(fake_llm, monkeypatch) -> dict:
    monkeypatch.setenv("FAKE_ANTHROPIC_KEY", "sk-ant-test")
    return {"provider": "anthropic", "base_url": fake_llm.url, "model_id": "claude-test",
            "api_key_env": "FAKE_ANTHROPIC_KEY", "timeout_s": 5,
            "input_usd_per_mtok": 3.0, "output_usd_per_mtok": 15.0}


@pytest.fixture
def models(settings, openai_config, anthropic_config) -> dict:
    """The model registry of these tests: `gpt` and `claude` on the fake server."""
    settings.STEPWISE_MODELS = {**settings.STEPWISE_MODELS, "gpt": openai_config,
                                "claude": anthropic_config}
    return settings.STEPWISE_MODELS


@pytest.fixture
def run_step(team, models):
    """Execute one step the way a worker's executor does, for a real run of its workflow.

    The executor records an audit entry for each external call, so the step needs a run and a
    step row: `spec` is saved as a one-step workflow (or `definition` is saved and its step
    named `spec` is run) and started; no worker picks it up, since nothing is dispatched
    inside the test transaction. Returns the executor's Result or raises its StepError.
    """
    def run(spec: dict | str, run_input: dict | None = None, step_input: dict | None = None,
            definition: dict | None = None):
        run_input = run_input or {}
        if definition is None:
            definition = {"name": f"t-{spec['name'].replace('_', '-')}",
                          "input_schema": {"type": "object"}, "steps": [spec]}
        name = spec if isinstance(spec, str) else spec["name"]
        version, _ = workflow_save(team=team, definition=definition, actor=SETUP)
        started = run_start(version=version, input=run_input, actor=SETUP)
        step = started.steps.get(name=name)
        ctx = ExecContext(str(started.id), version.workflow.name, name, 1,
                          f"{started.id}:{name}:default", step_id=step.id,
                          authorize=external_call_authorize, price=cost_of)
        normalized = next(s for s in version.normalized["steps"] if s["name"] == name)
        return execute(normalized, step_input or {"input": run_input, "steps": {}}, ctx)

    return run
