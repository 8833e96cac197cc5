"""A fake Kubernetes API server for the operator's end-to-end test.

``FakeKubernetes`` serves, on a free 127.0.0.1 port, just what the operator
may use: discovery, list and watch of CronoqWorkerScalers, their status
subresource, and Deployments' scale subresource. It records every request,
so a test can check that the operator asks for nothing else (no Secrets,
no writes to the scalers themselves). ``kubeconfig(path)`` writes a
kubeconfig that points at it with a bearer token.
"""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any

from aiohttp import web

GROUP = "cronoq.io"
VERSION = "v1alpha1"
PLURAL = "cronoqworkerscalers"
TOKEN = "kube-token-for-the-fake-api"


class FakeKubernetes:
    def __init__(self) -> None:
        self.scalers: dict[tuple[str, str], dict[str, Any]] = {}
        self.replicas: dict[tuple[str, str], int] = {}
        self.requests: list[tuple[str, str]] = []          # (method, path)
        self.patch_types: set[tuple[str, str]] = set()     # (what was patched, its Content-Type)
        self.scale_patches: list[tuple[str, str, int]] = []
        self.status_patches: list[tuple[str, str, dict[str, Any]]] = []
        self.changed = asyncio.Event()
        self._version = 1
        self._watchers: list[asyncio.Queue[dict[str, Any] | None]] = []
        self._runner: web.AppRunner | None = None
        self.port = 0

    # -- the state, as a test changes it

    def add_scaler(self, namespace: str, name: str, spec: dict[str, Any]) -> None:
        self._version += 1
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "CronoqWorkerScaler",
                "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}",
                             "generation": 1, "resourceVersion": str(self._version)},
                "spec": spec}
        self.scalers[(namespace, name)] = body
        for queue in self._watchers:
            queue.put_nowait({"type": "ADDED", "object": body})

    # -- the server

    async def start(self) -> FakeKubernetes:
        app = web.Application(middlewares=[self._record])
        app.router.add_get("/api", self._core_versions)
        app.router.add_get("/api/v1", self._core_resources)
        app.router.add_get("/apis", self._groups)
        app.router.add_get(f"/apis/{GROUP}/{VERSION}", self._group_resources)
        app.router.add_get(f"/apis/{GROUP}/{VERSION}/{PLURAL}", self._list_or_watch)
        app.router.add_patch(f"/apis/{GROUP}/{VERSION}/namespaces/{{ns}}/{PLURAL}/{{name}}/status",
                             self._patch_status)
        app.router.add_get("/apis/apps/v1/namespaces/{ns}/deployments/{name}/scale", self._get_scale)
        app.router.add_patch("/apis/apps/v1/namespaces/{ns}/deployments/{name}/scale", self._patch_scale)
        app.router.add_post("/api/v1/namespaces/{ns}/events", self._event)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        # Bound here, so the port is known and nothing can take it in between.
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock).start()
        return self

    async def stop(self) -> None:
        for queue in self._watchers:
            queue.put_nowait(None)
        if self._runner is not None:
            await self._runner.cleanup()

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": f"http://127.0.0.1:{self.port}"}}],
            "users": [{"name": "fake", "user": {"token": TOKEN}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
        }))
        return path

    @web.middleware
    async def _record(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.requests.append((request.method, request.path))
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return web.json_response({"kind": "Status", "code": 401}, status=401)
        return await handler(request)

    async def _core_versions(self, request: web.Request) -> web.Response:
        return web.json_response({"kind": "APIVersions", "versions": ["v1"]})

    async def _core_resources(self, request: web.Request) -> web.Response:
        return web.json_response({"kind": "APIResourceList", "groupVersion": "v1", "resources": [
            {"name": "events", "singularName": "event", "namespaced": True, "kind": "Event",
             "verbs": ["create", "get", "list"]},
            {"name": "namespaces", "singularName": "namespace", "namespaced": False, "kind": "Namespace",
             "verbs": ["get", "list", "watch"]},
        ]})

    async def _groups(self, request: web.Request) -> web.Response:
        version = {"groupVersion": f"{GROUP}/{VERSION}", "version": VERSION}
        return web.json_response({"kind": "APIGroupList", "apiVersion": "v1", "groups": [
            {"name": GROUP, "versions": [version], "preferredVersion": version}]})

    async def _group_resources(self, request: web.Request) -> web.Response:
        return web.json_response({"kind": "APIResourceList", "groupVersion": f"{GROUP}/{VERSION}", "resources": [
            {"name": PLURAL, "singularName": "cronoqworkerscaler", "namespaced": True,
             "kind": "CronoqWorkerScaler", "shortNames": ["cws"],
             "verbs": ["delete", "get", "list", "patch", "update", "watch"]},
            {"name": f"{PLURAL}/status", "singularName": "", "namespaced": True, "kind": "CronoqWorkerScaler",
             "verbs": ["get", "patch", "update"]},
        ]})

    async def _list_or_watch(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") not in ("true", "1"):
            return web.json_response({"apiVersion": f"{GROUP}/{VERSION}", "kind": "CronoqWorkerScalerList",
                                      "metadata": {"resourceVersion": str(self._version)},
                                      "items": list(self.scalers.values())})
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self._watchers.append(queue)
        try:
            while (event := await queue.get()) is not None:
                await response.write(json.dumps(event).encode() + b"\n")
        finally:
            self._watchers.remove(queue)
        return response

    async def _patch_status(self, request: web.Request) -> web.Response:
        key = (request.match_info["ns"], request.match_info["name"])
        self.patch_types.add(("status", request.content_type))
        body = await request.json()
        scaler = self.scalers.get(key)
        if scaler is None:
            return web.json_response({"kind": "Status", "code": 404}, status=404)
        scaler.setdefault("status", {}).update(body.get("status", {}))
        self.status_patches.append((*key, body.get("status", {})))
        self.changed.set()
        return web.json_response(scaler)

    def _scale(self, key: tuple[str, str]) -> dict[str, Any]:
        return {"apiVersion": "autoscaling/v1", "kind": "Scale",
                "metadata": {"name": key[1], "namespace": key[0]},
                "spec": {"replicas": self.replicas[key]}, "status": {"replicas": self.replicas[key]}}

    async def _get_scale(self, request: web.Request) -> web.Response:
        key = (request.match_info["ns"], request.match_info["name"])
        if key not in self.replicas:
            return web.json_response({"kind": "Status", "code": 404, "reason": "NotFound"}, status=404)
        return web.json_response(self._scale(key))

    async def _patch_scale(self, request: web.Request) -> web.Response:
        key = (request.match_info["ns"], request.match_info["name"])
        if key not in self.replicas:
            return web.json_response({"kind": "Status", "code": 404, "reason": "NotFound"}, status=404)
        self.patch_types.add(("scale", request.content_type))
        body = await request.json()
        self.replicas[key] = int(body["spec"]["replicas"])
        self.scale_patches.append((*key, self.replicas[key]))
        self.changed.set()
        return web.json_response(self._scale(key))

    async def _event(self, request: web.Request) -> web.Response:
        return web.json_response(await request.json(), status=201)
