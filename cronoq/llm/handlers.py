"""What the worker does with a lease of each kind: build the provider
request from the payload and the configured defaults, send it (streamed
when asked, with progress checkpoints), and return the text with its usage
and cost."""

from __future__ import annotations

import contextlib
import time
from typing import Any, Awaitable, Callable

from ..client.worker import Lease
from ..core.errors import Permanent, Retryable
from .config import KINDS, LLMConfig
from .provider import Provider
from .usage import TokenDebt, Usage, estimate_tokens

PROGRESS_STAGE = "progress"


class LLMHandler:
    """The ``cronoq.client.Worker`` handler (async: the worker runs up to its
    slots of them at once on one event loop)."""

    def __init__(self, config: LLMConfig, provider: Provider, usage: Usage | None = None) -> None:
        self.config = config
        self.provider = provider
        self.usage = usage or Usage()
        self.debt = TokenDebt(config.tokens_per_minute)
        self._kinds: dict[str, Callable[[Lease, dict[str, Any]], Awaitable[dict[str, Any]]]] = {
            "llm.chat": self.chat, "llm.complete": self.complete, "llm.embed": self.embed}

    async def __call__(self, lease: Lease) -> dict[str, Any]:
        run = self._kinds.get(lease.kind)
        if run is None:
            if self.config.fallback_kind is None:
                raise Permanent(f"unknown kind {lease.kind!r}: this worker runs {', '.join(KINDS)}")
            run = self._kinds[self.config.fallback_kind]
        try:
            payload = lease.json() if lease.payload else {}
        except ValueError:
            payload = lease.text()
        if isinstance(payload, str):
            payload = {"prompt": payload}
        if not isinstance(payload, dict):
            raise Permanent(f"the payload must be a JSON object or a string, got {type(payload).__name__}")
        await self.debt.wait()
        return await run(lease, payload)

    # -- the request's fields

    def _model(self, payload: dict[str, Any], default: str) -> str:
        model = payload.get("model") or default
        if not isinstance(model, str):
            raise Permanent("model must be a string")
        if self.config.allowed_models and model not in self.config.allowed_models:
            raise Permanent(f"model {model!r} is not allowed here (allowed: {', '.join(self.config.allowed_models)})")
        return model

    def _sampling(self, payload: dict[str, Any], body: dict[str, Any]) -> None:
        for name, default in (("temperature", self.config.temperature), ("max_tokens", self.config.max_tokens)):
            value = payload.get(name, default)
            if value is not None:
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise Permanent(f"{name} must be a number, got {value!r}")
                body[name] = value

    def _messages(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        messages = payload.get("messages")
        if messages is None:
            prompt = payload.get("prompt")
            if not isinstance(prompt, str):
                raise Permanent("llm.chat needs messages (a list) or prompt (a string)")
            messages = [{"role": "user", "content": prompt}]
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise Permanent("messages must be a list of objects")
        system = payload.get("system", self.config.system)
        if system and not any(m.get("role") == "system" for m in messages):
            messages = [{"role": "system", "content": system}, *messages]
        return messages

    # -- the kinds

    async def chat(self, lease: Lease, payload: dict[str, Any]) -> dict[str, Any]:
        model = self._model(payload, self.config.model)
        body: dict[str, Any] = {"model": model, "messages": self._messages(payload)}
        return await self._generated(lease, payload, "/chat/completions", body, self.provider.chat,
                                     ("message", "content"), "chat")

    async def complete(self, lease: Lease, payload: dict[str, Any]) -> dict[str, Any]:
        model = self._model(payload, self.config.model)
        prompt = payload.get("prompt")
        if not isinstance(prompt, str):
            raise Permanent("llm.complete needs prompt (a string)")
        body: dict[str, Any] = {"model": model, "prompt": prompt}
        return await self._generated(lease, payload, "/completions", body, self.provider.complete, ("text",),
                                     "completion")

    async def _generated(self, lease: Lease, payload: dict[str, Any], path: str, body: dict[str, Any],
                         call: Callable[[dict[str, Any]], Awaitable[Any]], field: tuple[str, ...],
                         what: str) -> dict[str, Any]:
        """A chat or completion: streamed, or one answer whose text is at choices[0].<field>."""
        model = body["model"]
        self._sampling(payload, body)
        if payload.get("stream", self.config.stream):
            return await self._streamed(lease, payload, path, body, model)
        answer = await self._counted(model, lease.pool, call(body))
        try:
            choice = answer["choices"][0]
            text = choice
            for name in field:
                text = text[name]
        except (KeyError, IndexError, TypeError):
            raise Retryable(f"the provider's {what} answer has no choices[0].{field[0]}") from None
        return self._result(lease, payload, model, text or "", choice.get("finish_reason"), answer.get("usage"))

    async def embed(self, lease: Lease, payload: dict[str, Any]) -> dict[str, Any]:
        model = self._model(payload, self.config.embed_model)
        raw = payload.get("input", payload.get("prompt"))
        if not isinstance(raw, (str, list)):
            raise Permanent("llm.embed needs input (a string or a list of strings)")
        answer = await self._counted(model, lease.pool, self.provider.embed({"model": model, "input": raw}))
        try:
            vectors = [row["embedding"] for row in sorted(answer["data"], key=lambda r: r.get("index", 0))]
        except (KeyError, TypeError, AttributeError):
            raise Retryable("the provider's embeddings answer has no data[].embedding") from None
        result = self._result(lease, payload, model, None, None, answer.get("usage"))
        result.pop("text")
        result.pop("finish_reason")
        result["embeddings"] = vectors
        return result

    # -- sending and counting

    async def _counted(self, model: str, pool: str, call: Awaitable[dict[str, Any]]) -> dict[str, Any]:
        try:
            answer = await call
        except Retryable:
            self.usage.request(model, pool, "retryable")
            raise
        except Permanent:
            self.usage.request(model, pool, "permanent")
            raise
        self.usage.request(model, pool, "ok")
        return answer

    async def _streamed(self, lease: Lease, payload: dict[str, Any], path: str, body: dict[str, Any],
                        model: str) -> dict[str, Any]:
        parts: list[str] = []
        chunks = 0
        finish: str | None = None
        usage: dict[str, Any] | None = None
        started = time.monotonic()
        try:
            # aclosing: a cancel while a progress checkpoint is saved closes the stream now, not at collection.
            async with contextlib.aclosing(self.provider.stream(path, body)) as stream:
                async for chunk in stream:
                    if isinstance(chunk.get("usage"), dict):
                        usage = chunk["usage"]
                    for choice in chunk.get("choices") or ():
                        piece = (choice.get("delta") or {}).get("content") if "delta" in choice else choice.get("text")
                        if piece:
                            parts.append(piece)
                            chunks += 1
                            if chunks % self.config.progress_every == 0:
                                await self._progress(lease, chunks, parts, started)
                        finish = choice.get("finish_reason") or finish
        except Retryable:
            self.usage.request(model, lease.pool, "retryable")
            raise
        except Permanent:
            self.usage.request(model, lease.pool, "permanent")
            raise
        self.usage.request(model, lease.pool, "ok")
        return self._result(lease, payload, model, "".join(parts), finish, usage, chunks=chunks)

    async def _progress(self, lease: Lease, chunks: int, parts: list[str], started: float) -> None:
        """A checkpoint the dashboard and ``cronoq watch`` show: tokens so far
        (one streamed chunk is one token with OpenAI's API)."""
        try:
            await lease.checkpoint(PROGRESS_STAGE, {"tokens": chunks, "chars": sum(map(len, parts)),
                                                    "elapsed_s": round(time.monotonic() - started, 3)})
        except Exception:   # an older server, or one that refuses: the generation matters more than its progress
            pass

    def _result(self, lease: Lease, payload: dict[str, Any], model: str, text: str | None, finish: Any,
                usage: Any, chunks: int | None = None) -> dict[str, Any]:
        prompt_tokens = completion_tokens = 0
        if isinstance(usage, dict):
            prompt_tokens = int(usage.get("prompt_tokens") or 0)
            completion_tokens = int(usage.get("completion_tokens") or 0)
        elif chunks is not None:
            completion_tokens = chunks   # a stream without a usage chunk: count what arrived
        cost = self.config.price(model).cost(prompt_tokens, completion_tokens)
        self.usage.add(model, lease.pool, prompt_tokens, completion_tokens, cost)
        self.debt.charge(estimate_tokens(payload, self.config.max_tokens), prompt_tokens + completion_tokens)
        return {"text": text, "model": model, "finish_reason": finish,
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                          "total_tokens": prompt_tokens + completion_tokens},
                "cost": cost}
