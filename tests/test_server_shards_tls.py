"""Shards over TLS and mTLS, and the Python worker's redirect limits
(docs/server.md, "Sharding"), with real server processes on loopback.

Two shards serve over TLS with client certificates required
(``server.tls.client_ca``): ``a`` (number 1, pool ``default``) and ``b``
(number 2, pool ``gpu``), each forwarding to the other with
``[server.peer_tls]``. A third, ``c`` (pool ``plain``), has a plain-http
loopback endpoint nothing listens on: only its redirect is used.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from certkit import CA
from cronoq._proto import cronoq_pb2 as pb
from cronoq._proto import cronoq_pb2_grpc as pb_grpc
from serverkit import AUTH, CLIENT, WORKER, bearer, shards_toml, stubs
from test_server_shards import free_port, shard_number, spec

pytestmark = pytest.mark.asyncio


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    directory = tmp_path_factory.mktemp("pki")
    ca, rogue = CA(), CA("another CA")
    files = {"ca": directory / "ca.pem", "rogue": directory / "rogue.pem"}
    files["ca"].write_bytes(ca.pem)
    files["rogue"].write_bytes(rogue.pem)
    files["server"] = ca.write(directory, "server", ca.issue(["localhost"], ips=["127.0.0.1"], server=True))
    files["peer"] = ca.write(directory, "peer", ca.issue(["shard-peer.internal"]))
    pairs = {"reporter": ca.issue(["reporter.internal"]),      # mapped to the client role in [[auth.certs]]
             "holder": ca.issue(["token-holder.internal"])}    # maps to nothing: its caller sends a token
    return ca, files, pairs


def tls_config(directory, ports: dict[str, int], shard: str, files, *, grpc_port: int | None = None,
               peer_ca: str = "ca", peer_cert: bool = True) -> str:
    cert, key = files["server"]
    peer_cert_path, peer_key_path = files["peer"]
    client_certificate = f'cert = "{peer_cert_path}"\nkey = "{peer_key_path}"\n' if peer_cert else ""
    return f"""
[server]
grpc_addr = "127.0.0.1:{grpc_port if grpc_port is not None else ports[shard]}"
http_addr = "127.0.0.1:0"
shutdown_grace_s = 2
standby_close_s = 0.5
[server.tls]
cert = "{cert}"
key = "{key}"
client_ca = "{files['ca']}"
[server.peer_tls]
ca = "{files[peer_ca]}"
{client_certificate}
{AUTH}
[[auth.certs]]
dns_name = "reporter.internal"
role = "client"

[store]
kind = "sqlite"
path = "{directory}/tls-{{shard}}.db"
full_sync = false
""" + shards_toml({"a": (["default"], f"https://127.0.0.1:{ports['a']}"),
                    "b": (["gpu"], f"https://127.0.0.1:{ports['b']}"),
                    "c": (["plain"], f"http://127.0.0.1:{ports['c']}")})


@pytest.fixture(scope="module")
def tls_shards(module_servers, tmp_path_factory, pki):
    _, files, _ = pki
    directory = tmp_path_factory.mktemp("tls-shards")
    ports = {"a": free_port(), "b": free_port(), "c": free_port()}
    a = module_servers(tls_config(directory, ports, "a", files), args=("--shard", "a"), name="a")
    b = module_servers(tls_config(directory, ports, "b", files), args=("--shard", "b"), name="b")
    return a, b, ports


def creds(ca: CA, pair: tuple[bytes, bytes]) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(root_certificates=ca.pem, private_key=pair[1], certificate_chain=pair[0])


async def tls_call(target: str, credentials, method: str, request, token: str | None = CLIENT):
    channel, tasks, _ = stubs(target, credentials=credentials)
    try:
        return await getattr(tasks, method)(request, metadata=bearer(token) if token else (), timeout=30)
    finally:
        await channel.close()


async def tls_refused(target: str, credentials, method: str, request, token: str | None = CLIENT):
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await tls_call(target, credentials, method, request, token)
    return caught.value


async def test_a_token_caller_is_forwarded_over_peer_tls_to_the_other_shard(tls_shards, pki):
    a, b, _ = tls_shards
    ca, _, pairs = pki
    holder = creds(ca, pairs["holder"])
    there = await tls_call(a.target, holder, "Submit", pb.SubmitRequest(task=spec("gpu")))
    assert shard_number(there.id) == 2
    # b holds it: asked directly, and through a again (a forwarded Get).
    assert (await tls_call(b.target, holder, "Get", pb.GetRequest(task=pb.TaskRef(id=there.id)))).pool == "gpu"
    assert (await tls_call(a.target, holder, "Get", pb.GetRequest(task=pb.TaskRef(id=there.id)))).pool == "gpu"
    # A listing through b reaches a over TLS too; only c (nothing listens there) is missing.
    here = await tls_call(a.target, holder, "Submit", pb.SubmitRequest(task=spec("default")))
    listing = await tls_call(b.target, holder, "ListTasks", pb.ListTasksRequest(limit=1000))
    assert {here.id, there.id} <= {t.id for t in listing.tasks}
    assert list(listing.unavailable_shards) == ["c"]


async def test_a_certificate_caller_is_sent_to_the_other_shard_not_forwarded(tls_shards, pki):
    a, b, ports = tls_shards
    ca, _, pairs = pki
    reporter = creds(ca, pairs["reporter"])
    mine = await tls_call(a.target, reporter, "Submit", pb.SubmitRequest(task=spec("default")), token=None)
    assert shard_number(mine.id) == 1
    error = await tls_refused(a.target, reporter, "Submit", pb.SubmitRequest(task=spec("gpu")), token=None)
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "authenticated by certificate" in error.details()
    trailing = dict(error.trailing_metadata())
    assert (trailing["cronoq-shard"], trailing["cronoq-shard-endpoint"]) == ("b", f"https://127.0.0.1:{ports['b']}")
    # Its reads cover shard a only; the others are named missing.
    listing = await tls_call(a.target, reporter, "ListTasks", pb.ListTasksRequest(limit=1000), token=None)
    assert {shard_number(t.id) for t in listing.tasks} == {1}
    assert sorted(listing.unavailable_shards) == ["b", "c"]


@pytest.mark.parametrize("misconfigured", [{"peer_ca": "rogue"}, {"peer_cert": False}],
                         ids=["wrong-peer-ca", "no-peer-client-certificate"])
async def test_misconfigured_peer_tls_makes_the_other_shard_unavailable(tls_shards, pki, servers, tmp_path,
                                                                        misconfigured):
    _, b, ports = tls_shards
    ca, files, pairs = pki
    # Another server of shard a (its own store: it leads at once) whose [server.peer_tls] is wrong.
    wrong = servers(tls_config(tmp_path, ports, "a", files, grpc_port=0, **misconfigured), args=("--shard", "a"),
                    name="a-wrong")
    holder = creds(ca, pairs["holder"])
    error = await tls_refused(wrong.target, holder, "Submit", pb.SubmitRequest(task=spec("gpu")))
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert f"shard 'b' (https://127.0.0.1:{ports['b']}) could not be asked" in error.details()
    listing = await tls_call(wrong.target, holder, "ListTasks", pb.ListTasksRequest(limit=1000))
    assert sorted(listing.unavailable_shards) == ["b", "c"]
    # Its own shard still serves.
    assert shard_number((await tls_call(wrong.target, holder, "Submit",
                                        pb.SubmitRequest(task=spec("default")))).id) == 1


async def test_the_worker_refuses_a_redirect_from_tls_to_plain_http(tls_shards, pki):
    from cronoq import CronoqError
    from cronoq.client import Worker

    a, _, ports = tls_shards
    ca, _, pairs = pki

    async def handle(lease):
        return None

    worker = Worker(f"https://127.0.0.1:{a.grpc_port}", "plain", handle, token=WORKER,
                    credentials=creds(ca, pairs["holder"]))
    with pytest.raises(CronoqError, match="refusing to follow a redirect from TLS to plain http://") as caught:
        await asyncio.wait_for(worker.run(handle_signals=False), 30)
    assert f"http://127.0.0.1:{ports['c']}" in str(caught.value)


# ---------------------------------------------------------------- redirects in a row, from fake servers


class Redirector(pb_grpc.WorkersServicer):
    """A Workers service that sends every worker on to ``endpoint``, as a
    sharded server does for another shard's pool."""

    def __init__(self) -> None:
        self.endpoint = ""
        self.registered: list[str] = []

    async def Work(self, request_iterator, context):
        async for message in request_iterator:
            self.registered.append(message.register.pool)
            break
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                            f"pool is not served here: call {self.endpoint}",
                            trailing_metadata=(("cronoq-shard", "next"), ("cronoq-shard-endpoint", self.endpoint)))


async def test_the_worker_follows_three_redirects_in_a_row_and_refuses_a_fourth():
    from cronoq import CronoqError
    from cronoq.client import Worker

    fakes, servers, ports = [], [], []
    try:
        for _ in range(5):
            fake = Redirector()
            server = grpc.aio.server()
            pb_grpc.add_WorkersServicer_to_server(fake, server)
            ports.append(server.add_insecure_port("127.0.0.1:0"))
            await server.start()
            fakes.append(fake)
            servers.append(server)
        for fake, port in zip(fakes, ports[1:] + ports[:1]):
            fake.endpoint = f"http://127.0.0.1:{port}"

        async def handle(lease):
            return None

        worker = Worker(f"127.0.0.1:{ports[0]}", "gpu", handle, token=WORKER, initial_backoff=0.05)
        with pytest.raises(CronoqError, match=r"more than 3 shard redirects in a row") as caught:
            await asyncio.wait_for(worker.run(handle_signals=False), 30)
        chain = [f"127.0.0.1:{ports[0]}"] + [f"http://127.0.0.1:{p}" for p in ports[1:]]
        assert " -> ".join(chain) in str(caught.value)
        # The first four were each asked once; the fifth, the fourth redirect's, never.
        assert [fake.registered for fake in fakes] == [["gpu"]] * 4 + [[]]
    finally:
        for server in servers:
            await server.stop(None)
