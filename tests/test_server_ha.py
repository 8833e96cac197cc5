"""Durability and high availability of the server: standbys (UNAVAILABLE,
/readyz 503, connections closed), takeover after a clean stop and after
SIGKILL with SQLite and with PostgreSQL, acknowledged tasks kept, a leader
that loses its lease telling its workers Shutdown{not_leader}, SIGTERM
draining, and workers SIGKILLed or SIGSTOPped in the middle of a lease."""

from __future__ import annotations

import asyncio
import glob
import http.client
import json
import os
import signal
import time
import uuid

import grpc
import pytest

from cronoq._proto import cronoq_pb2 as pb
from cronoq import UnknownTask
from cronoq.client import Client, Worker
from serverkit import LISTEN, RawWorker, WorkerProcess, sqlite_store, stubs

pytestmark = pytest.mark.asyncio


def readyz(server) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        connection.request("GET", "/readyz")
        return connection.getresponse().status
    finally:
        connection.close()


def sqlite_config(path, *, ttl: float = 2.0) -> str:
    return LISTEN + sqlite_store(path, ttl=ttl, full_sync=False) + """
[[pools]]
name = "default"
lease_ttl_s = 2
retry = { max_attempts = 5, initial_backoff_s = 0.05, jitter = false }
[[pools]]
name = "idle"
"""


async def echo(lease):
    return {"echo": lease.text(), "attempt": lease.attempt}


async def run_worker(target: str, pool: str = "default") -> tuple[Worker, asyncio.Task]:
    worker = Worker(target, pool, echo, slots=4, initial_backoff=0.05, max_backoff=0.5)
    return worker, asyncio.create_task(worker.run())


async def stop_worker(worker: Worker, task: asyncio.Task) -> None:
    worker.stop()
    await asyncio.wait_for(task, 30)


async def submit_known(target: str) -> tuple[list[int], list[int]]:
    """Tasks that finish (with a worker) and tasks that stay queued (pool 'idle')."""
    worker, running = await run_worker(target)
    async with Client(target) as client:
        done = []
        for i in range(5):
            sub = await client.submit(f"done-{i}", key=f"done-{i}", wait=True, wait_timeout=30)
            assert sub.result.json() == {"echo": f"done-{i}", "attempt": 1}
            done.append(sub.id)
        queued = [s.id for s in await client.submit_batch(
            [{"payload": f"queued-{i}", "pool": "idle", "key": f"queued-{i}"} for i in range(5)])]
    await stop_worker(worker, running)
    return done, queued


async def check_kept(target: str, done: list[int], queued: list[int]) -> None:
    """The new leader knows every acknowledged task: finished ones with their
    outputs, queued ones run once a worker serves their pool."""
    async with Client(target) as client:
        for i, task_id in enumerate(done):
            result = await client.wait(task_id, timeout=30)
            assert result.json() == {"echo": f"done-{i}", "attempt": 1}
            assert (await client.get(f"done-{i}")).id == task_id
        worker, running = await run_worker(target, "idle")
        for i, task_id in enumerate(queued):
            result = await client.wait(task_id, timeout=30)
            assert result.json()["echo"] == f"queued-{i}"
        await stop_worker(worker, running)


async def test_sqlite_standby_answers_unavailable_then_takes_over_at_once_after_a_clean_stop(servers, tmp_path):
    config = sqlite_config(tmp_path / "state.db")
    leader = servers(config, name="a")
    standby = servers(config, name="b", wait_for="standing by")
    assert (readyz(leader), readyz(standby)) == (200, 503)
    channel, tasks, admin = stubs(standby.target)
    for call in (tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec())), admin.Snapshot(pb.SnapshotRequest())):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "not the leader" in refused.value.details()
    # The standby closes each connection about standby_close_s (0.5 s here) after accepting it.
    assert channel.get_state() == grpc.ChannelConnectivity.READY
    await asyncio.wait_for(channel.wait_for_state_change(grpc.ChannelConnectivity.READY), 30)
    assert channel.get_state() != grpc.ChannelConnectivity.READY
    await channel.close()
    # A worker of the standby is refused too, and retries; the Python worker keeps trying.
    refused_worker = RawWorker(standby.target)
    await refused_worker.send(register=pb.Register(pool="default", slots=1, protocol_version=3))
    _, code, _ = await refused_worker.finish()
    assert code == grpc.StatusCode.UNAVAILABLE
    await refused_worker.close()

    done, queued = await submit_known(leader.target)
    assert leader.stop() == 0
    standby.wait_for("serving as the leader", timeout=30)
    assert readyz(standby) == 200
    await check_kept(standby.target, done, queued)


async def test_sqlite_sigkill_of_the_leader_keeps_acknowledged_tasks(servers, tmp_path):
    config = sqlite_config(tmp_path / "state.db")
    leader = servers(config, name="a")
    standby = servers(config, name="b", wait_for="standing by")
    done, queued = await submit_known(leader.target)
    # A client retrying through the failover: it gets its answer from the new leader.
    leader.kill()
    assert "serving as the leader" not in standby.log
    standby.wait_for("serving as the leader", timeout=60)   # once the dead leader's lease ran out
    await check_kept(standby.target, done, queued)


async def test_a_leader_that_loses_its_lease_tells_workers_not_leader_and_stands_by(servers, tmp_path):
    # Standbys close connections standby_close_s after accepting them: a long one here,
    # so that a slow machine still sees the refusal rather than the closed connection.
    config = sqlite_config(tmp_path / "state.db", ttl=1.0).replace("standby_close_s = 0.5", "standby_close_s = 5")
    leader = servers(config, name="a")
    worker = RawWorker(leader.target)
    await worker.register("idle")
    standby = servers(config, name="b", wait_for="standing by")
    leader.signal(signal.SIGSTOP)              # paused past its lease: the standby takes over
    try:
        standby.wait_for("serving as the leader", timeout=60)
    finally:
        leader.signal(signal.SIGCONT)
    shutdown = await worker.recv_kind("shutdown", timeout=60)
    assert shutdown.not_leader is True
    _, code, _ = await worker.finish()
    assert code == grpc.StatusCode.OK
    # Its second "waiting to lead" comes once its standby listener is up: a call
    # that meets the leader's listener as it closes is CANCELLED, not refused.
    leader.wait_for("standing by: waiting to lead", occurrences=2, timeout=60)
    assert (readyz(leader), readyz(standby)) == (503, 200)
    channel, tasks, _ = stubs(leader.target)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec()))
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    await channel.close()
    await worker.close()


def http_submit(server, key: str) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        connection.request("POST", "/v1/tasks", body=json.dumps({"pool": "idle", "key": key}),
                           headers={"Content-Type": "application/json"})
        return connection.getresponse().status
    finally:
        connection.close()


async def submit_refused(server) -> None:
    """A submission to ``server`` is refused: UNAVAILABLE over gRPC, 503 over HTTP."""
    channel, tasks, _ = stubs(server.target)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(pool="idle", key=f"refused-{uuid.uuid4().hex}")))
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await channel.close()
    assert http_submit(server, f"refused-{uuid.uuid4().hex}") == 503


def remove_sqlite(path) -> None:
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(f"{path}{suffix}"):
            os.unlink(f"{path}{suffix}")


async def test_a_sqlite_file_deleted_under_the_leader_stops_it_loudly_and_its_saved_copy_brings_all_back(
        servers, tmp_path):
    path = tmp_path / "state.db"
    leader = servers(sqlite_config(path), name="a")
    async with Client(leader.target) as client:
        acknowledged = {f"kept-{i}": (await client.submit(f"kept-{i}", pool="idle", key=f"kept-{i}")).id
                        for i in range(5)}
    remove_sqlite(path)
    await submit_refused(leader)
    leader.wait_for(f"ERROR cronoq.store: sqlite store: the database file '{path}' was deleted or replaced while open")
    leader.wait_for("standing by", occurrences=2)
    leader.wait_for("does not create it")
    assert readyz(leader) == 503
    await submit_refused(leader)
    leader.wait_for("ERROR cronoq.store: sqlite store: the tasks committed to")
    saved = glob.glob(f"{glob.escape(str(path))}.rescued-*")
    assert len(saved) == 1 and repr(saved[0]) in leader.log
    assert not path.exists()
    # The operator puts the copy back: the same server leads again, with every acknowledged task.
    os.rename(saved[0], path)
    leader.wait_for("serving as the leader", occurrences=2, timeout=60)
    async with Client(leader.target) as client:
        for key, task_id in acknowledged.items():
            info = await client.get(key)
            assert (info.id, info.status) == (task_id, "ready")


async def test_a_second_server_on_a_deleted_sqlite_path_never_leads_beside_the_first(servers, tmp_path):
    path = tmp_path / "state.db"
    config = sqlite_config(path)
    first = servers(config, name="a")
    async with Client(first.target) as client:
        await client.submit("before", pool="idle", key="before")
    remove_sqlite(path)
    first.wait_for("was deleted or replaced while open", timeout=90)   # (its next renewal notices; slow under load)
    await submit_refused(first)
    second = servers(config, name="b", wait_for="standing by")   # it creates a new, empty database there
    # Both contend for the new file's lease, fairly: one leads it, never both.
    deadline = time.monotonic() + 60
    while True:
        if any("serving as the leader" in line for line in second.lines):
            leader, other, times_led = second, first, 1
            break
        if sum("serving as the leader" in line for line in first.lines) >= 2:
            leader, other, times_led = first, second, 2
            break
        assert time.monotonic() < deadline, "neither server leads the new file"
        await asyncio.sleep(0.1)
    assert (readyz(leader), readyz(other)) == (200, 503)
    async with Client(leader.target) as client:
        with pytest.raises(UnknownTask):   # the new file knows nothing of the old one
            await client.get("before")
        new_id = (await client.submit("after", pool="idle", key="after")).id
    # The other stands by on the new file, and takes over from it.
    assert leader.stop() == 0
    other.wait_for("serving as the leader", occurrences=3 - times_led, timeout=60)
    async with Client(other.target) as client:
        assert (await client.get("after")).id == new_id


async def test_sigterm_drains_and_keeps_what_finished_during_the_grace(servers, tmp_path):
    config = sqlite_config(tmp_path / "state.db")
    server = servers(config, name="a")
    channel, tasks, _ = stubs(server.target)
    worker = RawWorker(server.target)
    await worker.register("idle", slots=2)        # a pool with a long lease TTL: no heartbeats needed
    finishing = (await tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(key="finishing", pool="idle")))).id
    hanging = (await tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(key="hanging", pool="idle")))).id
    leases = {}
    for _ in range(2):
        lease = await worker.recv_kind("lease")
        leases[lease.task_id] = lease.lease
    # A schedule added over Admin is stored with the rest.
    from cronoq._proto import cronoq_pb2_grpc as pb_grpc
    admin = pb_grpc.AdminStub(channel)
    await admin.AddRecurring(pb.AddRecurringRequest(name="kept", cron="0 0 1 1 *",
                                                    template=pb.TaskSpec(pool="idle", payload=b"yearly")))
    await channel.close()
    server.signal(signal.SIGTERM)
    server.wait_for("stopping")
    await worker.send(complete=pb.Complete(lease=leases[finishing], output=b"made it"))
    abort = await worker.recv_kind("abort", timeout=60)     # after the grace: the running lease is given up
    assert abort.lease == leases[hanging] and abort.code == pb.ABORT_REASON_SHUTDOWN
    shutdown = await worker.recv_kind("shutdown", timeout=60)
    assert not shutdown.not_leader
    assert server.wait(60) == 0
    await worker.close()
    restarted = servers(config, name="again")
    async with Client(restarted.target) as client:
        result = await client.wait(finishing, timeout=30)
        assert (result.status, result.output) == ("succeeded", b"made it")
        left = await client.get(hanging)             # the attempt running at the stop counts as used
        assert left.status in ("ready", "retrying") and left.attempt == 1
        assert [(r.name, r.pool, r.cron) for r in await client.recurring()] == [("kept", "idle", "0 0 1 1 *")]


async def test_a_worker_killed_mid_lease_has_its_attempt_retried_elsewhere(servers):
    server = servers(LISTEN + "[[pools]]\nname = \"default\"\nretry = { initial_backoff_s = 0.05, jitter = false }\n")
    doomed = WorkerProcess(server.target)
    try:
        async with Client(server.target) as client:
            sub = await client.submit("work")
            doomed.wait_for(f"started {sub.id} 1")
            doomed.signal(signal.SIGKILL)
            worker, running = await run_worker(server.target)
            result = await client.wait(sub.id, timeout=30)
            assert result.json() == {"echo": "work", "attempt": 2}
            await stop_worker(worker, running)
    finally:
        doomed.stop()


async def test_a_worker_stopped_mid_lease_loses_it_when_the_lease_expires(servers):
    server = servers(LISTEN + "[[pools]]\nname = \"default\"\nlease_ttl_s = 1\n"
                              "retry = { initial_backoff_s = 0.05, jitter = false }\n")
    frozen = WorkerProcess(server.target)
    try:
        async with Client(server.target) as client:
            sub = await client.submit("work")
            frozen.wait_for(f"started {sub.id} 1")
            frozen.signal(signal.SIGSTOP)       # connected but silent: no heartbeats
            worker, running = await run_worker(server.target)
            result = await client.wait(sub.id, timeout=30)
            assert result.json() == {"echo": "work", "attempt": 2}
            await stop_worker(worker, running)
    finally:
        frozen.stop()


# ---------------------------------------------------------------- PostgreSQL


async def test_postgres_standby_takes_over_after_sigkill_keeping_acknowledged_tasks(servers, pg_server):
    schema = f"ha_{uuid.uuid4().hex[:8]}"
    config = LISTEN + f"""
[store]
kind = "postgres"
url_env = "CRONOQ_TEST_DATABASE_URL"
schema = "{schema}"
lock_poll_s = 0.1
[[pools]]
name = "default"
[[pools]]
name = "idle"
"""
    env = {"CRONOQ_TEST_DATABASE_URL": pg_server.url}
    leader = servers(config, name="a", env=env)
    standby = servers(config, name="b", env=env, wait_for="standing by")
    assert (readyz(leader), readyz(standby)) == (200, 503)
    done, queued = await submit_known(leader.target)
    leader.kill()
    standby.wait_for("serving as the leader", timeout=60)
    await check_kept(standby.target, done, queued)
    # And once more, a clean stop hands over to a third replica.
    third = servers(config, name="c", env=env, wait_for="standing by")
    assert standby.stop() == 0
    third.wait_for("serving as the leader", timeout=60)
    await check_kept(third.target, done, [])
    assert pg_server.url not in standby.log   # no database URL (and password) in the log
