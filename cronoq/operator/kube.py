"""The real ClusterAPI: the kubernetes client package, its blocking calls on
threads. The scale goes through the Deployment's scale subresource
(apps/v1 deployments/scale), the status through the scaler's status
subresource: the only rights the operator's ClusterRole grants."""

from __future__ import annotations

import asyncio
from typing import Any, Mapping

from .cluster import ClusterError, DeploymentNotFound

__all__ = ["KubernetesAPI", "GROUP", "VERSION", "PLURAL"]

GROUP = "cronoq.io"
VERSION = "v1alpha1"
PLURAL = "cronoqworkerscalers"


class KubernetesAPI:
    def __init__(self) -> None:
        from kubernetes import client, config

        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
        except config.ConfigException:
            config.load_kube_config()  # type: ignore[no-untyped-call]  # outside a cluster: the kubeconfig
        api_client = client.ApiClient()
        self._apps = client.AppsV1Api(api_client)
        self._custom = client.CustomObjectsApi(api_client)

    async def _run(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException

        try:
            return await asyncio.to_thread(call, *args, **kwargs)
        except ApiException as exc:
            if exc.status == 404:
                raise DeploymentNotFound(exc.reason or "not found") from None
            raise ClusterError(f"{exc.status} {exc.reason}") from None
        except OSError as exc:
            raise ClusterError(str(exc)) from None

    async def get_replicas(self, namespace: str, deployment: str) -> int:
        scale = await self._run(self._apps.read_namespaced_deployment_scale, deployment, namespace)
        return int(scale.spec.replicas or 0)

    async def set_replicas(self, namespace: str, deployment: str, replicas: int) -> None:
        await self._run(self._apps.patch_namespaced_deployment_scale, deployment, namespace,
                        {"spec": {"replicas": replicas}})

    async def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        try:
            await self._run(self._custom.patch_namespaced_custom_object_status, GROUP, VERSION, namespace,
                            PLURAL, name, {"status": dict(status)})
        except DeploymentNotFound as exc:      # the scaler itself was deleted meanwhile
            raise ClusterError(f"scaler not found: {exc}") from None
