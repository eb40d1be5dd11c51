"""The offline `scripted` provider: deterministic replies declared in the definition.

A step's `script` is a list of replies; the first whose `when` (CEL, over the step input)
holds — or that has no `when` — is the reply; strings in its `output` are Jinja templates
rendered with the step input, so a reply can echo what it was given. A model's registry
entry may instead name a `fixture` JSON file mapping "<workflow>.<step>" to such a list. An
entry may declare an `error` class (to exercise retries) and a `delay_ms`. Token counts
default to ~4 characters a token, so budgets and dashboards have figures to show. Being
deterministic, it is never asked to repair a reply: an invalid one fails the attempt at once.
"""
import json
import time
from functools import lru_cache
from pathlib import Path

from django.conf import settings

from orchestrator.engine.definitions import (
    ExpressionError,
    TemplateError,
    evaluate_expression,
    render_value,
)
from orchestrator.engine.retry import StepError

from .base import ModelReply, ModelRequest, Provider, estimate_tokens


@lru_cache(maxsize=32)
def _fixture(path: str) -> dict:
    file = Path(path)
    if not file.is_absolute():
        file = Path(settings.BASE_DIR) / file
    return json.loads(file.read_text())


class ScriptedProvider(Provider):
    name = "scripted"
    # The same request always gets the same reply, so asking again to repair one is pointless.
    deterministic = True

    def complete(self, request: ModelRequest) -> ModelReply:
        script = request.script
        if not script and self.config.get("fixture"):
            script = _fixture(self.config["fixture"]).get(request.fixture_key, [])
        reply = self._choose(script, request.context)
        if reply is None:
            raise StepError("permanent", "the scripted model has no reply for this input")
        if reply.get("delay_ms"):
            time.sleep(reply["delay_ms"] / 1000)
        tokens_in = reply.get("tokens_in", estimate_tokens(request.system + request.prompt))
        if reply.get("error"):
            raise StepError(reply["error"], f"scripted {reply['error']}")
        try:
            output = render_value(reply["output"], request.context)
        except TemplateError as exc:
            raise StepError("invalid_output", f"scripted reply could not be rendered: {exc}") from exc
        raw = json.dumps(output)
        return ModelReply(output, tokens_in, reply.get("tokens_out", estimate_tokens(raw)), raw,
                          model_id=f"scripted:{request.model}")

    @staticmethod
    def _choose(script: list, context: dict) -> dict | None:
        for entry in script:
            condition = entry.get("when")
            if not condition:
                return entry
            try:
                if evaluate_expression(condition, context) is True:
                    return entry
            except ExpressionError:
                continue
        return None
