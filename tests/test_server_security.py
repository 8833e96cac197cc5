"""Roles, pool scope, tenant pinning, label allow-lists, the loopback-only rule
with authentication off, TLS and mTLS with certificates mapped to roles;
all against real server processes, over the network."""

from __future__ import annotations

import asyncio
import http.client
import ssl

import grpc
import pytest

from cronoq._proto import cronoq_pb2 as pb
from certkit import CA
from serverkit import ADMIN, AUTH, CLIENT, LISTEN, METRICS, WORKER, RawWorker, bearer, stubs

pytestmark = pytest.mark.asyncio

SCOPED_CLIENT = "scoped-client-token-0123456789abcd"
SCOPED_WORKER = "scoped-worker-token-0123456789abcd"
SCOPED_METRICS = "scoped-metrics-token-0123456789abc"
TENANT_CLIENT = "tenant-client-token-0123456789abcd"
LABEL_WORKER = "label-worker-token-0123456789abcde"

CONFIG = LISTEN + AUTH + f"""
[[auth.tokens]]
token = "{SCOPED_CLIENT}"
role = "client"
pools = ["a"]
[[auth.tokens]]
token = "{SCOPED_WORKER}"
role = "worker"
pools = ["a"]
[[auth.tokens]]
token = "{SCOPED_METRICS}"
role = "metrics"
pools = ["a"]
[[auth.tokens]]
token = "{TENANT_CLIENT}"
role = "client"
tenant = "acme"
pools = ["tenants"]
[[auth.tokens]]
token = "{LABEL_WORKER}"
role = "worker"
labels = ["gpu=a100"]

[[pools]]
name = "default"
[[pools]]
name = "a"
[[pools]]
name = "b"
[[pools]]
name = "tenants"
"""


@pytest.fixture(scope="module")
def server(module_servers):
    return module_servers(CONFIG, name="security")


async def code_of(call) -> grpc.StatusCode:
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def spec(pool: str, **fields) -> pb.SubmitRequest:
    return pb.SubmitRequest(task=pb.TaskSpec(pool=pool, payload=b"p", **fields))


async def test_every_call_needs_a_valid_token(server):
    channel, tasks, admin = stubs(server.target)
    assert await code_of(tasks.Submit(spec("default"))) == grpc.StatusCode.UNAUTHENTICATED
    assert await code_of(tasks.Submit(spec("default"), metadata=bearer("not-a-token-0123456789"))) \
        == grpc.StatusCode.UNAUTHENTICATED
    assert await code_of(tasks.Submit(spec("default"), metadata=(("authorization", f"Basic {CLIENT}"),))) \
        == grpc.StatusCode.UNAUTHENTICATED
    assert await code_of(admin.Snapshot(pb.SnapshotRequest())) == grpc.StatusCode.UNAUTHENTICATED
    worker = RawWorker(server.target)
    await worker.send(register=pb.Register(pool="default", slots=1, protocol_version=3))
    _, code, _ = await worker.finish()
    assert code == grpc.StatusCode.UNAUTHENTICATED
    await worker.close()
    # Tokens never reach the log, rejected or accepted.
    for token in (CLIENT, WORKER, METRICS, ADMIN, "not-a-token-0123456789"):
        assert token not in server.log
    await channel.close()


async def test_each_role_may_make_its_calls_and_only_those(server):
    channel, tasks, admin = stubs(server.target)
    calls = {
        "submit": lambda md: tasks.Submit(spec("default"), metadata=md),
        "list": lambda md: tasks.ListTasks(pb.ListTasksRequest(), metadata=md),
        "snapshot": lambda md: admin.Snapshot(pb.SnapshotRequest(), metadata=md),
        "workers": lambda md: admin.ListWorkers(pb.ListWorkersRequest(), metadata=md),
        "schedules": lambda md: admin.ListRecurring(pb.ListRecurringRequest(), metadata=md),
        "add schedule": lambda md: admin.AddRecurring(pb.AddRecurringRequest(
            name="r", cron="0 0 1 1 *", template=pb.TaskSpec()), metadata=md),
        "remove schedule": lambda md: admin.RemoveRecurring(pb.RemoveRecurringRequest(name="r"), metadata=md),
    }
    allowed = {
        CLIENT: {"submit", "list"},
        WORKER: set(),
        METRICS: {"snapshot", "workers", "schedules"},
        ADMIN: set(calls),
    }
    for token, may in allowed.items():
        for name, call in calls.items():
            expected = grpc.StatusCode.OK if name in may else grpc.StatusCode.PERMISSION_DENIED
            assert await code_of(call(bearer(token))) == expected, (token[:6], name)
    for token, may_work in ((WORKER, True), (ADMIN, True), (CLIENT, False), (METRICS, False)):
        worker = RawWorker(server.target, token)
        await worker.send(register=pb.Register(pool="default", slots=1, protocol_version=3))
        first = await worker.recv()
        if may_work:
            assert first.WhichOneof("msg") == "registered"
        else:
            assert first is None and (await worker.status())[0] == grpc.StatusCode.PERMISSION_DENIED, (await worker.status(), server.log[-3000:])
        await worker.close()
    await channel.close()


async def test_pool_scope_hides_other_pools_tasks_and_refuses_their_keys(server):
    channel, tasks, admin = stubs(server.target)
    full, scoped = bearer(CLIENT), bearer(SCOPED_CLIENT)
    other = await tasks.Submit(spec("b", key="b-key"), metadata=full)
    mine = await tasks.Submit(spec("a", key="a-key"), metadata=scoped)
    # Submitting into a pool outside the scope is refused; unknown pools are not found.
    assert await code_of(tasks.Submit(spec("b"), metadata=scoped)) == grpc.StatusCode.PERMISSION_DENIED
    assert await code_of(tasks.Submit(spec("zzz"), metadata=scoped)) == grpc.StatusCode.NOT_FOUND
    # Tasks of other pools look like tasks that do not exist: same code, same message.
    missing = 10 ** 12
    for ref in (pb.TaskRef(id=other.id), pb.TaskRef(key="b-key")):
        for call in (tasks.Get(pb.GetRequest(task=ref), metadata=scoped),
                     tasks.Wait(pb.WaitRequest(task=ref, timeout_s=0), metadata=scoped),
                     tasks.Cancel(pb.CancelRequest(task=ref), metadata=scoped)):
            with pytest.raises(grpc.aio.AioRpcError) as hidden:
                await call
            assert hidden.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as absent:
        await tasks.Get(pb.GetRequest(task=pb.TaskRef(id=missing)), metadata=scoped)
    with pytest.raises(grpc.aio.AioRpcError) as hidden:
        await tasks.Get(pb.GetRequest(task=pb.TaskRef(id=other.id)), metadata=scoped)
    assert hidden.value.details() == absent.value.details().replace(str(missing), str(other.id))
    # The task was not cancelled by the attempt above.
    assert (await tasks.Get(pb.GetRequest(task=pb.TaskRef(id=other.id)), metadata=full)).status \
        == pb.TASK_STATUS_READY
    # A key held in another pool is a conflict, a dependency on its task an unknown dependency.
    with pytest.raises(grpc.aio.AioRpcError) as conflict:
        await tasks.Submit(spec("a", key="b-key"), metadata=scoped)
    assert conflict.value.code() == grpc.StatusCode.ALREADY_EXISTS
    with pytest.raises(grpc.aio.AioRpcError) as dependency:
        await tasks.Submit(spec("a", after=[pb.TaskRef(id=other.id)]), metadata=scoped)
    assert dependency.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert dict(dependency.value.trailing_metadata())["cronoq-error"] == "UnknownDependency"
    # Listings cover the visible pools only; naming another is refused.
    listed = await tasks.ListTasks(pb.ListTasksRequest(), metadata=scoped)
    assert {t.pool for t in listed.tasks} == {"a"} and mine.id in {t.id for t in listed.tasks}
    assert await code_of(tasks.ListTasks(pb.ListTasksRequest(pools=["b"]), metadata=scoped)) \
        == grpc.StatusCode.PERMISSION_DENIED
    assert await code_of(tasks.ListTasks(pb.ListTasksRequest(pools=["zzz"]), metadata=scoped)) \
        == grpc.StatusCode.NOT_FOUND
    # Watch streams only the visible pools.
    watch = tasks.Watch(pb.WatchRequest(), metadata=scoped)
    await asyncio.sleep(0.2)
    await tasks.Submit(spec("b"), metadata=full)
    seen_a = await tasks.Submit(spec("a"), metadata=scoped)
    event = await asyncio.wait_for(watch.read(), 30)
    assert (event.id, event.pool) == (seen_a.id, "a")
    watch.cancel()
    assert await code_of(tasks.Watch(pb.WatchRequest(pools=["b"]), metadata=scoped).read()) \
        == grpc.StatusCode.PERMISSION_DENIED
    await channel.close()


async def test_scoped_workers_and_metrics_see_their_pools_only(server):
    channel, tasks, admin = stubs(server.target)
    refused = RawWorker(server.target, SCOPED_WORKER)
    await refused.send(register=pb.Register(pool="b", slots=1, protocol_version=3))
    _, code, _ = await refused.finish()
    assert code == grpc.StatusCode.PERMISSION_DENIED
    in_a = RawWorker(server.target, SCOPED_WORKER)
    await in_a.register("a", name="scoped-a")
    in_b = RawWorker(server.target, WORKER)
    await in_b.register("b", name="full-b")
    listed = await admin.ListWorkers(pb.ListWorkersRequest(), metadata=bearer(SCOPED_METRICS))
    assert [w.name for w in listed.workers] == ["scoped-a"]
    everything = await admin.ListWorkers(pb.ListWorkersRequest(), metadata=bearer(METRICS))
    assert {"scoped-a", "full-b"} <= {w.name for w in everything.workers}
    snapshot = await admin.Snapshot(pb.SnapshotRequest(), metadata=bearer(SCOPED_METRICS))
    assert [p.name for p in snapshot.pools] == ["a"]
    for w in (refused, in_a, in_b):
        await w.close()
    await channel.close()


async def test_tenant_pinning(server):
    channel, tasks, _ = stubs(server.target)
    pinned = bearer(TENANT_CLIENT)
    submitted = await tasks.Submit(spec("tenants"), metadata=pinned)
    assert (await tasks.Get(pb.GetRequest(task=pb.TaskRef(id=submitted.id)), metadata=pinned)).tenant == "acme"
    same = await tasks.Submit(spec("tenants", tenant="acme"), metadata=pinned)
    assert same.id > submitted.id
    with pytest.raises(grpc.aio.AioRpcError) as other:
        await tasks.Submit(spec("tenants", tenant="globex"), metadata=pinned)
    assert other.value.code() == grpc.StatusCode.PERMISSION_DENIED and "acme" in other.value.details()
    worker = RawWorker(server.target, WORKER)
    await worker.register("tenants", slots=2)
    leases = [await worker.recv_kind("lease") for _ in range(2)]
    assert {lease.tenant for lease in leases} == {"acme"}
    await worker.close()
    await channel.close()


async def test_label_allow_lists_limit_what_a_worker_may_claim(server):
    bad = RawWorker(server.target, LABEL_WORKER)
    await bad.send(register=pb.Register(pool="default", slots=1, protocol_version=3, labels={"gpu": "h100"}))
    _, code, details = await bad.finish()
    assert code == grpc.StatusCode.PERMISSION_DENIED and "gpu=h100" in details
    good = RawWorker(server.target, LABEL_WORKER)
    await good.register("default", labels={"gpu": "a100"})
    for w in (bad, good):
        await w.close()


# ---------------------------------------------------------------- authentication off


def http_get(port: int, path: str, host: str | None = None, context: ssl.SSLContext | None = None):
    connection = (http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=30) if context
                  else http.client.HTTPConnection("127.0.0.1", port, timeout=30))
    try:
        connection.putrequest("GET", path, skip_host=host is not None)
        if host is not None:
            connection.putheader("Host", host)
        connection.endheaders()
        response = connection.getresponse()
        return response.status, response.read().decode().strip()
    finally:
        connection.close()


async def test_without_credentials_http_answers_loopback_host_names_only(servers):
    server = servers(LISTEN)
    assert http_get(server.http_port, "/healthz") == (200, "ok")
    assert http_get(server.http_port, "/readyz", host="localhost:7071") == (200, "ready")
    assert http_get(server.http_port, "/readyz", host="app.localhost") == (200, "ready")
    assert http_get(server.http_port, "/healthz", host="[::1]:7071") == (200, "ok")
    status, body = http_get(server.http_port, "/healthz", host="attacker.example")
    assert status == 403 and "loopback" in body
    assert http_get(server.http_port, "/nothing")[0] == 404
    # Every gRPC caller is an admin when authentication is off.
    channel, tasks, admin = stubs(server.target)
    await admin.AddRecurring(pb.AddRecurringRequest(name="r", cron="0 0 1 1 *", template=pb.TaskSpec()))
    await channel.close()
    relaxed = servers(LISTEN, args=("--insecure-no-auth",))
    assert http_get(relaxed.http_port, "/healthz", host="attacker.example") == (200, "ok")


# ---------------------------------------------------------------- TLS and mTLS


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    directory = tmp_path_factory.mktemp("pki")
    ca, rogue = CA(), CA("another CA")
    files = {"ca": directory / "ca.pem"}
    files["ca"].write_bytes(ca.pem)
    files["server"] = ca.write(directory, "server", ca.issue(["localhost"], ips=["127.0.0.1"], server=True))
    return directory, ca, rogue, files


async def test_tls_covers_grpc_and_http(servers, pki):
    directory, ca, _, files = pki
    cert, key = files["server"]
    server = servers(LISTEN + AUTH + f'[server.tls]\ncert = "{cert}"\nkey = "{key}"\n')
    credentials = grpc.ssl_channel_credentials(root_certificates=ca.pem)
    channel, tasks, _ = stubs(server.target, credentials=credentials)
    done = await tasks.Submit(spec("default"), metadata=bearer(CLIENT))
    assert done.id > 0
    await channel.close()
    plain, tasks, _ = stubs(server.target)
    assert await code_of(tasks.Submit(spec("default"), metadata=bearer(CLIENT))) == grpc.StatusCode.UNAVAILABLE
    await plain.close()
    context = ssl.create_default_context(cafile=str(files["ca"]))
    assert await asyncio.to_thread(http_get, server.http_port, "/readyz", None, context) == (200, "ready")
    with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException)):
        await asyncio.to_thread(http_get, server.http_port, "/readyz")
    # The Python client and worker over TLS.
    from cronoq.client import Client, Worker
    worker = Worker(server.target, "default", lambda lease: lease.payload.upper(), token=WORKER,
                    credentials=credentials)
    running = asyncio.create_task(worker.run())
    async with Client(server.target, token=CLIENT, credentials=credentials) as client:
        sub = await client.submit(b"tls", wait=True, wait_timeout=30)
        assert sub.result.output == b"TLS"
    worker.stop()
    await asyncio.wait_for(running, 30)


async def test_mtls_maps_certificates_to_roles_and_a_token_takes_precedence(servers, pki):
    directory, ca, rogue, files = pki
    cert, key = files["server"]
    worker_pair = ca.issue(["worker-1.internal"])
    stranger_pair = ca.issue(["stranger.internal"])
    rogue_pair = rogue.issue(["worker-1.internal"])
    server = servers(LISTEN + AUTH + f"""
[server.tls]
cert = "{cert}"
key = "{key}"
client_ca = "{files['ca']}"
[[auth.certs]]
dns_name = "worker-1.internal"
role = "worker"
pools = ["default"]
""")

    def creds(pair):
        return grpc.ssl_channel_credentials(root_certificates=ca.pem, private_key=pair[1], certificate_chain=pair[0])

    # A mapped certificate is a worker: no token needed.
    worker = RawWorker(server.target, credentials=creds(worker_pair))
    await worker.register("default", name="by-certificate")
    channel, tasks, admin = stubs(server.target, credentials=creds(worker_pair))
    assert await code_of(tasks.Submit(spec("default"))) == grpc.StatusCode.PERMISSION_DENIED   # a worker
    # A token presented with the certificate wins: this caller is a client.
    assert await code_of(tasks.Submit(spec("default"), metadata=bearer(CLIENT))) == grpc.StatusCode.OK
    await channel.close()
    # A valid certificate that maps to nothing authenticates nobody.
    channel, tasks, _ = stubs(server.target, credentials=creds(stranger_pair))
    assert await code_of(tasks.Submit(spec("default"))) == grpc.StatusCode.UNAUTHENTICATED
    await channel.close()
    # No certificate, or one from another CA: the handshake fails.
    for credentials in (grpc.ssl_channel_credentials(root_certificates=ca.pem), creds(rogue_pair)):
        channel, tasks, _ = stubs(server.target, credentials=credentials)
        assert await code_of(tasks.Submit(spec("default"), metadata=bearer(CLIENT))) == grpc.StatusCode.UNAVAILABLE
        await channel.close()
    await worker.close()
