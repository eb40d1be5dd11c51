"""Fixtures of the budget tests: a model on a real local HTTP server speaking the OpenAI API
(tests/support/fake_llm.py), at a price that makes each of its replies cost $0.07."""
from decimal import Decimal

import pytest

from orchestrator.engine.services.kinds.worker import step_execute
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Run
from tests.factories import SETUP
from tests.support.fake_llm import TOKENS_OUT, FakeLLM

# What one reply costs (7 output tokens at $10,000 per million), and a call with no history is
# estimated at.
CALL = Decimal("0.07")
ESTIMATE = Decimal("0.10")


@pytest.fixture(autouse=True)
def alerts_at_once(settings):
    """Alert detection (`alerts_scan`, beat's) raises the budget alerts from the budget gate's
    outbox events as soon as they are written, not once they are STEPWISE_ALERTS_SETTLE_S old."""
    settings.STEPWISE_ALERTS_SETTLE_S = 0


@pytest.fixture
def fake_llm():
    with FakeLLM() as server:
        yield server


@pytest.fixture
def priced_model(settings, fake_llm, monkeypatch):
    """`gpt`, served by `fake_llm`, in the model registry."""
    monkeypatch.setenv("FAKE_OPENAI_KEY", "sk-test-openai")
    settings.STEPWISE_MODELS = {**settings.STEPWISE_MODELS, "gpt": {
        "provider": "openai", "base_url": fake_llm.openai_base_url, "model_id": "gpt-test",
        "api_key_env": "FAKE_OPENAI_KEY", "timeout_s": 5,
        "input_usd_per_mtok": 0, "output_usd_per_mtok": 10_000}}
    settings.STEPWISE_DEFAULT_STEP_COST_USD = str(ESTIMATE)
    assert CALL == Decimal(10_000 * TOKENS_OUT) / 1_000_000


def classify_run(team, *, budget: float | None) -> Run:
    step = {"name": "classify", "type": "agent", "model": "gpt", "prompt": "Classify: my invoice",
            "repair_attempts": 1, "output_schema": {
                "type": "object", "required": ["category"],
                "properties": {"category": {"enum": ["billing", "technical"]}}}}
    definition = {"name": "classify", "input_schema": {"type": "object"}, "on_error": "pause",
                  "budget": {"max_cost_usd": budget}, "steps": [step]}
    version, _ = workflow_save(team=team, definition=definition, actor=SETUP)
    return run_start(version=version, input={}, actor=SETUP)


def execute(run: Run) -> None:
    """What a worker does with the queued step's message."""
    step = run.steps.get(name="classify")
    assert step.state == "queued"
    step_execute(step_id=step.id, worker="test")
