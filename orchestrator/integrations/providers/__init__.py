"""Model providers behind one interface, chosen per model in the STEPWISE_MODELS registry.

`scripted` (offline, replies declared in the definition), `openai` (any OpenAI-compatible
chat-completions server: OpenAI, vLLM, Ollama, LM Studio, gateways), `azure_openai` and
`anthropic`. A model name may be served by ordered routes, each a provider entry (`routes.py`).
See docs/providers.md.
"""
from django.conf import settings
from django.core import checks

from .anthropic import AnthropicProvider
from .base import ModelReply, ModelRequest, Provider
from .openai_compat import AzureOpenAIProvider, OpenAICompatProvider
from .routes import Route, registry_problems, route_dependencies, routes_for
from .scripted import ScriptedProvider

PROVIDERS: dict[str, type[Provider]] = {
    "scripted": ScriptedProvider,
    "openai": OpenAICompatProvider,
    "azure_openai": AzureOpenAIProvider,
    "anthropic": AnthropicProvider,
}


@checks.register()
def check_model_registry(app_configs, **kwargs) -> list[checks.CheckMessage]:
    """A model registry entry that cannot serve a call stops `manage.py check` (and start-up)."""
    return [checks.Error(problem, id="stepwise.models.E001")
            for problem in registry_problems(settings.STEPWISE_MODELS, PROVIDERS)]


__all__ = ["PROVIDERS", "ModelReply", "ModelRequest", "Provider", "Route", "route_dependencies",
           "routes_for"]
