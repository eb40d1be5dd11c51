"""Which prompt produced an output: the prompt hash every attempt record and ledger entry carries.

The hash covers the definition's templates (not the rendered text, which the persisted step
input reproduces) and the version of the framing the agent executor adds around them, so the
executors and the audit ledger compute it the same way. Pure.
"""
from .hashing import digest_of

# Bump when the framing the agent executor adds around the author's prompts (contract text,
# repair turns) changes, so the prompt hash on an attempt tells which framing produced it.
FRAME_VERSION = "stepwise-agent/1"


def prompt_hash(spec: dict, **extra: str) -> str:
    """SHA-256 of an agent (or LLM router) step's prompt templates and the framing version;
    `extra` adds what else the model is shown (a router's route menu)."""
    return digest_of({"system": spec.get("system") or "", "prompt": spec["prompt"],
                      **extra, "frame": FRAME_VERSION})
