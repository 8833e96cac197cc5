"""Pool scalers: how a pool's desired capacity reaches whatever starts workers.

A server pool's capacity is the slots of its connected workers; its
autoscaler (the library's queue-pressure policy) only asks for capacity.
Every pool exports what it asks for (``desired`` in snapshots, /metrics and
KEDA's external scaler API: the ``external`` scaler, the default). A pool
with ``scaler = { kind = "webhook", url = ... }`` also has it POSTed as
``{"pool": ..., "desired": n}`` each time it changes.

``WebhookScaler`` never blocks the scheduler: the engine's SCALE action only
records the latest value and wakes the scaler's task, which sends it from a
thread, retries failures with backoff (0.5 s doubling to 30 s) and, when
the value moved meanwhile, sends only the latest one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from .config import PoolSection

if TYPE_CHECKING:
    from ..runtime.scheduler import Scheduler

__all__ = ["WebhookScaler", "Scalers"]

log = logging.getLogger("cronoq.server")

_FIRST_RETRY_S = 0.5
_LAST_RETRY_S = 30.0


class WebhookScaler:
    """POSTs one pool's desired capacity to its webhook when it changes."""

    def __init__(self, pool: str, url: str, token: str | None, timeout: float,
                 post: Callable[[str, bytes, dict[str, str], float], int] | None = None) -> None:
        self.pool = pool
        self.url = url
        self.timeout = timeout
        self.headers = {"content-type": "application/json"}
        if token:
            self.headers["authorization"] = f"Bearer {token}"
        self._post = post or _post
        self.latest: int | None = None     # what the autoscaler asks for now
        self.sent: int | None = None       # what the webhook acknowledged last
        self.failures = 0                  # in a row, since the last success
        self._changed = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self._run())

    def desired(self, value: int) -> None:
        """The pool's new desired capacity (from the scheduler, under its lock: no waiting here)."""
        self.latest = value
        self._loop.call_soon_threadsafe(self._changed.set)   # (safe from the loop's thread too)

    async def close(self) -> None:
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass

    async def _run(self) -> None:
        delay = _FIRST_RETRY_S
        while True:
            await self._changed.wait()
            self._changed.clear()
            value = self.latest
            if value is None or value == self.sent:
                continue
            body = json.dumps({"pool": self.pool, "desired": value}).encode()
            try:
                status = await asyncio.to_thread(self._post, self.url, body, self.headers, self.timeout)
                if not 200 <= status < 300:
                    raise OSError(f"answered HTTP {status}")
            except Exception as exc:   # (the receiver's problem is logged; the scheduler carries on)
                self.failures += 1
                log.warning("pool %r: the scaler webhook failed (%s); trying again in %.1f s", self.pool, exc,
                            delay, extra={"action": "scaler_failed", "pool": self.pool})
                await asyncio.sleep(delay)
                delay = min(delay * 2, _LAST_RETRY_S)
                self._changed.set()   # (send whatever is latest by then)
                continue
            self.sent, self.failures, delay = value, 0, _FIRST_RETRY_S


def _post(url: str, body: bytes, headers: dict[str, str], timeout: float) -> int:
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:   # noqa: S310 (http(s) only)
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


class Scalers:
    """The webhook scalers of a leader's pools, following its scheduler."""

    def __init__(self, scalers: dict[str, WebhookScaler]) -> None:
        self.scalers = scalers
        self._stop: Callable[[], None] | None = None

    @classmethod
    async def start(cls, sched: Scheduler, pools: Sequence[PoolSection],
                    environ: Mapping[str, str] | None = None) -> Scalers:
        """Each webhook pool's scaler, sent the pool's desired capacity of this
        moment first (a new leader's first word), then each change."""
        env = os.environ if environ is None else environ
        made = cls({p.name: WebhookScaler(p.name, p.scaler.url, env.get(p.scaler.token_env or "", "").strip() or None,
                                          p.scaler.timeout_s)
                    for p in pools if p.scaler.kind == "webhook" and p.scaler.url is not None})
        if made.scalers:
            made._stop = sched.on_desired(made._moved)
            minimum = {p.name: p.min for p in pools}
            for pool in (await sched.snapshot()).pools:
                scaler = made.scalers.get(pool.name)
                if scaler is not None and scaler.latest is None:
                    scaler.desired(max(minimum[pool.name], pool.desired))
        return made

    def _moved(self, pool: str, desired: int) -> None:
        scaler = self.scalers.get(pool)
        if scaler is not None:
            scaler.desired(desired)

    async def close(self) -> None:
        if self._stop is not None:
            self._stop()
            self._stop = None
        for scaler in self.scalers.values():
            await scaler.close()
