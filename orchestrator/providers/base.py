"""The provider interface. A provider turns a request into a reply or a classified StepError."""
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ModelRequest:
    model: str
    prompt: str
    system: str = ""
    output_schema: dict | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    # Offline scripted replies declared in the definition, and what their `when` may read.
    script: list = field(default_factory=list)
    context: dict = field(default_factory=dict)
    fixture_key: str = ""


@dataclass(frozen=True)
class ModelReply:
    output: object  # parsed JSON value
    tokens_in: int
    tokens_out: int
    raw: str = ""


class Provider:
    name = "base"

    def __init__(self, config: dict):
        self.config = config

    def complete(self, request: ModelRequest) -> ModelReply:  # pragma: no cover - interface
        raise NotImplementedError
