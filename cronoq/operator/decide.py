"""The decision, without I/O: how many replicas a pool's desired slots call
for, or why the Deployment is left alone."""

from __future__ import annotations

from dataclasses import dataclass

from .spec import ScalerSpec

__all__ = ["Reading", "Decision", "decide", "replicas_for", "SCALE", "HOLD"]

# Reasons of the status: one when the operator set the replicas, the others
# say why it did not.
SCALED = "Scaled"
SERVER_UNREACHABLE = "ServerUnreachable"
READ_REFUSED = "ReadRefused"           # the token was refused (not a metrics token, or revoked)
POOL_NOT_REPORTED = "PoolNotReported"
UNKNOWN_SERVER = "UnknownServer"
INVALID_SPEC = "InvalidSpec"
SCALE_FAILED = "ScaleFailed"
DEPLOYMENT_NOT_FOUND = "DeploymentNotFound"

SCALE = "scale"
HOLD = "hold"


@dataclass(frozen=True, slots=True)
class Reading:
    """What the server said about the pool: its desired slots, or why there
    are none (``reason`` one of the reasons above, ``message`` for people)."""
    desired: int | None
    reason: str = ""
    message: str = ""

    @classmethod
    def of(cls, desired: int) -> Reading:
        return cls(desired=desired)

    @classmethod
    def failed(cls, reason: str, message: str) -> Reading:
        return cls(desired=None, reason=reason, message=message)


@dataclass(frozen=True, slots=True)
class Decision:
    action: str                  # SCALE or HOLD
    replicas: int | None         # with SCALE
    desired: int | None
    reason: str
    message: str


def replicas_for(desired: int, slots_per_replica: int, min_replicas: int, max_replicas: int) -> int:
    """ceil(desired / slots_per_replica), clamped to [min_replicas, max_replicas]."""
    if slots_per_replica < 1:
        raise ValueError(f"slots_per_replica must be at least 1, got {slots_per_replica}")
    needed = -(-max(desired, 0) // slots_per_replica)     # integer ceiling: no float rounding
    return max(min_replicas, min(max_replicas, needed))


def decide(spec: ScalerSpec, reading: Reading) -> Decision:
    if reading.desired is None:
        return Decision(HOLD, None, None, reading.reason, reading.message)
    replicas = replicas_for(reading.desired, spec.slots_per_replica, spec.min_replicas, spec.max_replicas)
    needed = -(-max(reading.desired, 0) // spec.slots_per_replica)
    bound = ""
    if replicas != needed:
        bound = f", clamped to [{spec.min_replicas}, {spec.max_replicas}]"
    message = (f"pool {spec.pool!r} wants {reading.desired} slots: {replicas} replicas of "
               f"{spec.slots_per_replica} slots{bound}")
    return Decision(SCALE, replicas, reading.desired, SCALED, message)
