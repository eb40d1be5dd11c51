"""Model providers behind one interface, chosen per model in the STEPWISE_MODELS registry.

`scripted` (offline, replies declared in the definition), `openai` (any OpenAI-compatible
chat-completions server: OpenAI, vLLM, Ollama, LM Studio, gateways), `azure_openai` and
`anthropic`. See docs/providers.md.
"""
from django.conf import settings

from .anthropic import AnthropicProvider
from .base import ModelReply, ModelRequest, Provider
from .openai_compat import AzureOpenAIProvider, OpenAICompatProvider
from .scripted import ScriptedProvider

PROVIDERS: dict[str, type[Provider]] = {
    "scripted": ScriptedProvider,
    "openai": OpenAICompatProvider,
    "azure_openai": AzureOpenAIProvider,
    "anthropic": AnthropicProvider,
}


def provider_for(model: str) -> tuple[Provider, dict]:
    """The provider serving `model` and the model's registry entry. Raises KeyError if unknown."""
    config = settings.STEPWISE_MODELS[model]
    return PROVIDERS[config["provider"]](config), config


__all__ = ["PROVIDERS", "ModelReply", "ModelRequest", "Provider", "provider_for"]
