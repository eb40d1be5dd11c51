"""The Anthropic Messages API: one POST to `<base_url>/v1/messages` per `complete`.

Made with httpx rather than the `anthropic` SDK for the reasons in `openai_compat.py`: one
small dependency-free client, our error classes, no retries hidden under the step's policy.

Registry entry: `provider: anthropic`, `base_url` (default https://api.anthropic.com, without
`/v1`), `model_id`, `api_key_env` (default ANTHROPIC_API_KEY), `anthropic_version` (default
2023-06-01), `max_tokens` (default 1024; the API requires one), `structured_output` (`tools`
default: the answer is the input of a forced call of the single `respond` tool; `none`: a
JSON text reply), `timeout_s`, `connect_timeout_s`, `max_response_bytes` (as in
`openai_compat.py`).

A `tool_use` block naming any other tool makes the reply invalid; it is never executed.
"""
import json

from orchestrator.engine.retry import StepError

from .base import (
    RESPONSE_NAME,
    ModelReply,
    ModelRequest,
    Provider,
    api_key,
    estimate_tokens,
    parse_json_reply,
    response_calls_problem,
    token_count,
    unwrap,
    with_contract,
    wrap_schema,
)
from .errors import post_json

STRUCTURED_MODES = ("tools", "none")
DEFAULT_MAX_TOKENS = 1024


class AnthropicProvider(Provider):
    name = "anthropic"
    default_base_url = "https://api.anthropic.com"

    def complete(self, request: ModelRequest) -> ModelReply:
        mode = self.config.get("structured_output", "tools")
        if mode not in STRUCTURED_MODES:
            raise StepError("invalid_request", f"unknown structured_output {mode!r}")
        payload, wrapped = self.payload(request, mode)
        headers = {"x-api-key": api_key(self.config, "ANTHROPIC_API_KEY") or "",
                   "anthropic-version": self.config.get("anthropic_version", "2023-06-01")}
        body = post_json(
            self.config.get("base_url", self.default_base_url).rstrip("/") + "/v1/messages",
            headers=headers, payload=payload, timeout_s=self.call_timeout_s(request),
            connect_timeout_s=self.connect_timeout_s(), max_response_bytes=self.max_response_bytes())
        return self.reply(body, request, wrapped)

    def payload(self, request: ModelRequest, mode: str) -> tuple[dict, bool]:
        schema, wrapped = request.output_schema, False
        use_tool = mode == "tools" and schema is not None
        if use_tool:
            schema, wrapped = wrap_schema(schema)
        messages = [{"role": "user", "content": request.prompt}]
        messages.extend({"role": m["role"], "content": m["content"] or "(empty reply)"}
                        for m in request.messages)
        payload: dict = {
            "model": request.model,
            "max_tokens": request.max_tokens or int(self.config.get("max_tokens", DEFAULT_MAX_TOKENS)),
            "messages": messages,
        }
        system = with_contract(request.system, schema, tool=use_tool)
        if system:
            payload["system"] = system
        if request.temperature is not None:
            payload["temperature"] = request.temperature
        if use_tool:
            payload["tools"] = [{"name": RESPONSE_NAME, "description": "Submit your answer.",
                                 "input_schema": schema}]
            payload["tool_choice"] = {"type": "tool", "name": RESPONSE_NAME}
        return payload, wrapped

    def reply(self, body: dict, request: ModelRequest, wrapped: bool) -> ModelReply:
        blocks = body.get("content")
        if not isinstance(blocks, list):
            raise StepError("transient", "the API reply has no content list")
        raw, value, invalid = _answer(blocks)
        if not invalid:
            value, invalid = unwrap(value, wrapped)
        if body.get("stop_reason") == "max_tokens":
            value, invalid = None, "the reply was cut off at max_tokens"
        usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
        tokens_in = token_count(usage.get("input_tokens"), estimate_tokens(request.system + request.prompt))
        tokens_out = token_count(usage.get("output_tokens"), estimate_tokens(raw))
        return ModelReply(None if invalid else value, tokens_in, tokens_out, raw,
                          str(body.get("model") or request.model), invalid)


def _answer(blocks: list) -> tuple[str, object, str]:
    """(raw text, value, why unusable) from the reply's content blocks."""
    calls = [b for b in blocks if isinstance(b, dict) and b.get("type") == "tool_use"]
    if calls:
        problem = response_calls_problem([b.get("name") for b in calls])
        if problem:
            return json.dumps(calls)[:4000], None, problem
        return json.dumps(calls[0].get("input")), calls[0].get("input"), ""
    text = "".join(b.get("text", "") for b in blocks if isinstance(b, dict) and b.get("type") == "text")
    value, invalid = parse_json_reply(text)
    return text, value, invalid
