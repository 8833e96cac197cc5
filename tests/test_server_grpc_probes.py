"""The worker side of the gRPC API under abuse, over the wire: raw channels
with the generated stubs against a real server process.

A message far above max_message_bytes, reports for a lease that another
worker holds, a flood of heartbeats, a thousand streams that never register.
Each probe checks that the server refuses or ignores what it must, stays
responsive for other callers, and logs no traceback. Waits are for answers
and log lines, with generous timeouts.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from cronoq._proto import cronoq_pb2 as pb
from cronoq._proto import cronoq_pb2_grpc as pb_grpc
from serverkit import AUTH, LISTEN, WORKER, RawWorker, stubs

pytestmark = pytest.mark.asyncio

CONFIG = LISTEN + """
[limits]
register_timeout_s = 2
max_workers = 6
max_message_bytes = 1048576

[[pools]]
name = "default"
[[pools]]
name = "others"
[[pools]]
name = "flood"
lease_ttl_s = 2
[[pools]]
name = "streams"
"""

# The client may send what the server refuses (its own default limit would stop it first).
_BIG = (("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1))


@pytest.fixture(scope="module")
def server(module_servers):
    return module_servers(CONFIG, name="probes")


def quiet(server) -> None:
    """Nothing the server logged is an error or a traceback."""
    bad = [line for line in server.log.splitlines() if " ERROR " in line or "Traceback" in line]
    assert not bad, "\n".join(bad)


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


async def responsive(target: str) -> None:
    channel, _, admin = stubs(target)
    try:
        await asyncio.wait_for(admin.Snapshot(pb.SnapshotRequest()), 30)
    finally:
        await channel.close()


async def submit(tasks, pool: str, payload: bytes = b"x") -> int:
    return (await tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(payload=payload, pool=pool)))).id


async def test_a_100_mb_message_is_refused_and_the_server_goes_on(server):
    huge = b"x" * (100 * 1024 * 1024)
    channel = grpc.aio.insecure_channel(server.target, options=_BIG)
    tasks = pb_grpc.TasksStub(channel)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(payload=huge, pool="default")))
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    # On a worker stream: the stream ends with RESOURCE_EXHAUSTED, its lease goes elsewhere.
    worker = RawWorker(server.target, options=_BIG)
    await worker.register("default", slots=1, name="huge")
    task_id = await submit(tasks, "default")
    lease = await worker.recv_kind("lease")
    await worker.send(complete=pb.Complete(lease=lease.lease, output=huge))
    _, code, _ = await worker.finish(timeout=60)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    other = RawWorker(server.target)
    await other.register("default", slots=1, name="after")
    again = await other.recv_kind("lease", timeout=60)
    assert (again.task_id, again.attempt) == (task_id, 2)
    await other.send(complete=pb.Complete(lease=again.lease, output=b"fine"))
    done = await tasks.Wait(pb.WaitRequest(task=pb.TaskRef(id=task_id), timeout_s=30))
    assert (done.status, done.output) == (pb.TASK_STATUS_SUCCEEDED, b"fine")
    await other.close()
    await worker.close()
    await channel.close()
    await responsive(server.target)
    quiet(server)


async def test_reports_for_a_lease_another_worker_holds_change_nothing(server):
    channel, tasks, _ = stubs(server.target)
    holder = RawWorker(server.target)
    await holder.register("others", slots=1, name="holder")
    task_id = await submit(tasks, "others")
    lease = await holder.recv_kind("lease")
    intruder = RawWorker(server.target)
    await intruder.send(register=pb.Register(pool="others", slots=1, worker_name="intruder", protocol_version=3,
                                             accept_checkpoints=True))
    assert (await intruder.recv_kind("registered")).worker_id
    for message in (dict(complete=pb.Complete(lease=lease.lease, output=b"stolen")),
                    dict(fail=pb.Fail(lease=lease.lease, message="not mine", permanent=True)),
                    dict(nack=pb.Nack(lease=lease.lease, reason="not mine")),
                    dict(cancelled=pb.Cancelled(lease=lease.lease, message="not mine")),
                    dict(heartbeat=pb.Heartbeat(lease=lease.lease)),
                    dict(checkpoint=pb.Checkpoint(lease=lease.lease, stage="s", data=b"d", seq=7))):
        await intruder.send(**message)
    saved = await intruder.recv_kind("checkpoint_saved")
    assert saved.seq == 7 and "does not hold this lease" in saved.error
    # The intruder's stream is fine, and the holder's attempt is untouched: it alone ends it.
    info = await tasks.Get(pb.GetRequest(task=pb.TaskRef(id=task_id)))
    assert (info.status, info.attempt) == (pb.TASK_STATUS_RUNNING, 1)
    await holder.send(complete=pb.Complete(lease=lease.lease, output=b"mine"))
    done = await tasks.Wait(pb.WaitRequest(task=pb.TaskRef(id=task_id), timeout_s=30))
    assert (done.status, done.output) == (pb.TASK_STATUS_SUCCEEDED, b"mine")
    for w in (holder, intruder):
        await w.close()
    await channel.close()
    quiet(server)


async def test_a_flood_of_heartbeats_is_read_and_ignored_where_not_held(server):
    channel, tasks, admin = stubs(server.target)
    worker = RawWorker(server.target)
    await worker.register("flood", slots=1, name="flooder")
    task_id = await submit(tasks, "flood")
    lease = await worker.recv_kind("lease")
    before = rss_kib(server.pid)
    # 100,000 heartbeats in batches of 1,000: one in ten for the held lease, the rest for leases never held.
    for n in range(100):
        beats = [pb.WorkerMessage(heartbeat=pb.Heartbeat(lease=lease.lease if i % 10 == 0 else 2 ** 63 + n * 1000 + i))
                 for i in range(1000)]
        await worker.send(batch=pb.WorkerBatch(messages=beats))
        if n % 20 == 0:   # other callers are answered meanwhile
            await asyncio.wait_for(admin.Snapshot(pb.SnapshotRequest()), 30)
    # The stream is in order: once the worker's next request is answered, the flood was read.
    await worker.send(set_slots=pb.SetSlots(slots=1))
    assert (await worker.recv_kind("slots_granted", timeout=60)).slots == 1
    grown_mib = (rss_kib(server.pid) - before) / 1024
    print(f"flood: the server grew by {grown_mib:.1f} MiB")
    assert grown_mib < 64, f"the server grew by {grown_mib:.0f} MiB reading heartbeats"
    listed = {w.name: w for w in (await admin.ListWorkers(pb.ListWorkersRequest(pools=["flood"]))).workers}
    assert listed["flooder"].health == pb.WORKER_HEALTH_HEALTHY and listed["flooder"].busy == 1
    # Heartbeats for leases not held created nothing; the held one is still the worker's to report.
    await worker.send(complete=pb.Complete(lease=lease.lease, output=b"after the flood"))
    done = await tasks.Wait(pb.WaitRequest(task=pb.TaskRef(id=task_id), timeout_s=30))
    assert (done.status, done.output) == (pb.TASK_STATUS_SUCCEEDED, b"after the flood")
    assert (await tasks.Get(pb.GetRequest(task=pb.TaskRef(id=task_id)))).attempt == 1
    await worker.close()
    await channel.close()
    quiet(server)


async def test_a_thousand_streams_that_never_register_are_bounded_end_and_max_workers_holds(server):
    # Ten connections of a hundred streams each; none of them sends a word. At most
    # limits.max_workers (6) may wait for their Register at once: the others are
    # refused at once, and so cannot hold the server's memory for register_timeout_s.
    channels = [grpc.aio.insecure_channel(server.target, options=(("grpc.use_local_subchannel_pool", 1),))
                for _ in range(10)]
    calls = [pb_grpc.WorkersStub(channels[i % 10]).Work() for i in range(1000)]
    await asyncio.gather(*(call.wait_for_connection() for call in calls))
    await responsive(server.target)          # other callers are served meanwhile
    codes = await asyncio.wait_for(asyncio.gather(*(call.code() for call in calls)), 120)
    counts = {code: codes.count(code) for code in set(codes)}
    assert counts == {grpc.StatusCode.DEADLINE_EXCEEDED: 6, grpc.StatusCode.RESOURCE_EXHAUSTED: 994}, counts
    refused = next(call for call, code in zip(calls, codes) if code == grpc.StatusCode.RESOURCE_EXHAUSTED)
    assert "wait for their Register" in await refused.details()
    # Workers that do register are capped by limits.max_workers (6; none other is connected).
    registered, refused_workers = [], []
    for n in range(8):
        worker = RawWorker(server.target)
        await worker.send(register=pb.Register(pool="streams", slots=1, worker_name=f"w{n}", protocol_version=3))
        first = await worker.recv(timeout=60)
        (registered if first is not None else refused_workers).append(worker)
    assert len(registered) == 6 and len(refused_workers) == 2
    for worker in refused_workers:
        code, details = await worker.status()
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "at most 6 workers" in details
    await responsive(server.target)
    for worker in registered + refused_workers:
        await worker.close()
    for channel in channels:
        await channel.close()
    quiet(server)


async def test_streams_without_a_valid_credential_cannot_crowd_out_workers(servers):
    server = servers(LISTEN + AUTH + """
[limits]
register_timeout_s = 5
max_workers = 4
[[pools]]
name = "default"
""")
    channel = grpc.aio.insecure_channel(server.target)
    strangers = [pb_grpc.WorkersStub(channel).Work(metadata=(("authorization", "Bearer not-a-token-at-all"),))
                 for _ in range(50)]
    # (a stream the server already refused ends its wait with that refusal)
    await asyncio.gather(*(call.wait_for_connection() for call in strangers), return_exceptions=True)
    # Fifty silent streams with a bad token: a worker with a good one still registers.
    worker = RawWorker(server.target, WORKER)
    assert (await worker.register("default", slots=1)).worker_id
    codes = await asyncio.wait_for(asyncio.gather(*(call.code() for call in strangers)), 60)
    # (past its budget of failed authentications, the address is told RESOURCE_EXHAUSTED instead)
    assert set(codes) <= {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.RESOURCE_EXHAUSTED}
    assert grpc.StatusCode.UNAUTHENTICATED in codes
    await worker.close()
    await channel.close()
    quiet(server)
