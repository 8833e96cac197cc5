"""``LLMWorker``: the provider client, the handler and a ``cronoq.client.Worker``
together, with the worker's /metrics when configured."""

from __future__ import annotations

import asyncio
import logging

from ..client.worker import Worker
from ..loopback import is_loopback
from .config import LLMConfig
from .handlers import LLMHandler
from .provider import Provider
from .usage import Usage, serve_metrics

log = logging.getLogger("cronoq.llm")


class LLMWorker:
    def __init__(self, config: LLMConfig, **worker_options: object) -> None:
        self.config = config
        self.usage = Usage()
        self.provider = Provider(config.base_url, config.api_key, timeout=config.request_timeout_s,
                                 connect_timeout=config.connect_timeout_s, max_connections=max(config.slots, 1),
                                 max_response_bytes=int(config.max_response_mb * 1024 * 1024))
        self.handler = LLMHandler(config, self.provider, self.usage)
        self.worker = Worker(config.target, config.pool, self.handler, slots=config.slots, token=config.token,
                             name=config.name or "cronoq-llm-worker", **worker_options)  # type: ignore[arg-type]
        self.metrics_port = 0
        self._metrics: asyncio.Server | None = None

    def stop(self) -> None:
        self.worker.stop()

    async def run(self, *, handle_signals: bool = True) -> None:
        if self.config.metrics_addr:
            host, _, port = self.config.metrics_addr.rpartition(":")
            if not is_loopback(host):
                raise ValueError(f"metrics_addr must be a loopback address, got {self.config.metrics_addr!r}")
            self._metrics = await serve_metrics(self.usage, host, int(port))
            self.metrics_port = self._metrics.sockets[0].getsockname()[1]
            log.info("metrics on http://%s:%d/metrics", host, self.metrics_port)
        try:
            await self.worker.run(handle_signals=handle_signals)
        finally:
            if self._metrics is not None:
                self._metrics.close()
                await self._metrics.wait_closed()
            await self.provider.close()
