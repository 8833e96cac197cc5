"""The Kubernetes calls the operator makes, as a seam: the real one is in
``kube.py``; tests use a fake."""

from __future__ import annotations

from typing import Any, Mapping, Protocol

__all__ = ["ClusterAPI", "ClusterError", "DeploymentNotFound"]


class ClusterError(Exception):
    """A Kubernetes call failed."""


class DeploymentNotFound(ClusterError):
    """The Deployment a scaler names does not exist."""


class ClusterAPI(Protocol):
    async def get_replicas(self, namespace: str, deployment: str) -> int:
        """spec.replicas of the Deployment's scale subresource."""

    async def set_replicas(self, namespace: str, deployment: str, replicas: int) -> None:
        """Patch spec.replicas of the Deployment's scale subresource."""

    async def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        """Merge ``status`` into the CronoqWorkerScaler's status subresource."""
