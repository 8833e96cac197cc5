"""``cronoq.llm``: a remote worker for cronoq-server that runs LLM calls
against an OpenAI-compatible endpoint (kinds ``llm.chat``, ``llm.complete``,
``llm.embed``). ``LLMWorker`` runs it in code, ``cronoq-llm-worker`` from a
TOML file; ``resources_for`` and ``estimate_tokens`` size what a task
reserves from the provider's rate limits (docs/howto/llm-workloads.md)."""

from __future__ import annotations

from typing import Any

from .config import KINDS, LLMConfig, Price
from .usage import Usage, estimate_tokens
from .worker import LLMWorker

__all__ = ["KINDS", "LLMConfig", "LLMWorker", "Price", "Usage", "estimate_tokens", "resources_for"]


def resources_for(payload: Any, *, rpm: str | None = "llm-rpm", tpm: str | None = "llm-tpm",
                  max_tokens: int | None = None) -> dict[str, int]:
    """The resource amounts one LLM task asks for: one request from the
    requests-per-minute bucket ``rpm`` and its estimated tokens from the
    tokens-per-minute bucket ``tpm`` (None leaves a bucket out)."""
    amounts: dict[str, int] = {}
    if rpm:
        amounts[rpm] = 1
    if tpm:
        amounts[tpm] = estimate_tokens(payload, max_tokens)
    return amounts
