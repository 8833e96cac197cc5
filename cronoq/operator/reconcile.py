"""One pass of one scaler: read the pool, decide, scale if the replicas
differ, and write the status. Everything it touches is behind a seam."""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any, Mapping

from .cluster import ClusterAPI, ClusterError, DeploymentNotFound
from .decide import DEPLOYMENT_NOT_FOUND, INVALID_SPEC, SCALE, SCALE_FAILED, Decision, decide
from .reader import PoolReader
from .spec import ScalerSpec, SpecError

__all__ = ["reconcile"]

log = logging.getLogger("cronoq.operator")


def _timestamp(now: dt.datetime) -> str:
    return now.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


async def reconcile(namespace: str, name: str, spec: Mapping[str, Any], *, reader: PoolReader,
                    cluster: ClusterAPI, now: dt.datetime | None = None,
                    generation: int | None = None) -> dict[str, Any]:
    """Reconcile the scaler ``namespace/name`` once; returns the status it wrote.

    When it does not scale, the status keeps the last desired slots, replicas
    and read time, and its reason and message say why."""
    now = now or dt.datetime.now(dt.timezone.utc)
    status: dict[str, Any] = {}
    if generation is not None:
        status["observedGeneration"] = generation
    try:
        parsed = ScalerSpec.from_resource(spec)
    except SpecError as exc:
        status.update(reason=INVALID_SPEC, message=str(exc))
        await _write(cluster, namespace, name, status)
        return status
    reading = await reader.read(parsed.server, parsed.pool)
    decision: Decision = decide(parsed, reading)
    if reading.desired is not None:
        status.update(desiredSlots=reading.desired, lastReadTime=_timestamp(now))
    if decision.action == SCALE and decision.replicas is not None:
        try:
            current = await cluster.get_replicas(namespace, parsed.deployment)
            if current != decision.replicas:
                await cluster.set_replicas(namespace, parsed.deployment, decision.replicas)
                log.info("%s/%s: deployment %s scaled from %d to %d replicas (%s)", namespace, name,
                         parsed.deployment, current, decision.replicas, decision.message)
            status.update(replicas=decision.replicas, reason=decision.reason, message=decision.message)
        except DeploymentNotFound as exc:
            status.update(reason=DEPLOYMENT_NOT_FOUND,
                          message=f"deployment {parsed.deployment!r} not found in {namespace!r}: {exc}")
        except ClusterError as exc:
            status.update(reason=SCALE_FAILED, message=f"cannot scale deployment {parsed.deployment!r}: {exc}")
    else:
        status.update(reason=decision.reason, message=decision.message + "; the deployment is left alone")
    await _write(cluster, namespace, name, status)
    return status


async def _write(cluster: ClusterAPI, namespace: str, name: str, status: Mapping[str, Any]) -> None:
    try:
        await cluster.patch_status(namespace, name, status)
    except ClusterError as exc:
        # The next pass writes it again; the scale itself is already done.
        log.warning("%s/%s: cannot write the status: %s", namespace, name, exc)
