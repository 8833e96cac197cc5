"""Tasks.Dependents and GET /v1/tasks/{id}/dependents (and by key) against a
real cronoq-server: a small DAG a -> b, a -> c, c -> d, its dependents level
by level, by id and by key, while the tasks wait and after they finished
(from the leader's record of recent tasks), limits, errors, roles and pool
scope, through gRPC, HTTP, cronoq.client (Client, BlockingClient) and the
command line."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest

import cronoq
from cronoq._proto import cronoq_pb2 as pb
from cronoq._proto import cronoq_pb2_grpc as pb_grpc
from cronoq.client import BlockingClient, Client, Worker
from clikit import cronoq as run_cronoq
from clikit import err
from httpkit import client as http_client
from httpkit import error_of
from serverkit import AUTH, CLIENT, LISTEN, METRICS, WORKER

SCOPED = "scoped-client-token-0123456789abcd"

CONFIG = LISTEN + AUTH + f"""
[[auth.tokens]]
token = "{SCOPED}"
role = "client"
pools = ["other"]

[[pools]]
name = "default"
[[pools]]
name = "idle"
[[pools]]
name = "other"
"""


@pytest.fixture(scope="module")
def server(module_servers):
    return module_servers(CONFIG, name="dependents")


async def submit_dag(client: Client, pool: str, prefix: str) -> dict[str, int]:
    """a -> b, a -> c (on completion), c -> d, with keys PREFIX-a to PREFIX-d."""
    subs = await client.submit_batch([
        cronoq.Task(pool=pool, key=f"{prefix}-a"),
        cronoq.Task(pool=pool, key=f"{prefix}-b", after=f"{prefix}-a"),
        cronoq.Task(pool=pool, key=f"{prefix}-c", deps=[cronoq.Dep(f"{prefix}-a", on="complete")]),
        cronoq.Task(pool=pool, key=f"{prefix}-d", after=f"{prefix}-c"),
    ])
    return dict(zip("abcd", (s.id for s in subs)))


@pytest.mark.asyncio
async def test_dependents_level_by_level_by_id_and_key_over_grpc(server):
    async with Client(server.target, token=CLIENT) as client:
        ids = await submit_dag(client, "idle", "live")
        first = await client.dependents(ids["a"])
        assert (first.id, first.key, first.status, first.truncated) == (ids["a"], "live-a", "ready", False)
        assert [(d.id, d.key, d.status, d.depth, d.depends_on) for d in first.dependents] == [
            (ids["b"], "live-b", "blocked", 1, [ids["a"]]),
            (ids["c"], "live-c", "blocked", 1, [ids["a"]]),
        ]
        assert first.dependents[0].deps == [("live-a", "success")]
        assert first.dependents[1].deps == [("live-a", "complete")]
        two = await client.dependents("live-a", depth=2)
        assert [(d.id, d.depth, d.depends_on) for d in two.dependents] == [
            (ids["b"], 1, [ids["a"]]), (ids["c"], 1, [ids["a"]]), (ids["d"], 2, [ids["c"]])]
        assert [d.id for d in (await client.dependents(ids["c"], depth=5)).dependents] == [ids["d"]]
        assert (await client.dependents("live-d")).dependents == []
        limited = await client.dependents(ids["a"], depth=2, limit=2)
        assert [d.id for d in limited.dependents] == [ids["b"], ids["c"]] and limited.truncated
        with pytest.raises(cronoq.UnknownTask):
            await client.dependents(10 ** 12)
        with pytest.raises(cronoq.UnknownTask):
            await client.dependents("no-such-key")


@pytest.mark.asyncio
async def test_a_finished_tasks_dependents_are_still_found(server):
    worker = Worker(server.target, "default", lambda lease: "done", token=WORKER, initial_backoff=0.05)
    running = asyncio.create_task(worker.run())
    try:
        async with Client(server.target, token=CLIENT) as client:
            ids = await submit_dag(client, "default", "done")
            assert (await client.wait(ids["d"], timeout=30)).ok
            found = await client.dependents("done-a", depth=3)
            assert found.status == "succeeded"
            assert [(d.id, d.status, d.depth) for d in found.dependents] == [
                (ids["b"], "succeeded", 1), (ids["c"], "succeeded", 1), (ids["d"], "succeeded", 2)]
    finally:
        worker.stop()
        await asyncio.wait_for(running, 30)


@pytest.mark.asyncio
async def test_the_http_routes_by_id_and_by_key(server):
    async with Client(server.target, token=CLIENT) as client:
        ids = await submit_dag(client, "idle", "http/x")
    async with http_client(server, CLIENT) as http:
        r = await http.get(f"/v1/tasks/{ids['a']}/dependents")
        assert r.status_code == 200, r.text
        body = r.json()
        assert body == {"id": str(ids["a"]), "key": "http/x-a", "status": "ready", "truncated": False, "dependents": [
            {"id": str(ids["b"]), "key": "http/x-b", "status": "blocked", "pool": "idle", "depth": 1,
             "depends_on": [str(ids["a"])], "deps": [{"key": "http/x-a", "cond": "on_success"}]},
            {"id": str(ids["c"]), "key": "http/x-c", "status": "blocked", "pool": "idle", "depth": 1,
             "depends_on": [str(ids["a"])], "deps": [{"key": "http/x-a", "cond": "on_complete"}]}]}
        r = await http.get("/v1/tasks/by-key/http%2Fx-a/dependents", params={"depth": "2"})
        assert r.status_code == 200, r.text
        assert [(d["id"], d["depth"], d["depends_on"]) for d in r.json()["dependents"]] == [
            (str(ids["b"]), 1, [str(ids["a"])]), (str(ids["c"]), 1, [str(ids["a"])]),
            (str(ids["d"]), 2, [str(ids["c"])])]
        r = await http.get(f"/v1/tasks/{ids['a']}/dependents", params={"depth": "2", "limit": "1"})
        assert [d["id"] for d in r.json()["dependents"]] == [str(ids["b"])] and r.json()["truncated"] is True
        status, code, error = error_of(await http.get(f"/v1/tasks/{ids['a']}/dependents", params={"depth": "6"}))
        assert (status, code) == (400, "bad_request") and "depth" in error
        status, code, error = error_of(await http.get(f"/v1/tasks/{ids['a']}/dependents", params={"width": "1"}))
        assert status == 400 and "width" in error
        status, code, _ = error_of(await http.get("/v1/tasks/999999999999/dependents"))
        assert (status, code) == (404, "not_found")
        status, code, _ = error_of(await http.get("/v1/tasks/by-key/no-such-key/dependents"))
        assert (status, code) == (404, "not_found")
        assert (await http.post(f"/v1/tasks/{ids['a']}/dependents")).status_code == 405


@pytest.mark.asyncio
async def test_roles_and_pool_scope(server):
    async with Client(server.target, token=CLIENT) as client:
        ids = await submit_dag(client, "idle", "roles")
    path = f"/v1/tasks/{ids['a']}/dependents"
    async with http_client(server) as anonymous:
        assert error_of(await anonymous.get(path))[0] == 401
    for token in (WORKER, METRICS):
        async with http_client(server, token) as http:
            assert error_of(await http.get(path))[0] == 403
    async with http_client(server, SCOPED) as http:   # a task of a pool it may not use does not exist for it
        assert error_of(await http.get(path))[:2] == (404, "not_found")
    async with grpc.aio.insecure_channel(server.target) as channel:
        tasks = pb_grpc.TasksStub(channel)
        request = pb.DependentsRequest(task=pb.TaskRef(key="roles-a"), depth=2)
        answer = await tasks.Dependents(request, metadata=(("authorization", f"Bearer {CLIENT}"),))
        assert [d.id for d in answer.dependents] == [ids["b"], ids["c"], ids["d"]]
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await tasks.Dependents(request, metadata=(("authorization", f"Bearer {WORKER}"),))
        assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED


def test_the_blocking_client(server):
    with BlockingClient(server.target, token=CLIENT) as client:
        a = client.submit(pool="idle", key="blocking-a")
        b = client.submit(pool="idle", after=a.id)
        found = client.dependents("blocking-a")
        assert [(d.id, d.depends_on, d.deps) for d in found.dependents] == [(b.id, [a.id], [(a.id, "success")])]


def test_the_command_line(server):
    with BlockingClient(server.target, token=CLIENT) as client:
        a = client.submit(pool="idle", key="cli-a")
        b = client.submit(pool="idle", key="cli-b", after="cli-a")
        c = client.submit(pool="idle", after="cli-b")
    shown = run_cronoq("dependents", "--key", "cli-a", "--depth", "2", token=CLIENT, server=server.target)
    assert shown.returncode == 0, err(shown)
    rows = [line.split() for line in shown.stdout.decode().splitlines()]
    assert rows == [["ID", "STATUS", "POOL", "KEY", "DEPTH", "DEPENDS", "ON"],
                    [str(b.id), "blocked", "idle", "cli-b", "1", str(a.id)],
                    [str(c.id), "blocked", "idle", "-", "2", str(b.id)]]
    document = run_cronoq("dependents", str(a.id), "-o", "json", token=CLIENT, server=server.target)
    found = json.loads(document.stdout)
    assert [(d["id"], d["depends_on"]) for d in found["dependents"]] == [(str(b.id), [str(a.id)])]
    none = run_cronoq("dependents", str(c.id), token=CLIENT, server=server.target)
    assert none.returncode == 0 and "no task depends on" in err(none)
    unknown = run_cronoq("dependents", "999999999999", token=CLIENT, server=server.target)
    assert unknown.returncode == 3


@pytest.mark.asyncio
async def test_with_shards_the_tasks_own_shard_answers(servers, tmp_path):
    """A dependency never crosses shards, so the task's shard answers: by id
    forwarded there, by key located by asking every shard (far, never
    reachable, is named unavailable)."""
    from test_server_shards import call, config, free_port, http_call, spec

    ports = {"a": free_port(), "b": free_port()}
    a = servers(config(tmp_path, ports, "a"), args=("--shard", "a"), name="a")
    servers(config(tmp_path, ports, "b"), args=("--shard", "b"), name="b")
    parent = await call(a.target, "Submit", pb.SubmitRequest(task=spec("gpu", key="sharded-parent")))
    child = await call(a.target, "Submit", pb.SubmitRequest(task=spec("gpu", after=[pb.TaskRef(key="sharded-parent")])))
    assert parent.id >> 56 == 2   # shard b's, asked of shard a's server
    by_id = await call(a.target, "Dependents", pb.DependentsRequest(task=pb.TaskRef(id=parent.id)))
    assert [d.id for d in by_id.dependents] == [child.id] and list(by_id.unavailable_shards) == []
    by_key = await call(a.target, "Dependents", pb.DependentsRequest(task=pb.TaskRef(key="sharded-parent")))
    assert [d.id for d in by_key.dependents] == [child.id] and list(by_key.unavailable_shards) == ["far"]
    status, _, body = http_call(a, "GET", "/v1/tasks/by-key/sharded-parent/dependents")
    assert status == 200 and [d["id"] for d in body["dependents"]] == [str(child.id)]
    assert body["unavailable_shards"] == ["far"]


def test_the_info_caches_reverse_index_follows_what_it_remembers():
    from cronoq.server.info import InfoCache, TaskMeta

    cache = InfoCache(limit=3)

    def put(task_id: int, **options) -> None:
        cache.put(task_id, TaskMeta(cronoq.Task(**options), "default", 3, 0))

    put(1, key="p")
    put(2, after="p")
    put(3, deps=[cronoq.Dep(1, on="failure")])
    assert cache.dependents_of(1, "p") == [(2, "success"), (3, "failure")]
    assert cache.dependents_of(1, None) == [(3, "failure")]   # by id only: 2 named the key
    put(4, after=[1, "p"])   # the cache holds 3: task 1 is forgotten, its dependents are not
    assert cache.dependents_of(1, "p") == [(2, "success"), (3, "failure"), (4, "success")]
    put(5)   # 2 is forgotten: it no longer counts
    assert cache.dependents_of(1, "p") == [(3, "failure"), (4, "success")]
    assert 2 not in {child for ids in cache.dependents.values() for child in ids}
    cache.clear()
    assert cache.dependents_of(1, "p") == [] and cache.dependents == {}
