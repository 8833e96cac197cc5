"""The OpenAI-compatible HTTP API, the subset the worker uses: chat
completions (with and without streaming), completions and embeddings, over
one httpx.AsyncClient (httpx is lighter than the openai SDK and lets the
worker read Retry-After and the status itself). Errors become cronoq's
outcomes: 429/503 with Retry-After and 408/409/5xx, timeouts and connection
errors retryable; other 4xx permanent with the provider's message."""

from __future__ import annotations

import email.utils
import json
import time
from typing import Any, AsyncIterator

import httpx

from ..core.errors import Permanent, Retryable

# 4xx answers worth another attempt: a timeout, a conflict, a rate limit.
_RETRYABLE_4XX = frozenset({408, 409, 429})
_MESSAGE_CHARS = 500


def retry_after(response: httpx.Response) -> float | None:
    """Seconds the provider asks to wait: Retry-After in seconds or as an
    HTTP date, or OpenAI's retry-after-ms; None without one."""
    ms = response.headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = response.headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def provider_message(response: httpx.Response) -> str:
    """The provider's error message ({"error": {"message": ...}}), or the body's start."""
    try:
        body = response.json()
        message = body["error"]["message"] if isinstance(body.get("error"), dict) else body.get("error")
        if message:
            return str(message)[:_MESSAGE_CHARS]
    except (ValueError, KeyError, TypeError, AttributeError):
        pass
    return response.text[:_MESSAGE_CHARS]


def outcome(response: httpx.Response) -> Exception:
    """The exception a non-2xx answer becomes."""
    status = response.status_code
    text = f"HTTP {status} from the provider: {provider_message(response)}"
    if status in _RETRYABLE_4XX or status >= 500:
        return Retryable(text, retry_after=retry_after(response))
    return Permanent(text)


def _body(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        raise Retryable(f"the provider's answer is not JSON: {response.text[:200]!r}") from None
    if not isinstance(body, dict):
        raise Retryable(f"the provider's answer is not a JSON object: {response.text[:200]!r}")
    return body


class Provider:
    def __init__(self, base_url: str, api_key: str | None = None, *, timeout: float = 120.0,
                 connect_timeout: float = 10.0, max_connections: int = 100) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.base_url = base_url.rstrip("/")
        self._http = httpx.AsyncClient(
            base_url=self.base_url, headers=headers, trust_env=False,
            timeout=httpx.Timeout(timeout, connect=connect_timeout),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections))

    async def close(self) -> None:
        await self._http.aclose()

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            response = await self._http.post(path, json=body)
        except (httpx.TimeoutException, httpx.TransportError) as exc:
            raise Retryable(f"{type(exc).__name__} talking to the provider: {exc}") from None
        if response.status_code >= 400:
            raise outcome(response)
        return _body(response)

    async def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self._post("/chat/completions", body)

    async def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self._post("/completions", body)

    async def embed(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self._post("/embeddings", body)

    async def stream(self, path: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """The chunks of a streamed answer (server-sent events, "data: {...}"
        lines up to "data: [DONE]"). Leaving the iteration early (a cancel)
        closes the HTTP request."""
        body = dict(body, stream=True, stream_options={"include_usage": True})
        try:
            async with self._http.stream("POST", path, json=body) as response:
                if response.status_code >= 400:
                    await response.aread()
                    raise outcome(response)
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    try:
                        chunk = json.loads(data)
                    except ValueError:
                        raise Retryable(f"a streamed chunk is not JSON: {data[:200]!r}") from None
                    if isinstance(chunk, dict):
                        yield chunk
        except (httpx.TimeoutException, httpx.TransportError) as exc:
            raise Retryable(f"{type(exc).__name__} talking to the provider: {exc}") from None
        raise Retryable("the stream ended before [DONE]")
