"""``BlockingClient``: the synchronous ``Client`` for threaded code.

It runs a ``Client`` on an event loop in a daemon thread of its own; every
method blocks the calling thread until the call is done, and may be called
from any number of threads.
"""

from __future__ import annotations

import builtins

import asyncio
import threading
from typing import Any, Coroutine, Iterable, Mapping, TypeVar

import grpc

from ..core.types import TaskSpec
from .client import (
    Client, Dependents, Explanation, Listing, ScheduleInfo, Submission, TaskInfo, TaskPage, TaskResult, WorkerInfo,
)

__all__ = ["BlockingClient"]

T = TypeVar("T")


class BlockingClient:
    """``Client`` with blocking methods (same arguments); use ``with`` or ``close()``."""

    def __init__(self, target: str, *, token: str | None = None, tls: bool = False,
                 credentials: grpc.ChannelCredentials | None = None,
                 options: Iterable[tuple[str, Any]] | None = None, retry_for: float = 15.0) -> None:
        self._client = Client(target, token=token, tls=tls, credentials=credentials, options=options,
                              retry_for=retry_for)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="cronoq-client", daemon=True)
        self._thread.start()
        self._closed = False

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            coro.close()
            raise RuntimeError("the client is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def submit(self, payload: Any = None, **options: Any) -> Submission:
        return self._run(self._client.submit(payload, **options))

    def submit_batch(self, tasks: Iterable[TaskSpec | Mapping[str, Any]]) -> builtins.list[Submission]:
        return self._run(self._client.submit_batch(list(tasks)))

    def get(self, ref: int | str) -> TaskInfo:
        return self._run(self._client.get(ref))

    def explain(self, ref: int | str) -> Explanation:
        return self._run(self._client.explain(ref))

    def dependents(self, ref: int | str, depth: int = 1, limit: int | None = None) -> Dependents:
        return self._run(self._client.dependents(ref, depth, limit))

    def wait(self, ref: int | str, timeout: float | None = None) -> TaskResult:
        return self._run(self._client.wait(ref, timeout))

    def cancel(self, ref: int | str) -> bool:
        return self._run(self._client.cancel(ref))

    def list(self, **filters: Any) -> TaskPage:
        return self._run(self._client.list(**filters))

    def workers(self, **filters: Any) -> Listing[WorkerInfo]:
        return self._run(self._client.workers(**filters))

    def recurring(self) -> Listing[ScheduleInfo]:
        return self._run(self._client.recurring())

    def snapshot(self) -> dict[str, Any]:
        return self._run(self._client.snapshot())

    def close(self) -> None:
        if self._closed:
            return
        self._run(self._client.close())
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> BlockingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
