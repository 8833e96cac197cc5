"""Shards with real server processes on loopback (docs/server.md, "Sharding").

Two shards run, each its own server and SQLite file: ``a`` (number 1, pool
``default``) and ``b`` (number 2, pools ``gpu`` and ``gpu2``); a third, ``far``,
is configured with a plain-http endpoint on another host (TEST-NET, never
contacted), so calls for its pool are refused rather than forwarded.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import shutil
import socket

import grpc
import pytest

from cronoq._proto import cronoq_pb2 as pb
from serverkit import ADMIN, AUTH, CLIENT, METRICS, WORKER, RawWorker, bearer, shards_toml, stubs

pytestmark = pytest.mark.asyncio

SCOPED = "scoped-token-0123456789abcdef0123"     # pool default only
ONLY_A = "only-a-token-0123456789abcdef0123"     # known to shard a's server alone


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(directory, ports: dict[str, int], shard: str, *, extra_tokens: str = "") -> str:
    return f"""
[server]
grpc_addr = "127.0.0.1:{ports[shard]}"
http_addr = "127.0.0.1:0"
shutdown_grace_s = 2
standby_close_s = 0.5
{AUTH}
[[auth.tokens]]
token = "{SCOPED}"
role = "client"
pools = ["default"]
{extra_tokens}
[store]
kind = "sqlite"
path = "{directory}/shard-{{shard}}.db"
full_sync = false

[[pools]]
name = "default"
[[pools]]
name = "gpu"
[[pools]]
name = "gpu2"
[[pools]]
name = "far"

[[resources]]
name = "api_a"
kind = "semaphore"
permits = 2
shard = "a"

[[shards]]
name = "a"
number = 1
pools = ["default"]
endpoint = "http://127.0.0.1:{ports['a']}"
[[shards]]
name = "b"
number = 2
pools = ["gpu", "gpu2"]
endpoint = "http://127.0.0.1:{ports['b']}"
[[shards]]
name = "far"
number = 3
pools = ["far"]
endpoint = "http://192.0.2.1:7070"
"""


ONLY_A_TOKEN = f"""
[[auth.tokens]]
token = "{ONLY_A}"
role = "client"
"""


@pytest.fixture(scope="module")
def shards(module_servers, tmp_path_factory):
    directory = tmp_path_factory.mktemp("shards")
    ports = {"a": free_port(), "b": free_port()}
    a = module_servers(config(directory, ports, "a", extra_tokens=ONLY_A_TOKEN), args=("--shard", "a"), name="a")
    b = module_servers(config(directory, ports, "b"), args=("--shard", "b"), name="b")
    return a, b


def shard_number(task_id: int) -> int:
    return task_id >> 56


async def call(target: str, method: str, request, token: str = CLIENT, *, admin: bool = False):
    channel, tasks, admin_stub = stubs(target)
    try:
        stub = admin_stub if admin else tasks
        return await getattr(stub, method)(request, metadata=bearer(token), timeout=30)
    finally:
        await channel.close()


async def refused(target: str, method: str, request, token: str = CLIENT, *, admin: bool = False):
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call(target, method, request, token, admin=admin)
    return caught.value


def spec(pool: str = "", key: str = "", **fields) -> pb.TaskSpec:
    return pb.TaskSpec(pool=pool, key=key, payload=b"{}", content_type="application/json", **fields)


def http_call(server, method: str, path: str, body=None, token: str = CLIENT):
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        headers = {"authorization": f"Bearer {token}"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["content-type"] = "application/json"
        connection.request(method, path, body=data, headers=headers)
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), json.loads(response.read() or b"null")
    finally:
        connection.close()


async def test_ids_carry_the_shard_number_and_any_server_answers_for_every_shard(shards):
    a, b = shards
    here = await call(a.target, "Submit", pb.SubmitRequest(task=spec("default")))
    there = await call(a.target, "Submit", pb.SubmitRequest(task=spec("gpu")))   # forwarded to b
    assert (shard_number(here.id), shard_number(there.id)) == (1, 2)
    for server in (a, b):
        assert (await call(server.target, "Get", pb.GetRequest(task=pb.TaskRef(id=there.id)))).pool == "gpu"
        assert (await call(server.target, "Get", pb.GetRequest(task=pb.TaskRef(id=here.id)))).pool == "default"
    # b's log shows the submission arrived there, from a.
    listing = await call(b.target, "ListTasks", pb.ListTasksRequest(limit=1000))
    ids = [t.id for t in listing.tasks]
    assert here.id in ids and there.id in ids and ids == sorted(ids)
    # far is refused for listings (plain http to another host), so it is named missing.
    assert list(listing.unavailable_shards) == ["far"]
    cancelled = await call(a.target, "Cancel", pb.CancelRequest(task=pb.TaskRef(id=there.id)))
    assert cancelled.cancelled
    result = await call(a.target, "Wait", pb.WaitRequest(task=pb.TaskRef(id=there.id), timeout_s=10))
    assert result.status == pb.TASK_STATUS_CANCELLED


async def test_listings_page_across_shards_in_id_order(shards):
    a, _ = shards
    for pool in ("default", "gpu", "default", "gpu2", "gpu"):
        await call(a.target, "Submit", pb.SubmitRequest(task=spec(pool)))
    seen: list[int] = []
    after = 0
    while True:
        page = await call(a.target, "ListTasks", pb.ListTasksRequest(after=after, limit=2))
        seen += [t.id for t in page.tasks]
        if not page.next_after:
            break
        after = page.next_after
    whole = await call(a.target, "ListTasks", pb.ListTasksRequest(limit=1000))
    assert seen == [t.id for t in whole.tasks] == sorted(seen)
    assert {shard_number(i) for i in seen} == {1, 2}
    only_gpu = await call(a.target, "ListTasks", pb.ListTasksRequest(pools=["gpu"], limit=1000))
    assert only_gpu.tasks and {t.pool for t in only_gpu.tasks} == {"gpu"}


async def test_keys_are_per_shard_and_a_key_in_two_shards_is_refused(shards):
    a, b = shards
    one = await call(a.target, "Submit", pb.SubmitRequest(task=spec("gpu", key="only-in-b")))
    for server in (a, b):
        found = await call(server.target, "Get", pb.GetRequest(task=pb.TaskRef(key="only-in-b")))
        assert found.id == one.id
    await call(a.target, "Submit", pb.SubmitRequest(task=spec("default", key="twice")))
    await call(b.target, "Submit", pb.SubmitRequest(task=spec("gpu", key="twice")))   # no duplicate: other shard
    error = await refused(b.target, "Get", pb.GetRequest(task=pb.TaskRef(key="twice")))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION and "use the task id" in error.details()
    error = await refused(a.target, "Cancel", pb.CancelRequest(task=pb.TaskRef(key="twice")))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_what_cannot_span_shards_is_refused_naming_the_rule(shards):
    a, _ = shards
    mine = await call(a.target, "Submit", pb.SubmitRequest(task=spec("default")))
    error = await refused(a.target, "SubmitBatch", pb.SubmitBatchRequest(tasks=[spec("default"), spec("gpu")]))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "one shard" in error.details()
    error = await refused(a.target, "Submit", pb.SubmitRequest(task=spec("gpu", resources={"api_a": 1})))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "api_a" in error.details()
    error = await refused(a.target, "Submit", pb.SubmitRequest(task=spec("gpu", after=[pb.TaskRef(id=mine.id)])))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "own shard" in error.details()
    batch = await call(a.target, "SubmitBatch", pb.SubmitBatchRequest(tasks=[spec("gpu"), spec("gpu2")]))
    assert [shard_number(t.id) for t in batch.tasks] == [2, 2]


async def test_a_batch_for_the_shards_own_pools_is_refused_what_routing_refuses(shards):
    a, b = shards
    theirs = await call(a.target, "Submit", pb.SubmitRequest(task=spec("default")))
    ours = await call(b.target, "Submit", pb.SubmitRequest(task=spec("gpu")))
    error = await refused(b.target, "SubmitBatch", pb.SubmitBatchRequest(
        tasks=[spec("gpu"), spec("gpu2", after=[pb.TaskRef(id=theirs.id)])]))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "own shard" in error.details()
    error = await refused(b.target, "SubmitBatch", pb.SubmitBatchRequest(
        tasks=[spec("gpu"), spec("gpu2", deps=[pb.Dep(ref=pb.TaskRef(id=theirs.id))])]))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "own shard" in error.details()
    error = await refused(b.target, "SubmitBatch", pb.SubmitBatchRequest(
        tasks=[spec("gpu"), spec("gpu", resources={"api_a": 1})]))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "belongs to shard 'a'" in error.details()
    # Routing's refusal comes first, as for a batch of other shards' pools: not task 0's bad content type.
    bad = pb.TaskSpec(pool="gpu", payload=b"{}", content_type="\x01")
    error = await refused(b.target, "SubmitBatch", pb.SubmitBatchRequest(
        tasks=[bad, spec("gpu2", after=[pb.TaskRef(id=theirs.id)])]))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "own shard" in error.details()
    error = await refused(b.target, "SubmitBatch", pb.SubmitBatchRequest(tasks=[bad, spec("gpu")]))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "task 0 of the batch" in error.details()
    # Nothing of a refused batch was admitted; this shard's own dependencies pass.
    listed = await call(b.target, "ListTasks", pb.ListTasksRequest(pools=["gpu", "gpu2"], after=ours.id))
    assert list(listed.tasks) == []
    batch = await call(b.target, "SubmitBatch", pb.SubmitBatchRequest(
        tasks=[spec("gpu", after=[pb.TaskRef(id=ours.id)]), spec("gpu2", key="b-own")]))
    assert [shard_number(t.id) for t in batch.tasks] == [2, 2]
    # No pool: the home pool, shard a's, so the batch goes there.
    home = await call(b.target, "SubmitBatch", pb.SubmitBatchRequest(tasks=[spec(""), spec("default")]))
    assert [shard_number(t.id) for t in home.tasks] == [1, 1]


async def test_tokens_are_checked_again_on_the_receiving_shard(shards):
    a, b = shards
    # A token scoped to pool default cannot reach gpu through shard a...
    error = await refused(a.target, "Submit", pb.SubmitRequest(task=spec("gpu")), SCOPED)
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    # ...and a token only shard a knows is refused by b when a forwards it.
    assert shard_number((await call(a.target, "Submit", pb.SubmitRequest(task=spec("default")), ONLY_A)).id) == 1
    error = await refused(a.target, "Submit", pb.SubmitRequest(task=spec("gpu")), ONLY_A)
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    # A call already forwarded is not forwarded again.
    channel, tasks, _ = stubs(b.target)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await tasks.Submit(pb.SubmitRequest(task=spec("default")),
                               metadata=bearer(CLIENT) + (("cronoq-forwarded", "a"),), timeout=30)
    finally:
        await channel.close()
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert dict(caught.value.trailing_metadata())["cronoq-shard"] == "a"


async def test_plain_http_to_another_host_is_refused_with_the_endpoint(shards):
    a, _ = shards
    error = await refused(a.target, "Submit", pb.SubmitRequest(task=spec("far")))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    trailing = dict(error.trailing_metadata())
    assert (trailing["cronoq-shard"], trailing["cronoq-shard-endpoint"]) == ("far", "http://192.0.2.1:7070")
    assert "insecure_peer_http" in error.details()
    status, headers, body = http_call(a, "POST", "/v1/tasks", {"pool": "far", "payload": {}})
    assert status == 409 and headers["cronoq-shard-endpoint"] == "http://192.0.2.1:7070", body


async def test_http_calls_are_forwarded_too(shards):
    a, b = shards
    status, _, body = http_call(a, "POST", "/v1/tasks", {"pool": "gpu", "payload": {"x": 1}})
    assert status == 200, body
    task_id = int(body["id"])
    assert shard_number(task_id) == 2
    status, _, info = http_call(b, "GET", f"/v1/tasks/{task_id}")
    assert status == 200 and info["pool"] == "gpu"
    status, _, listing = http_call(b, "GET", "/v1/tasks?limit=1000")
    assert status == 200 and str(task_id) in [t["id"] for t in listing["tasks"]]
    status, _, snap = http_call(a, "GET", "/v1/snapshot", token=METRICS)
    assert status == 200 and {p["name"] for p in snap["pools"]} == {"default", "gpu", "gpu2"}
    assert snap["unavailable_shards"] == ["far"]


async def test_a_worker_of_another_shards_pool_is_redirected(shards):
    a, b = shards
    worker = RawWorker(a.target, WORKER)
    try:
        await worker.send(register=pb.Register(pool="gpu", slots=1, worker_name="w", protocol_version=3))
        _, code, details = await worker.finish()
        trailing = dict(await worker.call.trailing_metadata())
    finally:
        await worker.close()
    assert code == grpc.StatusCode.FAILED_PRECONDITION, details
    assert trailing["cronoq-shard-endpoint"] == f"http://127.0.0.1:{b.grpc_port}"
    assert trailing["cronoq-shard"] == "b"


async def test_workers_and_snapshots_cover_every_shard(shards):
    a, b = shards
    worker = RawWorker(b.target, WORKER)
    try:
        await worker.register("gpu")
        listed = await call(a.target, "ListWorkers", pb.ListWorkersRequest(), METRICS, admin=True)
        assert [w.pool for w in listed.workers] == ["gpu"]
        snap = await call(a.target, "Snapshot", pb.SnapshotRequest(), METRICS, admin=True)
        assert [p.name for p in snap.pools] == ["default", "gpu", "gpu2"]
        assert snap.workers_connected == 1 and list(snap.unavailable_shards) == ["far"]
    finally:
        await worker.close()


async def test_watch_merges_every_shards_events_and_names_the_shards_it_leaves_out(shards):
    a, b = shards
    channel, tasks, _ = stubs(a.target)
    try:
        watch = tasks.Watch(pb.WatchRequest(), metadata=bearer(CLIENT))
        # The headers come before any event: the far shard cannot be asked (plain http to another host).
        assert dict(await asyncio.wait_for(watch.initial_metadata(), 30))["cronoq-unavailable-shards"] == "far"
        here = await call(b.target, "Submit", pb.SubmitRequest(task=spec("default", key="watched-a")))
        there = await call(a.target, "Submit", pb.SubmitRequest(task=spec("gpu", key="watched-b")))
        seen: set[int] = set()
        while seen != {here.id, there.id}:
            event = await asyncio.wait_for(watch.read(), 30)
            if event.id in (here.id, there.id):
                seen.add(event.id)
        watch.cancel()
        # A Watch of one shard's pools asks that shard alone: nothing is left out.
        only_b = tasks.Watch(pb.WatchRequest(pools=["gpu"]), metadata=bearer(CLIENT))
        assert "cronoq-unavailable-shards" not in dict(await asyncio.wait_for(only_b.initial_metadata(), 30))
        only_b.cancel()
        # The far shard's pools alone: no shard that serves them can be asked.
        only_far = tasks.Watch(pb.WatchRequest(pools=["far"]), metadata=bearer(CLIENT))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await asyncio.wait_for(only_far.read(), 30)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE and "far" in caught.value.details()
        # The receiving shard checks the token again: pool-scoped to default, it may not watch gpu there.
        scoped = tasks.Watch(pb.WatchRequest(pools=["gpu"]), metadata=bearer(SCOPED))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await asyncio.wait_for(scoped.read(), 30)
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        await channel.close()


async def test_the_cli_shows_every_shard_and_names_the_one_it_could_not_ask(shards):
    from clikit import Terminal, cli_env, cronoq, err, script, text

    a, b = shards
    there = await call(b.target, "Submit", pb.SubmitRequest(task=spec("gpu", key="cli-in-b")))
    note = "shard far could not be asked"
    listed = cronoq("tasks", "--all", token=ADMIN, server=a.target)
    assert listed.returncode == 0 and str(there.id) in text(listed), err(listed)
    assert f"{note}: their tasks are not listed" in err(listed) and note not in text(listed)
    as_json = cronoq("tasks", "--all", "-o", "json", token=ADMIN, server=a.target)
    assert json.loads(text(as_json))["unavailable_shards"] == ["far"]
    for command, left_out in (("workers", "their workers"), ("schedules", "their schedules"),
                              ("snapshot", "their pools")):
        shown = cronoq(command, token=ADMIN, server=a.target)
        assert shown.returncode == 0 and f"{note}: {left_out}" in err(shown), (command, err(shown))
    snapshot = json.loads(text(cronoq("snapshot", "-o", "json", token=ADMIN, server=a.target)))
    assert snapshot["unavailable_shards"] == ["far"] and "gpu" in {p["name"] for p in snapshot["pools"]}
    # A key is looked up in every shard: found in b through a, the far shard named as not asked.
    found = cronoq("get", "--key", "cli-in-b", token=ADMIN, server=a.target)
    assert found.returncode == 0 and str(there.id) in text(found), err(found)
    assert f"{note}: the answer comes from the shards that could" in err(found)
    found = json.loads(text(cronoq("get", "--key", "cli-in-b", "-o", "json", token=ADMIN, server=a.target)))
    assert found["id"] == str(there.id) and found["unavailable_shards"] == ["far"]
    # By id, only b is asked: nothing to say.
    by_id = cronoq("get", str(there.id), token=ADMIN, server=a.target)
    assert by_id.returncode == 0 and "could not be asked" not in err(by_id)
    term = Terminal([script(), "top", "--interval", "0.3"], cli_env(ADMIN, a.target), columns=150, lines=40)
    try:
        screen = term.wait_for(lambda s: "\ngpu " in s and "\ndefault " in s)
        assert "unavailable: shard far" in screen.splitlines()[0]
    finally:
        term.close()


async def test_the_http_event_stream_covers_every_shard_and_names_the_missing_ones(shards):
    import httpx

    a, b = shards
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{a.http_port}", timeout=30,
                                 headers={"authorization": f"Bearer {CLIENT}"}) as http:
        async with http.stream("GET", "/v1/events?snapshot_s=0") as stream:
            assert stream.status_code == 200
            lines = stream.aiter_lines()
            events: list[tuple[str, object]] = []

            async def until(found) -> None:
                kind = "message"
                async for line in lines:
                    if line.startswith("event:"):
                        kind = line[6:].strip()
                    elif line.startswith("data:"):
                        events.append((kind, json.loads(line[5:])))
                        if found():
                            return

            await asyncio.wait_for(until(lambda: any(kind == "shards" for kind, _ in events)), 30)
            assert ("shards", {"unavailable_shards": ["far"]}) in events
            hello = next(data for kind, data in events if kind == "hello")
            assert {"default", "gpu", "gpu2", "far"} <= set(hello["pools"])   # every shard's pools
            there = await call(a.target, "Submit", pb.SubmitRequest(task=spec("gpu", key="sse-in-b")))

            def seen() -> bool:
                return any(kind == "status" and any(e["id"] == str(there.id) for e in data)
                           for kind, data in events)

            await asyncio.wait_for(until(seen), 30)


async def test_the_python_client_and_the_mcp_server_name_the_shards_they_could_not_ask(shards):
    from cronoq.client import Client
    from mcpkit import resource_json, stdio_session, structured

    a, b = shards
    there = await call(a.target, "Submit", pb.SubmitRequest(task=spec("gpu", key="client-in-b")))
    async with Client(a.target, token=ADMIN) as client:
        page = await client.list(limit=1000)
        assert page.unavailable_shards == ("far",) and there.id in {t.id for t in page.tasks}
        by_key = await client.get("client-in-b")
        assert by_key.id == there.id and by_key.unavailable_shards == ("far",)
        assert (await client.get(there.id)).unavailable_shards == ()   # by id: b alone is asked
        assert (await client.explain("client-in-b")).unavailable_shards == ("far",)
        workers, schedules = await client.workers(), await client.recurring()
        assert workers.unavailable_shards == ("far",) and schedules.unavailable_shards == ("far",)
        assert (await client.snapshot())["unavailable_shards"] == ["far"]
    async with stdio_session(a.target, ADMIN) as session:
        listed = structured(await session.call_tool("list_tasks", {"limit": 100}))
        assert listed["unavailable_shards"] == ["far"]
        found = structured(await session.call_tool("get_task", {"task": "client-in-b"}))
        assert found["id"] == there.id and found["unavailable_shards"] == ["far"]
        explained = structured(await session.call_tool("explain_task", {"task": "client-in-b"}))
        assert explained["unavailable_shards"] == ["far"]
        for tool in ("snapshot", "list_workers", "list_schedules"):
            assert structured(await session.call_tool(tool, {}))["unavailable_shards"] == ["far"], tool
        snapshot = resource_json(await session.read_resource("cronoq://snapshot"))
        assert snapshot["unavailable_shards"] == ["far"] and "gpu" in {p["name"] for p in snapshot["pools"]}


async def test_a_store_of_another_shard_is_refused(servers, tmp_path):
    ports = {"a": free_port(), "b": free_port()}
    a = servers(config(tmp_path, ports, "a"), args=("--shard", "a"), name="a")
    await call(a.target, "Submit", pb.SubmitRequest(task=spec("default")))
    assert a.stop() == 0
    shutil.copy(tmp_path / "shard-a.db", tmp_path / "shard-b.db")
    with pytest.raises(AssertionError, match=r"holds tasks of shard number 1, not of this server's shard"):
        servers(config(tmp_path, ports, "b"), args=("--shard", "b"), name="b", timeout=10)   # it never leads


# ---------------------------------------------------------------- three shards (PostgreSQL, SQLite), with a standby


def ready(server) -> bool:
    try:
        connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=1)
        try:
            connection.request("GET", "/readyz")
            return connection.getresponse().status == 200
        finally:
            connection.close()
    except OSError:
        return False


class LeaderProxy:
    """A shard's endpoint in front of its servers, as a load balancer routing
    to the ready one (the leader): each new connection goes to whichever
    server answers /readyz with 200; with none, the connection is closed."""

    def __init__(self) -> None:
        self.backends: list = []
        self.port = 0
        self._server: asyncio.base_events.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        backend = None
        for server in self.backends:
            if server.process.poll() is None and await asyncio.to_thread(ready, server):
                backend = server
                break
        if backend is None:
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", backend.grpc_port)

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except OSError:
                pass
            finally:
                sink.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()


def three_shards(ports: dict[str, int]) -> str:
    """Three shards, a pool each (a: default, b: gpu, c: batch), behind the given loopback ports."""
    return shards_toml({name: ([pool], f"http://127.0.0.1:{ports[name]}")
                        for name, pool in (("a", "default"), ("b", "gpu"), ("c", "batch"))})


def server_section(grpc_port: int) -> str:
    return f"""
[server]
grpc_addr = "127.0.0.1:{grpc_port}"
http_addr = "127.0.0.1:0"
shutdown_grace_s = 2
standby_close_s = 0.5
{AUTH}
"""


def pg_config(schema: str, ports: dict[str, int], grpc_port: int) -> str:
    return server_section(grpc_port) + f"""[store]
kind = "postgres"
url_env = "CRONOQ_TEST_DATABASE_URL"
schema = "{schema}_{{shard}}"
lock_poll_s = 0.1
""" + three_shards(ports)


async def test_three_postgres_shards_survive_a_shard_outage_and_its_standby_takes_over(servers, pg_server):
    import signal
    import uuid

    schema = f"sh{uuid.uuid4().hex[:8]}"
    env = {"CRONOQ_TEST_DATABASE_URL": pg_server.url}
    proxy = LeaderProxy()
    await proxy.start()
    ports = {"a": free_port(), "b": proxy.port, "c": free_port()}
    try:
        a = servers(pg_config(schema, ports, ports["a"]), args=("--shard", "a"), name="a", env=env)
        c = servers(pg_config(schema, ports, ports["c"]), args=("--shard", "c"), name="c", env=env)
        b1 = servers(pg_config(schema, ports, 0), args=("--shard", "b"), name="b1", env=env)
        b2 = servers(pg_config(schema, ports, 0), args=("--shard", "b"), name="b2", env=env,
                     wait_for="standing by")
        proxy.backends = [b1, b2]
        ids = {}
        for pool in ("default", "gpu", "batch"):
            ids[pool] = (await call(c.target, "Submit", pb.SubmitRequest(task=spec(pool, key=f"k-{pool}")))).id
        assert {pool: shard_number(i) for pool, i in ids.items()} == {"default": 1, "gpu": 2, "batch": 3}
        listing = await call(a.target, "ListTasks", pb.ListTasksRequest(limit=1000))
        assert [t.id for t in listing.tasks] == sorted(ids.values()) and not listing.unavailable_shards

        # Shard b goes down (its leader killed, its standby paused): a and c keep serving and name it.
        b2.signal(signal.SIGSTOP)
        b1.kill()
        listing = await call(a.target, "ListTasks", pb.ListTasksRequest(limit=1000))
        assert list(listing.unavailable_shards) == ["b"]
        assert [t.id for t in listing.tasks] == sorted([ids["default"], ids["batch"]])
        found = await call(c.target, "Get", pb.GetRequest(task=pb.TaskRef(key="k-default")))
        assert found.id == ids["default"]
        error = await refused(a.target, "Get", pb.GetRequest(task=pb.TaskRef(id=ids["gpu"])))
        assert error.code() == grpc.StatusCode.UNAVAILABLE
        snap = await call(c.target, "Snapshot", pb.SnapshotRequest(), METRICS, admin=True)
        assert [p.name for p in snap.pools] == ["default", "batch"] and list(snap.unavailable_shards) == ["b"]

        # Its standby takes over, and every shard's tasks are there again, from any server.
        b2.signal(signal.SIGCONT)
        b2.wait_for("serving as the leader", timeout=60)
        for _ in range(50):   # (until a's channel to b reconnects through the endpoint)
            try:
                info = await call(a.target, "Get", pb.GetRequest(task=pb.TaskRef(id=ids["gpu"])))
                break
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.UNAVAILABLE
                await asyncio.sleep(0.2)
        else:
            raise AssertionError("shard b did not answer again through its endpoint")
        assert info.pool == "gpu"
        listing = await call(a.target, "ListTasks", pb.ListTasksRequest(limit=1000))
        assert [t.id for t in listing.tasks] == sorted(ids.values()) and not listing.unavailable_shards
        # Keys are per shard: the same key in shard c is refused when looked up.
        await call(a.target, "Submit", pb.SubmitRequest(task=spec("batch", key="k-gpu")))
        error = await refused(a.target, "Wait", pb.WaitRequest(task=pb.TaskRef(key="k-gpu"), timeout_s=1))
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    finally:
        await proxy.stop()


def sqlite_shards_config(directory, ports: dict[str, int], grpc_port: int) -> str:
    return server_section(grpc_port) + f"""[store]
kind = "sqlite"
path = "{directory}/three-{{shard}}.db"
full_sync = false
lease_ttl_s = 2
lease_renew_s = 0.3
lock_poll_s = 0.1
""" + three_shards(ports)


async def test_three_sqlite_shards_survive_a_shard_outage_and_its_standby_takes_over(servers, tmp_path):
    import signal

    proxy = LeaderProxy()
    await proxy.start()
    ports = {"a": free_port(), "b": proxy.port, "c": free_port()}
    try:
        a = servers(sqlite_shards_config(tmp_path, ports, ports["a"]), args=("--shard", "a"), name="a")
        c = servers(sqlite_shards_config(tmp_path, ports, ports["c"]), args=("--shard", "c"), name="c")
        # Shard b: a leader and a standby on the same SQLite file, behind its endpoint.
        b1 = servers(sqlite_shards_config(tmp_path, ports, 0), args=("--shard", "b"), name="b1")
        b2 = servers(sqlite_shards_config(tmp_path, ports, 0), args=("--shard", "b"), name="b2",
                     wait_for="standing by")
        proxy.backends = [b1, b2]
        ids = {}
        for pool in ("default", "gpu", "batch"):
            ids[pool] = (await call(a.target, "Submit", pb.SubmitRequest(task=spec(pool, key=f"k-{pool}")))).id
        assert {pool: shard_number(i) for pool, i in ids.items()} == {"default": 1, "gpu": 2, "batch": 3}

        # b's leader killed by pid, its standby paused: a and c keep serving and name b missing.
        b2.signal(signal.SIGSTOP)
        b1.kill()
        for server in (a, c):
            listing = await call(server.target, "ListTasks", pb.ListTasksRequest(limit=1000))
            assert list(listing.unavailable_shards) == ["b"]
            assert [t.id for t in listing.tasks] == sorted([ids["default"], ids["batch"]])
        later = await call(c.target, "Submit", pb.SubmitRequest(task=spec("default")))   # forwarded to a
        assert shard_number(later.id) == 1
        error = await refused(c.target, "Submit", pb.SubmitRequest(task=spec("gpu")))
        assert error.code() == grpc.StatusCode.UNAVAILABLE and "'b'" in error.details()
        snap = await call(a.target, "Snapshot", pb.SnapshotRequest(), METRICS, admin=True)
        assert [p.name for p in snap.pools] == ["default", "batch"] and list(snap.unavailable_shards) == ["b"]

        # The standby takes over the same file: b's task is there, from every shard's server.
        b2.signal(signal.SIGCONT)
        b2.wait_for("serving as the leader", timeout=60)
        for server in (a, c):
            for _ in range(50):   # (until this server's channel to b reconnects through its endpoint)
                try:
                    info = await call(server.target, "Get", pb.GetRequest(task=pb.TaskRef(id=ids["gpu"])))
                    break
                except grpc.aio.AioRpcError as exc:
                    assert exc.code() == grpc.StatusCode.UNAVAILABLE
                    await asyncio.sleep(0.2)
            else:
                raise AssertionError("shard b did not answer again through its endpoint")
            assert info.pool == "gpu" and info.key == "k-gpu"
        listing = await call(a.target, "ListTasks", pb.ListTasksRequest(limit=1000))
        assert [t.id for t in listing.tasks] == sorted([*ids.values(), later.id])
        assert not listing.unavailable_shards
        after = await call(a.target, "Submit", pb.SubmitRequest(task=spec("gpu")))
        assert shard_number(after.id) == 2 and after.id > ids["gpu"]
    finally:
        await proxy.stop()


async def test_the_python_worker_follows_its_pool_to_its_shard(shards):
    from cronoq.client import Worker

    a, b = shards
    ran = asyncio.Event()

    async def handle(lease):
        ran.set()
        return {"ok": True}

    worker = Worker(a.target, "gpu2", handle, token=WORKER, initial_backoff=0.05, max_backoff=0.2)
    running = asyncio.ensure_future(worker.run(handle_signals=False))
    try:
        submitted = await call(a.target, "Submit", pb.SubmitRequest(task=spec("gpu2")))
        result = await call(a.target, "Wait", pb.WaitRequest(task=pb.TaskRef(id=submitted.id), timeout_s=30))
        assert result.status == pb.TASK_STATUS_SUCCEEDED and ran.is_set()
        listed = await call(b.target, "ListWorkers", pb.ListWorkersRequest(pools=["gpu2"]), METRICS, admin=True)
        assert [w.pool for w in listed.workers] == ["gpu2"]   # registered with shard b
    finally:
        worker.stop()
        await asyncio.wait_for(running, 30)


async def test_the_worker_refuses_a_redirect_sending_its_token_over_http_to_another_host(shards):
    from cronoq import CronoqError
    from cronoq.client import Worker

    a, _ = shards

    async def handle(lease):
        return None

    worker = Worker(a.target, "far", handle, token=WORKER)
    with pytest.raises(CronoqError, match="insecure_redirect_http=True allows it"):
        await asyncio.wait_for(worker.run(handle_signals=False), 30)


# Last in the file: it kills shard b of the module's servers.
async def test_keda_asks_the_shard_of_the_pool(shards):
    from kedakit import KedaClient

    a, b = shards
    via_a, via_b = KedaClient(a.target), KedaClient(b.target)
    try:
        # Shard a's scheduler has no pool gpu: an answer through a is shard b's.
        for token in ({"token": METRICS}, {"token": ADMIN}):
            ref, on_b = via_a.ref("gpu", **token), via_b.ref("gpu", **token)
            # The pool's autoscaler may move desired between two reads: a's answer lies between b's two.
            before, through_a, after = await via_b.desired(on_b), await via_a.desired(ref), await via_b.desired(on_b)
            assert min(before, after) <= through_a <= max(before, after)
            # Active: desired, pending or busy above 0, as shard b itself says.
            assert await via_a.is_active(ref) == await via_b.is_active(on_b)
            (spec,) = (await via_a.metric_spec(ref)).metricSpecs
            assert spec.metricName == "cronoq-gpu-desired"
        stream = via_a.stream_is_active(via_a.ref("gpu", token=METRICS))
        first = await asyncio.wait_for(stream.read(), 30)
        assert first.result == await via_b.is_active(via_b.ref("gpu", token=METRICS))
        stream.cancel()
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await via_a.metrics(via_a.ref("gpu", token=CLIENT))   # the receiving shard checks the role too
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await via_a.metrics(via_a.ref("far", token=METRICS))   # plain http to another host: not forwarded
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert dict(caught.value.trailing_metadata())["cronoq-shard"] == "far"
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await via_b.metrics(via_b.ref("cpu", token=METRICS))
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        assert "default, gpu, gpu2, far" in caught.value.details()
    finally:
        await via_a.close()
        await via_b.close()


async def test_a_killed_shard_is_named_while_the_others_keep_serving(shards):
    a, b = shards
    kept = await call(a.target, "Submit", pb.SubmitRequest(task=spec("default", key="kept-in-a")))
    b.kill()
    listing = await call(a.target, "ListTasks", pb.ListTasksRequest(limit=1000))
    assert sorted(listing.unavailable_shards) == ["b", "far"]
    assert {shard_number(t.id) for t in listing.tasks} == {1}
    channel, tasks, _ = stubs(a.target)
    try:
        call_ = tasks.Get(pb.GetRequest(task=pb.TaskRef(key="kept-in-a")), metadata=bearer(CLIENT), timeout=30)
        info = await call_
        trailing = dict(await call_.trailing_metadata())
    finally:
        await channel.close()
    assert info.id == kept.id and set(trailing["cronoq-unavailable-shards"].split(",")) == {"b", "far"}
    status, _, body = http_call(a, "GET", "/v1/tasks/by-key/kept-in-a")
    assert status == 200 and body["id"] == str(kept.id) and sorted(body["unavailable_shards"]) == ["b", "far"]
    status, _, body = http_call(a, "GET", "/v1/tasks?limit=1000")
    assert status == 200 and sorted(body["unavailable_shards"]) == ["b", "far"]
    error = await refused(a.target, "Cancel", pb.CancelRequest(task=pb.TaskRef(key="kept-in-a")))
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    channel, tasks, _ = stubs(a.target)
    try:   # Watch still opens, names both missing shards, and carries this shard's events
        watch = tasks.Watch(pb.WatchRequest(), metadata=bearer(CLIENT))
        missing = dict(await asyncio.wait_for(watch.initial_metadata(), 30))["cronoq-unavailable-shards"]
        assert set(missing.split(",")) == {"b", "far"}
        later = await call(a.target, "Submit", pb.SubmitRequest(task=spec("default", key="after-b-died")))
        while (await asyncio.wait_for(watch.read(), 30)).id != later.id:
            pass
        watch.cancel()
    finally:
        await channel.close()
    error = await refused(a.target, "Submit", pb.SubmitRequest(task=spec("gpu")))
    assert error.code() == grpc.StatusCode.UNAVAILABLE and "'b'" in error.details()
    snap = await call(a.target, "Snapshot", pb.SnapshotRequest(), METRICS, admin=True)
    assert [p.name for p in snap.pools] == ["default"] and sorted(snap.unavailable_shards) == ["b", "far"]
