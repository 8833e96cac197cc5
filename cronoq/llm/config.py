"""The LLM worker's configuration: where the provider is, what a payload may
ask for, and what tokens cost. Read from TOML (``LLMConfig.load``) or built
in code; every field has a default so a test or a script sets only a few."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

KINDS = ("llm.chat", "llm.complete", "llm.embed")


@dataclass(frozen=True)
class Price:
    """Cost per 1,000 tokens, in whatever currency the table is written in."""
    prompt_per_1k: float = 0.0
    completion_per_1k: float = 0.0

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.prompt_per_1k + completion_tokens * self.completion_per_1k) / 1000.0


@dataclass
class LLMConfig:
    # The cronoq-server this worker serves.
    target: str = "127.0.0.1:50051"
    pool: str = "llm"
    slots: int = 8
    token: str | None = None
    name: str | None = None
    # The OpenAI-compatible endpoint (".../v1"); the key from an environment variable, never the file.
    base_url: str = "https://api.openai.com/v1"
    api_key_env: str = "OPENAI_API_KEY"
    request_timeout_s: float = 120.0
    connect_timeout_s: float = 10.0
    # A larger answer fails the attempt (permanently): a guard against a runaway server, not a quota.
    max_response_mb: float = 256.0
    # What a payload that says nothing gets, and what it may ask for (empty: anything).
    model: str = "gpt-4o-mini"
    embed_model: str = "text-embedding-3-small"
    temperature: float | None = None
    max_tokens: int | None = None
    system: str | None = None
    allowed_models: tuple[str, ...] = ()
    stream: bool = False
    # Streaming progress: a checkpoint "progress" every this many chunks.
    progress_every: int = 16
    # A kind this worker does not know runs as this one instead (None: a permanent failure).
    fallback_kind: str | None = None
    # Token-per-minute limit this worker corrects estimates against (0: no local correction).
    tokens_per_minute: float = 0.0
    prices: dict[str, Price] = field(default_factory=dict)
    # "host:port" of the worker's own /metrics (loopback only); None serves none.
    metrics_addr: str | None = None

    def __post_init__(self) -> None:
        if self.slots < 1:
            raise ValueError(f"slots must be >= 1, got {self.slots}")
        if self.fallback_kind is not None and self.fallback_kind not in KINDS:
            raise ValueError(f"fallback_kind must be one of {', '.join(KINDS)}, got {self.fallback_kind!r}")
        if self.max_response_mb <= 0:
            raise ValueError(f"max_response_mb must be > 0, got {self.max_response_mb}")
        if self.progress_every < 1:
            raise ValueError(f"progress_every must be >= 1, got {self.progress_every}")

    @property
    def api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) or None

    def price(self, model: str) -> Price:
        return self.prices.get(model, Price())

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> LLMConfig:
        """From the TOML tables ``[worker]``, ``[provider]``, ``[defaults]``
        and ``[prices."MODEL"]`` (see docs/howto/llm-workloads.md)."""
        known = {"worker", "provider", "defaults", "prices", "metrics"}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown tables: {', '.join(sorted(unknown))} (known: {', '.join(sorted(known))})")
        flat: dict[str, Any] = {}
        for table in ("worker", "provider", "defaults", "metrics"):
            for key, value in dict(data.get(table, {})).items():
                flat[key] = value
        fields = set(cls.__dataclass_fields__) - {"prices"}
        bad = set(flat) - fields
        if bad:
            raise ValueError(f"unknown keys: {', '.join(sorted(bad))}")
        if "allowed_models" in flat:
            flat["allowed_models"] = tuple(flat["allowed_models"])
        prices = {model: Price(**dict(row)) for model, row in dict(data.get("prices", {})).items()}
        return cls(prices=prices, **flat)

    @classmethod
    def load(cls, path: str | Path) -> LLMConfig:
        with open(path, "rb") as f:
            return cls.from_mapping(tomllib.load(f))
