"""The kopf wiring: kopf watches the scalers (no handler that needs a
finalizer or stores progress, so the operator never writes the scalers
themselves, only their status), and one loop reconciles each when due."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Collection, Mapping

import kopf

from .cluster import ClusterAPI
from .decide import SCALED
from .kube import GROUP, PLURAL, VERSION
from .reader import PoolReader
from .reconcile import reconcile
from .schedule import Key, ScalerTable

__all__ = ["Operator", "build_registry", "run_operator"]

log = logging.getLogger("cronoq.operator")

# At most this many passes at once: a slow server delays the rest no further.
CONCURRENT_PASSES = 16


class Operator:
    """The scalers kopf has seen, and the loop that reconciles them."""

    def __init__(self, reader: PoolReader, cluster: ClusterAPI) -> None:
        self.reader = reader
        self.cluster = cluster
        self.table = ScalerTable()
        self._wake = asyncio.Event()
        self._limit = asyncio.Semaphore(CONCURRENT_PASSES)
        self._passes: set[asyncio.Task[None]] = set()
        self._reasons: dict[Key, str] = {}

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    def seen(self, event_type: str | None, namespace: str, name: str, body: Any) -> None:
        key = (namespace, name)
        if event_type == "DELETED":
            self.table.remove(key)
            self._reasons.pop(key, None)
        else:
            spec = dict(body.get("spec") or {})
            self.table.upsert(key, spec, body.get("metadata", {}).get("generation"), self._now())
        self._wake.set()

    async def _pass(self, key: Key, spec: Any, generation: int | None) -> None:
        try:
            async with self._limit:
                status = await reconcile(key[0], key[1], spec, reader=self.reader, cluster=self.cluster,
                                         generation=generation)
            self._log_change(key, status)
        except Exception:
            log.exception("%s/%s: the pass failed", *key)
        finally:
            self.table.done(key, self._now())
            self._wake.set()

    def _log_change(self, key: Key, status: Mapping[str, Any]) -> None:
        """Say so once when a scaler starts or stops leaving its Deployment alone, not every pass."""
        reason = str(status.get("reason", ""))
        before = self._reasons.get(key)
        self._reasons[key] = reason
        if reason == before:
            return
        if reason != SCALED:
            log.warning("%s/%s: %s: %s", key[0], key[1], reason, status.get("message", ""))
        elif before is not None:
            log.info("%s/%s: scaling again: %s", key[0], key[1], status.get("message", ""))

    async def run(self) -> None:
        try:
            while True:
                for key, spec, generation in self.table.due(self._now()):
                    task = asyncio.get_running_loop().create_task(self._pass(key, spec, generation))
                    self._passes.add(task)
                    task.add_done_callback(self._passes.discard)
                self._wake.clear()
                next_due = self.table.next_due()
                timeout = None if next_due is None else max(0.0, next_due - self._now())
                # asyncio.timeout, not wait_for: on 3.11 wait_for loses a cancel
                # that comes as the wake-up does, and the loop would never stop.
                try:
                    async with asyncio.timeout(timeout):
                        await self._wake.wait()
                except TimeoutError:
                    pass
        finally:
            for task in list(self._passes):
                task.cancel()


def build_registry(operator: Operator) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    @kopf.on.startup(registry=registry)
    async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        # Kopf's own k8s Events only for problems: a pass every 15 s would flood them.
        settings.posting.level = logging.WARNING

    # A registry of our own has no login handlers: log in as the kubernetes
    # client does (in the cluster: the service account; outside: the kubeconfig).
    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return kopf.login_via_client(**kwargs)

    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
    async def scaler_event(type: str | None, namespace: str | None, name: str | None, body: kopf.Body,
                           **_: Any) -> None:
        if namespace and name:
            operator.seen(type, namespace, name, body)

    return registry


async def run_operator(operator: Operator, *, namespaces: Collection[str] = ()) -> None:
    """kopf (standalone: no peering objects to read or write) and the loop, until kopf stops."""
    registry = build_registry(operator)
    kopf_task = asyncio.ensure_future(kopf.operator(registry=registry, standalone=True,
                                                    clusterwide=not namespaces, namespaces=list(namespaces)))
    loop_task = asyncio.ensure_future(operator.run())
    try:
        await asyncio.wait({kopf_task, loop_task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        loop_task.cancel()
        kopf_task.cancel()
        await asyncio.gather(kopf_task, loop_task, return_exceptions=True)
        if loop_task.done() and not loop_task.cancelled() and loop_task.exception() is not None:
            raise loop_task.exception()  # type: ignore[misc]
