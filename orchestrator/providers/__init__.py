"""Model providers behind one interface, chosen per model in the STEPWISE_MODELS registry."""
from django.conf import settings

from .base import ModelReply, ModelRequest, Provider
from .scripted import ScriptedProvider

PROVIDERS: dict[str, type[Provider]] = {"scripted": ScriptedProvider}


def provider_for(model: str) -> tuple[Provider, dict]:
    """The provider serving `model` and the model's registry entry. Raises KeyError if unknown."""
    config = settings.STEPWISE_MODELS[model]
    return PROVIDERS[config["provider"]](config), config


__all__ = ["ModelReply", "ModelRequest", "Provider", "provider_for"]
