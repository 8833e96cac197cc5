"""A CronoqWorkerScaler's spec, read and checked (the CRD's schema checks it
too, but an operator must not trust that every API server enforced it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

__all__ = ["ScalerSpec", "SpecError", "DEFAULT_MIN_REPLICAS", "DEFAULT_INTERVAL_S"]

DEFAULT_MIN_REPLICAS = 0
DEFAULT_INTERVAL_S = 15
MAX_REPLICAS_LIMIT = 100_000        # as the CRD's schema
MAX_INTERVAL_S = 3600


class SpecError(ValueError):
    """The spec is invalid; the message names the field."""


@dataclass(frozen=True, slots=True)
class ScalerSpec:
    server: str
    pool: str
    deployment: str
    slots_per_replica: int
    max_replicas: int
    min_replicas: int = DEFAULT_MIN_REPLICAS
    interval_s: int = DEFAULT_INTERVAL_S

    @classmethod
    def from_resource(cls, spec: Mapping[str, Any]) -> ScalerSpec:
        """The spec of a resource (the CRD's camelCase field names)."""
        def text(key: str) -> str:
            value = spec.get(key)
            if not isinstance(value, str) or not value:
                raise SpecError(f"spec.{key}: must be a non-empty string, got {value!r}")
            return value

        def count(key: str, low: int, high: int, default: int | None = None) -> int:
            value = spec.get(key, default)
            # bool is an int in Python, never in the CRD.
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                raise SpecError(f"spec.{key}: must be an integer from {low} to {high}, got {value!r}")
            return value

        built = cls(server=text("server"), pool=text("pool"), deployment=text("deployment"),
                    slots_per_replica=count("slotsPerReplica", 1, 1_000_000),
                    max_replicas=count("maxReplicas", 0, MAX_REPLICAS_LIMIT),
                    min_replicas=count("minReplicas", 0, MAX_REPLICAS_LIMIT, DEFAULT_MIN_REPLICAS),
                    interval_s=count("intervalSeconds", 1, MAX_INTERVAL_S, DEFAULT_INTERVAL_S))
        if built.min_replicas > built.max_replicas:
            raise SpecError(f"spec.minReplicas: must be at most maxReplicas ({built.max_replicas}), "
                            f"got {built.min_replicas}")
        return built
