"""Token usage and cost per model and pool: counters the worker adds to after
every response, served as Prometheus text on the worker's own /metrics
(cronoq-server exposes no worker metrics), and a local token bucket that
charges the difference between what a task reserved and what it used."""

from __future__ import annotations

import asyncio
import math
import time
from collections import defaultdict
from typing import Any

# Tokens per character a prompt is estimated at: about 4 characters a token for English text.
CHARS_PER_TOKEN = 4


def estimate_tokens(payload: Any, max_tokens: int | None = None) -> int:
    """Tokens a request is likely to use: its text's characters / 4, plus the
    completion it may produce (``max_tokens``, or the payload's). What the
    submitter reserves from the tokens-per-minute resource."""
    if isinstance(payload, dict):
        completion = payload.get("max_tokens", max_tokens) or 0
        parts = [payload.get("system") or "", payload.get("prompt") or ""]
        for message in payload.get("messages") or ():
            if isinstance(message, dict):
                parts.append(str(message.get("content") or ""))
        raw = payload.get("input")
        if isinstance(raw, list):
            parts.extend(str(x) for x in raw)
        elif raw is not None:
            parts.append(str(raw))
        text = "".join(parts)
    else:
        completion = max_tokens or 0
        text = str(payload or "")
    return max(1, math.ceil(len(text) / CHARS_PER_TOKEN)) + int(completion)


# The worker's Prometheus families: (name without _total, type, help) as docs/metrics.md lists them.
FAMILIES = (
    ("cronoq_llm_prompt_tokens", "counter", "Prompt tokens the provider counted."),
    ("cronoq_llm_completion_tokens", "counter", "Completion tokens the provider counted."),
    ("cronoq_llm_cost", "counter", "Cost of those tokens by the configured price table."),
    ("cronoq_llm_requests", "counter", "Provider requests by outcome (ok, retryable, permanent)."),
)


class Usage:
    """Counters keyed by (model, pool)."""

    def __init__(self) -> None:
        self.prompt_tokens: defaultdict[tuple[str, str], int] = defaultdict(int)
        self.completion_tokens: defaultdict[tuple[str, str], int] = defaultdict(int)
        self.requests: defaultdict[tuple[str, str, str], int] = defaultdict(int)   # + outcome
        self.cost: defaultdict[tuple[str, str], float] = defaultdict(float)

    def add(self, model: str, pool: str, prompt: int, completion: int, cost: float) -> None:
        self.prompt_tokens[model, pool] += prompt
        self.completion_tokens[model, pool] += completion
        self.cost[model, pool] += cost

    def request(self, model: str, pool: str, outcome: str) -> None:
        self.requests[model, pool, outcome] += 1

    def prometheus(self) -> str:
        out: list[str] = []
        series: tuple[dict[Any, Any], ...] = (self.prompt_tokens, self.completion_tokens, self.cost, self.requests)
        for (name, kind, help_), rows in zip(FAMILIES, series):
            out.append(f"# HELP {name}_total {help_}")
            out.append(f"# TYPE {name}_total {kind}")
            labels: tuple[str, ...] = ("model", "pool", "outcome") if rows is self.requests else ("model", "pool")
            for key, value in sorted(rows.items()):
                text = ",".join(f'{label}="{_escape(v)}"' for label, v in zip(labels, key))
                out.append(f"{name}_total{{{text}}} {value}")
        return "\n".join(out) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class TokenDebt:
    """The worker's side of a tokens-per-minute limit. The server's bucket
    takes what a task reserved when it is dispatched and cannot be adjusted
    afterwards; when a response used more than that, the excess is debt,
    repaid at the bucket's rate before this worker sends its next request.
    Using less is not given back (the server already spent it): the
    reservation errs on the safe side."""

    def __init__(self, tokens_per_minute: float, clock: Any = time.monotonic) -> None:
        self.rate = tokens_per_minute / 60.0
        self.debt = 0.0
        self._clock = clock
        self._at = clock()

    def _repay(self) -> None:
        now = self._clock()
        if self.rate > 0:
            self.debt = max(0.0, self.debt - (now - self._at) * self.rate)
        self._at = now

    def charge(self, reserved: int, used: int) -> None:
        self._repay()
        if self.rate > 0 and used > reserved:
            self.debt += used - reserved

    def delay(self) -> float:
        """Seconds until the debt is repaid."""
        self._repay()
        return self.debt / self.rate if self.rate > 0 else 0.0

    async def wait(self) -> None:
        delay = self.delay()
        if delay > 0:
            await asyncio.sleep(delay)


async def serve_metrics(usage: Usage, host: str, port: int) -> asyncio.Server:
    """A minimal HTTP/1.1 server answering GET /metrics with ``usage``."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            path = head.split(b" ", 2)[1] if head.count(b" ") >= 2 else b""
            if path.split(b"?")[0] == b"/metrics":
                body, status = usage.prometheus().encode(), b"200 OK"
            else:
                body, status = b"not found\n", b"404 Not Found"
            writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Type: text/plain; version=0.0.4\r\n"
                         b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(answer, host, port)
