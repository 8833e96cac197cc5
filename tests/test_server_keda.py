"""KEDA's external scaler API on cronoq-server's gRPC port: a ScaledObject
trigger names a pool, the metric is the pool's desired slots with
slotsPerReplica as the target, IsActive (and its stream) says whether the
pool asks for capacity or holds work; the metrics role is required, by the
usual credentials or a token in the trigger's metadata (``token``, or
``tokenFromEnv`` as KEDA resolves it) (docs/server.md,
"KEDA's external scaler"). The client is KEDA's wire (tests/kedakit.py)."""

from __future__ import annotations

import asyncio
import signal
import time

import grpc
import httpx
import pytest

from kedakit import KedaClient
from serverkit import ADMIN, AUTH, CLIENT, LISTEN, METRICS, WORKER, RawWorker, bearer

SCOPED = "scoped-metrics-token-0123456789abcd"   # the metrics role, pool fixed only
NOT_A_TOKEN = "never-configured-token-0123456789"

CONFIG = LISTEN + AUTH + f"""
[[auth.tokens]]
token = "{SCOPED}"
role = "metrics"
pools = ["fixed"]
[[pools]]
name = "default"
min = 0
max = 64
default_duration_s = 2
# Quick evaluations, a short window and cooldown: a rise and a fall within seconds.
autoscale = {{ interval_s = 0.2, stabilization_window_s = 1, cooldown_s = 0.2, max_step_down = 64 }}
[[pools]]
name = "fixed"
min = 2
autoscale = false
"""

pytestmark = pytest.mark.asyncio


@pytest.fixture(scope="module")
def server(module_servers):
    return module_servers(CONFIG, name="keda")


@pytest.fixture
def fresh(servers):
    """A server of its own, for the tests that move a pool's desired."""
    return servers(CONFIG, name="keda-fresh")


def http(server, token: str = CLIENT) -> httpx.Client:
    return httpx.Client(base_url=f"http://127.0.0.1:{server.http_port}", timeout=30,
                        headers={"authorization": f"Bearer {token}"})


def pool_snapshot(server, pool: str = "default") -> dict:
    with http(server, METRICS) as client:
        return next(p for p in client.get("/v1/snapshot").json()["pools"] if p["name"] == pool)


async def eventually(check, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def refused(call) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value


def burst(server, count: int = 40) -> list[int]:
    with http(server) as client:
        answer = client.post("/v1/tasks:batch", json={"tasks": [{"key": f"burst-{i}"} for i in range(count)]})
        assert answer.status_code == 200, answer.text
        return [t["id"] for t in answer.json()["tasks"]]


def cancel(server, ids: list[int]) -> None:
    with http(server) as client:
        for task_id in ids:
            assert client.delete(f"/v1/tasks/{task_id}").status_code == 200


async def test_the_metric_is_the_pools_desired_slots_through_a_burst(fresh):
    keda = KedaClient(fresh.target)
    token = bearer(METRICS)
    try:
        ref = keda.ref("default", slotsPerReplica="4")
        (spec,) = (await keda.metric_spec(ref, token)).metricSpecs
        assert (spec.metricName, spec.targetSize, spec.targetSizeFloat) == ("cronoq-default-desired", 4, 4.0)
        # Idle, min 0: nothing asked for, nothing to do.
        assert await keda.desired(ref, token) == 0 and pool_snapshot(fresh)["desired"] == 0
        assert not await keda.is_active(ref, token)
        (value,) = (await keda.metrics(ref, "s0-cronoq-default-desired", token)).metricValues
        assert value.metricName == "cronoq-default-desired"   # (KEDA's prefixed name is accepted)

        ids = burst(fresh)   # no worker: the autoscaler asks for slots
        high = await eventually(lambda: _above(keda, ref, token, 10), "desired to rise")
        assert high <= 64 and await keda.is_active(ref, token)

        workers = [RawWorker(fresh.target, WORKER) for _ in range(2)]
        for worker in workers:
            await worker.register("default", slots=3)
        snap = await eventually(lambda: _capacity(fresh, 6), "the workers' slots to count")
        # Capacity is what connected; the metric stays what the pool asks for.
        assert snap["desired"] > 10
        await eventually(lambda: _matches_snapshot(keda, ref, token, fresh), "the metric to equal desired")
        assert await keda.desired(keda.ref("fixed"), token) == 2   # autoscale = false: its min

        cancel(fresh, ids)
        for worker in workers:
            await worker.close()
        await eventually(lambda: _equals(keda, ref, token, 0), "desired to fall to 0")
        await eventually(lambda: _inactive(keda, ref, token), "the pool to go inactive")
    finally:
        await keda.close()


async def _above(keda, ref, token, floor: int):
    value = await keda.desired(ref, token)
    return value if value > floor else None


async def _equals(keda, ref, token, wanted: int) -> bool:
    return await keda.desired(ref, token) == wanted


async def _matches_snapshot(keda, ref, token, server) -> bool:
    # (desired moves while the autoscaler steps: equal once it holds still)
    value = await keda.desired(ref, token)
    snap = pool_snapshot(server)
    return value == snap["desired"] > 10 and snap["capacity"] == 6


async def _inactive(keda, ref, token) -> bool:
    return not await keda.is_active(ref, token)


async def _capacity(server, slots: int):
    snap = pool_snapshot(server)
    return snap if snap["capacity"] == slots else None


async def test_stream_is_active_pushes_true_then_false_when_the_work_is_cancelled(fresh):
    keda = KedaClient(fresh.target)
    try:
        # The token from the trigger's metadata, as a TriggerAuthentication supplies it.
        stream = keda.stream_is_active(keda.ref("default", token=METRICS))
        first = await asyncio.wait_for(stream.read(), 30)
        assert first.result is False
        ids = burst(fresh, 20)
        assert (await asyncio.wait_for(stream.read(), 30)).result is True
        cancel(fresh, ids)
        assert (await asyncio.wait_for(stream.read(), 30)).result is False
        stream.cancel()
    finally:
        await keda.close()


async def test_the_metrics_role_is_required_and_a_token_in_the_metadata_is_a_credential(server):
    keda = KedaClient(server.target)
    try:
        error = await refused(keda.metrics(keda.ref()))
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED
        error = await refused(keda.metrics(keda.ref(), metadata=bearer(CLIENT)))
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED and "metrics role" in error.details()
        error = await refused(keda.is_active(keda.ref(token=WORKER)))
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED
        error = await refused(keda.metric_spec(keda.ref(token=NOT_A_TOKEN)))
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED
        error = await refused(keda.stream_is_active(keda.ref()).read())
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED
        # A credential scoped to other pools does not see this one.
        error = await refused(keda.metrics(keda.ref(token=SCOPED)))
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED and "'default'" in error.details()
        assert await keda.desired(keda.ref("fixed", token=SCOPED)) == 2

        assert await keda.desired(keda.ref(token=METRICS)) == 0
        # tokenFromEnv: KEDA puts the value of the workload's environment variable it names.
        assert await keda.desired(keda.ref(tokenFromEnv=METRICS)) == 0
        error = await refused(keda.metrics(keda.ref(tokenFromEnv=CLIENT)))
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED
        assert await keda.desired(keda.ref(token=ADMIN)) == 0
        assert await keda.desired(keda.ref(), bearer(METRICS)) == 0
        assert await keda.is_active(keda.ref("fixed"), bearer(ADMIN))   # desired = min = 2
        # The authorization metadata, when sent, is the credential.
        error = await refused(keda.metrics(keda.ref(token=METRICS), metadata=bearer(CLIENT)))
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED
        for token in (METRICS, SCOPED, NOT_A_TOKEN, WORKER):
            assert token not in server.log
    finally:
        await keda.close()


async def test_the_trigger_must_name_a_known_pool_and_a_whole_slots_per_replica(server):
    keda = KedaClient(server.target)
    try:
        error = await refused(keda.metrics(keda.ref("gpu", token=METRICS)))
        assert error.code() == grpc.StatusCode.NOT_FOUND
        assert "'gpu'" in error.details() and "default, fixed" in error.details()
        error = await refused(keda.metrics(keda.ref("gpu", token=SCOPED)))   # names only the pools it may use
        assert error.code() == grpc.StatusCode.NOT_FOUND and "(pools: fixed)" in error.details()
        error = await refused(keda.metric_spec(keda.ref(None, token=METRICS)))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "'pool'" in error.details()
        error = await refused(keda.is_active(keda.ref(None)))   # the trigger is read before the credential
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        for bad in ("0", "-2", "1.5", "many"):
            error = await refused(keda.metric_spec(keda.ref(token=METRICS, slotsPerReplica=bad)))
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "slotsPerReplica" in error.details()
        error = await refused(keda.metrics(keda.ref(token=METRICS), "cronoq-fixed-desired"))
        assert error.code() == grpc.StatusCode.NOT_FOUND and "cronoq-default-desired" in error.details()
        # KEDA's optional StreamMetricSpec is not served: KEDA falls back to GetMetricSpec.
        error = await refused(keda.stream_metric_spec(keda.ref(token=METRICS)).read())
        assert error.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        await keda.close()


async def test_a_client_certificate_mapped_to_the_metrics_role_is_enough(servers, tmp_path):
    from certkit import CA

    ca = CA()
    (tmp_path / "ca.pem").write_bytes(ca.pem)
    cert, key = ca.write(tmp_path, "server", ca.issue(["localhost"], ips=["127.0.0.1"], server=True))
    server = servers(LISTEN + AUTH + f"""
[server.tls]
cert = "{cert}"
key = "{key}"
client_ca = "{tmp_path / 'ca.pem'}"
[[auth.certs]]
dns_name = "keda-operator.internal"
role = "metrics"
[[auth.certs]]
dns_name = "worker-1.internal"
role = "worker"
""", name="keda-tls")

    def client(names: list[str]) -> KedaClient:
        pair = ca.issue(names)
        return KedaClient(server.target, credentials=grpc.ssl_channel_credentials(
            root_certificates=ca.pem, private_key=pair[1], certificate_chain=pair[0]))

    operator, worker = client(["keda-operator.internal"]), client(["worker-1.internal"])
    try:
        assert await operator.desired(operator.ref()) == 0
        (spec,) = (await operator.metric_spec(operator.ref())).metricSpecs
        assert spec.targetSize == 1 and spec.metricName == "cronoq-default-desired"
        error = await refused(worker.is_active(worker.ref()))
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED
        # The trigger's token goes before a certificate (as a bearer token does).
        assert not await worker.is_active(worker.ref(token=METRICS))
    finally:
        await operator.close()
        await worker.close()


async def test_a_standby_answers_unavailable_and_a_stream_ends_when_its_server_stops_leading(servers, tmp_path):
    config = LISTEN + AUTH + f"""
[store]
kind = "sqlite"
path = "{tmp_path / 'state.db'}"
lease_ttl_s = 2
lease_renew_s = 0.3
lock_poll_s = 0.1
[[pools]]
name = "default"
"""
    leader = servers(config, name="leader")
    standby = servers(config, name="standby", wait_for="standing by")
    keda, on_leader = KedaClient(standby.target), KedaClient(leader.target)
    try:
        ref = keda.ref(token=METRICS)
        stream = keda.stream_is_active(ref)
        for call in (keda.metrics(ref), keda.is_active(ref), keda.metric_spec(ref), stream.read()):
            error = await refused(call)
            assert error.code() == grpc.StatusCode.UNAVAILABLE, error
        # The leader's stream ends cleanly when it stops leading: KEDA opens it again (on the new leader).
        leading = on_leader.stream_is_active(ref)
        assert (await asyncio.wait_for(leading.read(), 30)).result is False
        leader.signal(signal.SIGTERM)
        assert await asyncio.wait_for(leading.read(), 30) is grpc.aio.EOF
        assert await leading.code() == grpc.StatusCode.OK
        standby.wait_for("serving as the leader", timeout=60)
        assert await keda.desired(ref) == 0
        again = keda.stream_is_active(ref)
        assert (await asyncio.wait_for(again.read(), 30)).result is False
        again.cancel()
    finally:
        await keda.close()
        await on_leader.close()
