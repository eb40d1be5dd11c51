"""OpenAI-compatible chat completions: OpenAI, Azure OpenAI, vLLM, Ollama, LM Studio, gateways.

One POST to `<base_url>/chat/completions` per `complete`, made with httpx — not the `openai`
SDK — so that there is one small client per API with no dependencies of its own, every
failure is classified by our rules (`errors.py`), and no retry happens behind the step's
retry policy (the SDK retries 429/5xx by default).

Registry entry (STEPWISE_MODELS): `provider: openai` (or `azure_openai`), `base_url`
(default https://api.openai.com/v1; for Azure .../openai/deployments/<deployment>),
`model_id`, `api_key_env` (the variable holding the key; none sent if absent), `api_version`
(Azure), `structured_output` (`json_schema` default, `json_object`, `tools`, `none`),
`max_tokens_param` (`max_tokens` or `max_completion_tokens`), `timeout_s` (default 60: the
whole call), `connect_timeout_s` (default 5), `max_response_bytes` (default 8 MiB). The call
goes through `orchestrator.integrations.egress`: only to `base_url`'s origin, an operator's
allowance.

The model may answer only through the declared channel: the message content, or — in
`tools` mode — a call of the single `respond` function. A call of any other tool is never
executed; it makes the reply invalid (and the executor may ask for a repair).
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

STRUCTURED_MODES = ("json_schema", "json_object", "tools", "none")


class OpenAICompatProvider(Provider):
    name = "openai"
    default_base_url = "https://api.openai.com/v1"

    def complete(self, request: ModelRequest) -> ModelReply:
        mode = self.config.get("structured_output", "json_schema")
        if mode not in STRUCTURED_MODES:
            raise StepError("invalid_request", f"unknown structured_output {mode!r}")
        payload, wrapped = self.payload(request, mode)
        body = post_json(self.url(), headers=self.headers(), payload=payload,
                         params=self.query(), timeout_s=self.call_timeout_s(request),
                         connect_timeout_s=self.connect_timeout_s(),
                         max_response_bytes=self.max_response_bytes())
        return self.reply(body, request, wrapped)

    # --- the request -----------------------------------------------------------------------

    def url(self) -> str:
        return self.config.get("base_url", self.default_base_url).rstrip("/") + "/chat/completions"

    def query(self) -> dict | None:
        return None

    def headers(self) -> dict:
        key = api_key(self.config, None)
        return {"Authorization": f"Bearer {key}"} if key else {}

    def payload(self, request: ModelRequest, mode: str) -> tuple[dict, bool]:
        schema, wrapped = request.output_schema, False
        if schema is not None and mode in ("json_schema", "tools"):
            schema, wrapped = wrap_schema(schema)
        system = with_contract(request.system, schema, tool=mode == "tools")
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": request.prompt})
        messages.extend({"role": m["role"], "content": m["content"] or "(empty reply)"}
                        for m in request.messages)
        payload: dict = {"model": request.model, "messages": messages}
        if request.temperature is not None:
            payload["temperature"] = request.temperature
        if request.max_tokens:
            payload[self.config.get("max_tokens_param", "max_tokens")] = request.max_tokens
        if request.output_schema is not None:
            if mode == "json_schema":
                payload["response_format"] = {"type": "json_schema", "json_schema": {
                    "name": RESPONSE_NAME, "schema": schema, "strict": False}}
            elif mode == "json_object":
                payload["response_format"] = {"type": "json_object"}
            elif mode == "tools":
                payload["tools"] = [{"type": "function", "function": {
                    "name": RESPONSE_NAME, "description": "Submit your answer.", "parameters": schema}}]
                payload["tool_choice"] = {"type": "function", "function": {"name": RESPONSE_NAME}}
        return payload, wrapped

    # --- the reply -------------------------------------------------------------------------

    def reply(self, body: dict, request: ModelRequest, wrapped: bool) -> ModelReply:
        try:
            choice = body["choices"][0]
            message = choice["message"]
        except (KeyError, IndexError, TypeError):
            raise StepError("transient", "the API reply has no choices[0].message") from None
        raw, invalid = _answer_text(message)
        value = None
        if not invalid:
            value, invalid = parse_json_reply(raw)
        if not invalid:
            value, invalid = unwrap(value, wrapped)
        if choice.get("finish_reason") == "length":
            value, invalid = None, "the reply was cut off at max_tokens"
        usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
        tokens_in = token_count(usage.get("prompt_tokens"),
                           estimate_tokens(request.system + request.prompt))
        tokens_out = token_count(usage.get("completion_tokens"), estimate_tokens(raw))
        return ModelReply(None if invalid else value, tokens_in, tokens_out, raw,
                          str(body.get("model") or request.model), invalid)


class AzureOpenAIProvider(OpenAICompatProvider):
    """Azure OpenAI: the deployment is in `base_url`, the key goes in the `api-key` header."""

    name = "azure_openai"
    default_base_url = ""

    def query(self) -> dict | None:
        return {"api-version": self.config.get("api_version", "2024-10-21")}

    def headers(self) -> dict:
        key = api_key(self.config, "AZURE_OPENAI_API_KEY")
        return {"api-key": key} if key else {}


def _answer_text(message: dict) -> tuple[str, str]:
    """(text of the answer, why it is unusable) from an assistant message."""
    if not isinstance(message, dict):
        return "", "the reply has no message"
    if message.get("refusal"):
        return str(message["refusal"]), f"the model refused: {str(message['refusal'])[:200]}"
    calls = message.get("tool_calls") or []
    if calls:
        problem = response_calls_problem([((c or {}).get("function") or {}).get("name") for c in calls])
        if problem:
            return json.dumps(calls)[:4000], problem
        arguments = calls[0]["function"].get("arguments")
        return (arguments if isinstance(arguments, str) else json.dumps(arguments)), ""
    content = message.get("content")
    if isinstance(content, list):  # some gateways return content parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return (content if isinstance(content, str) else ""), ""
