"""KEDA's external scaler API on the gRPC port (docs/server.md, "KEDA's external scaler").

This module reads the trigger and decides; grpc_api.ExternalScalerServicer
serves it. A ScaledObject trigger of type ``external`` (or ``external-push``) names a
pool in its metadata; the server answers with that pool's ``desired`` slots
(what its autoscaler asks for, at least its ``min``) as the one metric, and
``slotsPerReplica`` (default 1) as the target per replica, so the HPA that
KEDA manages runs ceil(desired / slotsPerReplica) replicas. The pool is
active while it asks for capacity or holds work (pending or busy slots).

Every call needs the metrics role: the usual credentials (``authorization``
metadata, a client certificate mapped to a role: what KEDA's
TriggerAuthentication gives an external scaler, as tlsClientCert and
tlsClientKey), or a token in the trigger's metadata (``token``, or
``tokenFromEnv``, which KEDA fills from the scaled workload's environment).
With [[shards]], another shard's pool is answered by asking that shard.
"""

from __future__ import annotations

import re

from .._proto import cronoq_pb2 as pb
from .._proto import externalscaler_pb2 as es
from .errors import Code, ServiceError

__all__ = ["Trigger", "active", "metric_name", "trigger_token", "POOL_KEY", "SLOTS_KEY", "TOKEN_KEYS",
           "STREAM_POLL_S"]

POOL_KEY = "pool"
SLOTS_KEY = "slotsPerReplica"
# A bearer token in the trigger's metadata: "token" as written, or
# "tokenFromEnv" naming an environment variable of the scaled workload's
# container, which KEDA resolves before calling (its external scaler passes
# the trigger's metadata only, not a TriggerAuthentication's parameters).
TOKEN_KEYS = ("token", "tokenFromEnv")

# StreamIsActive looks again at least this often: pending and busy slots
# move without the autoscaler's target moving (which wakes it at once).
STREAM_POLL_S = 1.0


def metric_name(pool: str) -> str:
    """The metric's name: lower case letters, digits and dashes, as the
    external metrics API's paths want them."""
    return "cronoq-" + re.sub(r"[^a-z0-9-]+", "-", pool.lower()).strip("-") + "-desired"


def trigger_token(ref: es.ScaledObjectRef) -> str | None:
    """The bearer token the trigger's metadata carries, if any."""
    for key in TOKEN_KEYS:
        token = ref.scalerMetadata.get(key, "").strip()
        if token:
            return token
    return None


class Trigger:
    """What the trigger metadata asks for: a pool and the slots of one replica."""

    def __init__(self, ref: es.ScaledObjectRef) -> None:
        metadata = ref.scalerMetadata
        pool = metadata.get(POOL_KEY, "").strip()
        if not pool:
            raise ServiceError(Code.INVALID_ARGUMENT,
                               f"the trigger's metadata needs {POOL_KEY!r}: the name of a cronoq pool")
        self.pool = pool
        raw = metadata.get(SLOTS_KEY, "").strip()
        try:
            slots = int(raw) if raw else 1
        except ValueError:
            slots = 0
        if slots < 1:
            raise ServiceError(Code.INVALID_ARGUMENT,
                               f"the trigger's {SLOTS_KEY!r} must be a whole number >= 1, got {raw!r}")
        self.slots_per_replica = slots
        self.metric = metric_name(pool)


def active(pool: pb.PoolSnapshot) -> bool:
    """IsActive: the pool asks for capacity or holds work."""
    return bool(pool.desired or pool.pending or pool.busy)
