"""Only the leader serves the HTTP API: a standby, and a leader that is
stopping, answer every /v1 route and /metrics with 503 "not the leader"
(and close the connection, so a load balancer's next try can reach another
replica), while /healthz stays 200 and /readyz says 503."""

from __future__ import annotations

import asyncio
import json
import signal

import pytest

from httpkit import Raw, client, error_of, request_bytes, until
from serverkit import LISTEN, WorkerProcess, sqlite_store

pytestmark = pytest.mark.asyncio

V1 = [("POST", "/v1/tasks", {}), ("POST", "/v1/tasks:batch", {"tasks": [{}]}), ("GET", "/v1/tasks", None),
      ("GET", "/v1/tasks/1", None), ("GET", "/v1/tasks/by-key/k", None), ("DELETE", "/v1/tasks/1", None),
      ("GET", "/v1/tasks/1/result", None), ("GET", "/v1/workers", None), ("GET", "/v1/recurring", None),
      ("GET", "/v1/snapshot", None), ("GET", "/metrics", None)]


def sqlite_config(path) -> str:
    return LISTEN + sqlite_store(path, full_sync=False) + '[[pools]]\nname = "default"\n'


def assert_not_the_leader(port: int) -> None:
    for method, path, body in V1:
        with Raw(port) as raw:
            raw.send(request_bytes(method, path, body))
            status, headers, data = raw.response()
            error = json.loads(data)
            assert (status, error["code"]) == (503, "service_unavailable"), (method, path, data)
            assert error["error"].startswith("not the leader (standby or shutting down)")
            assert headers["connection"] == "close" and headers["retry-after"] == "1"
            assert raw.closed_by_peer()


async def test_a_standby_answers_503_then_serves_once_it_leads(servers, tmp_path):
    config = sqlite_config(tmp_path / "state.db")
    leader = servers(config, name="a")
    standby = servers(config, name="b", wait_for="standing by")
    await asyncio.to_thread(assert_not_the_leader, standby.http_port)
    async with client(standby) as http:
        assert (await http.get("/healthz")).status_code == 200
        readyz = await http.get("/readyz")
        assert readyz.status_code == 503 and "not the leader" in readyz.text
        assert (await http.get("/v1/openapi.json")).status_code == 200   # a static document
    async with client(leader) as http:
        sub = (await http.post("/v1/tasks", json={"key": "kept"})).json()
    assert leader.stop() == 0
    standby.wait_for("serving as the leader", timeout=30)
    async with client(standby) as http:
        assert (await http.get("/readyz")).status_code == 200
        r = await http.post("/v1/tasks", json={"key": "kept"})
        assert r.json() == {"id": sub["id"], "duplicate": True}       # the acknowledged task survived


async def test_a_stopping_leader_answers_503_while_it_drains(servers):
    server = servers(LISTEN.replace("shutdown_grace_s = 2", "shutdown_grace_s = 8")
                     + '[[pools]]\nname = "default"\n')
    worker = WorkerProcess(server.target)   # holds its task for an hour: the drain waits the whole grace
    try:
        async with client(server) as http:
            sub = (await http.post("/v1/tasks", json={})).json()
            worker.wait_for(f"started {sub['id']} 1")
            server.signal(signal.SIGTERM)
            server.wait_for("stopping")

            async def refused():
                r = await http.post("/v1/tasks", json={})
                return r.status_code == 503 and r

            r = await until(refused, what="503 while draining")
            status, code, message = error_of(r)
            assert code == "service_unavailable" and message.startswith("not the leader")
            assert r.headers["connection"] == "close"
            assert (await http.get("/readyz")).status_code == 503
            assert (await http.get("/healthz")).status_code == 200
            assert error_of(await http.get(f"/v1/tasks/{sub['id']}"))[0] == 503
        assert server.wait(60) == 0
    finally:
        worker.stop()
