"""The OpenAI-compatible HTTP API, the subset the worker uses: chat
completions (with and without streaming), completions and embeddings, over
cronoq.llm.transport's pooled HTTP/1.1 client (lighter than the openai SDK
and than httpx, and the worker reads Retry-After and the status itself).
Errors become cronoq's outcomes: 429/503 with Retry-After and 408/409/5xx,
timeouts, connection errors and malformed answers retryable; other 4xx
permanent with the provider's message, and so is an answer over the size
limit (the same request would get it again)."""

from __future__ import annotations

import contextlib
import email.utils
import json
import time
from typing import Any, AsyncGenerator

from ..core.errors import Permanent, Retryable
from .transport import HTTPClient, Response, TooLarge, TransportError

# 4xx answers worth another attempt: a timeout, a conflict, a rate limit.
_RETRYABLE_4XX = frozenset({408, 409, 429})
_MESSAGE_CHARS = 500


def retry_after(response: Response) -> float | None:
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


def provider_message(response: Response) -> str:
    """The provider's error message ({"error": {"message": ...}}), or the body's start."""
    try:
        body = response.json()
        message = body["error"]["message"] if isinstance(body.get("error"), dict) else body.get("error")
        if message:
            return str(message)[:_MESSAGE_CHARS]
    except (ValueError, KeyError, TypeError, AttributeError):
        pass
    return response.text[:_MESSAGE_CHARS]


def outcome(response: Response) -> Exception:
    """The exception a non-2xx answer becomes."""
    status = response.status_code
    text = f"HTTP {status} from the provider: {provider_message(response)}"
    if status in _RETRYABLE_4XX or status >= 500:
        return Retryable(text, retry_after=retry_after(response))
    return Permanent(text)


def _body(response: Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        raise Retryable(f"the provider's answer is not JSON: {response.text[:200]!r}") from None
    if not isinstance(body, dict):
        raise Retryable(f"the provider's answer is not a JSON object: {response.text[:200]!r}")
    return body


def _failure(exc: TransportError) -> Exception:
    text = f"{type(exc).__name__} talking to the provider: {exc}"
    return Permanent(text) if isinstance(exc, TooLarge) else Retryable(text)


def _encoded(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


class Provider:
    def __init__(self, base_url: str, api_key: str | None = None, *, timeout: float = 120.0,
                 connect_timeout: float = 10.0, max_connections: int = 100,
                 max_response_bytes: int = 256 * 1024 * 1024) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.base_url = base_url.rstrip("/")
        self._http = HTTPClient(self.base_url, headers, connect_timeout=connect_timeout, read_timeout=timeout,
                                max_connections=max_connections, max_response_bytes=max_response_bytes)

    async def close(self) -> None:
        await self._http.close()

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            response = await self._http.request("POST", path, _encoded(body))
        except TransportError as exc:
            raise _failure(exc) from None
        if response.status_code >= 400:
            raise outcome(response)
        return _body(response)

    async def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self._post("/chat/completions", body)

    async def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self._post("/completions", body)

    async def embed(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self._post("/embeddings", body)

    async def stream(self, path: str, body: dict[str, Any]) -> AsyncGenerator[dict[str, Any], None]:
        """The chunks of a streamed answer (server-sent events, "data: {...}"
        lines up to "data: [DONE]"). Leaving the iteration early (a cancel)
        closes the connection."""
        body = dict(body, stream=True, stream_options={"include_usage": True})
        try:
            async with self._http.stream("POST", path, _encoded(body)) as response:
                if response.status_code >= 400:
                    raise outcome(await response.read())
                async with contextlib.aclosing(response.lines()) as lines:
                    async for line in lines:
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
        except TransportError as exc:
            raise _failure(exc) from None
        raise Retryable("the stream ended before [DONE]")
