"""The worker protocol (docs/server.md, "Protocol rules"), rule by rule, on raw
Workers.Work streams driven by hand against a real server process.

One server serves the module; each test uses pools of its own, so tests do
not see each other's tasks. Waits are for events, with generous timeouts.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from cronoq._proto import cronoq_pb2 as pb
from serverkit import LISTEN, RawWorker, stubs

pytestmark = pytest.mark.asyncio

CONFIG = LISTEN + """
[limits]
register_timeout_s = 0.5
max_slots_per_worker = 4
max_message_bytes = 65536

[[pools]]
name = "default"
[[pools]]
name = "capacity"
max = 6
[[pools]]
name = "ttl"
lease_ttl_s = 1.0
[[pools]]
name = "report"
[[pools]]
name = "nack"
retry = { max_attempts = 3, initial_backoff_s = 0.05, jitter = false }
[[pools]]
name = "abort"
[[pools]]
name = "drop"
retry = { max_attempts = 3, initial_backoff_s = 0.05, jitter = false }
[[pools]]
name = "second"
retry = { max_attempts = 3, initial_backoff_s = 0.05, jitter = false }
[[pools]]
name = "batch"
[[pools]]
name = "size"
[[pools]]
name = "flush"
[[pools]]
name = "labels"
[[pools]]
name = "drain"
retry = { max_attempts = 3, initial_backoff_s = 0.05, jitter = false }
"""


@pytest.fixture(scope="module")
def server(module_servers):
    return module_servers(CONFIG, name="protocol")


async def submit(tasks, pool: str, payload: bytes = b"x", **fields) -> int:
    response = await tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(payload=payload, pool=pool, **fields)))
    return response.id


async def result(tasks, task_id: int, timeout: float = 30.0) -> pb.TaskResult:
    return await tasks.Wait(pb.WaitRequest(task=pb.TaskRef(id=task_id), timeout_s=timeout))


async def info(tasks, task_id: int) -> pb.TaskInfo:
    return await tasks.Get(pb.GetRequest(task=pb.TaskRef(id=task_id)))


async def no_message(worker: RawWorker, seconds: float = 0.5) -> None:
    """Nothing arrives within ``seconds`` (used only where the rule is that nothing is sent)."""
    with pytest.raises(asyncio.TimeoutError):
        await worker.recv(timeout=seconds)


# ---------------------------------------------------------------- 1. Register first


async def test_rule1_a_stream_whose_first_message_is_not_register_fails(server):
    worker = RawWorker(server.target)
    await worker.send(heartbeat=pb.Heartbeat(lease=1))
    _, code, details = await worker.finish()
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "first message must be Register" in details
    await worker.close()


async def test_rule1_a_stream_that_sends_nothing_fails_with_deadline_exceeded(server):
    worker = RawWorker(server.target)
    await worker.call.wait_for_connection()
    _, code, details = await worker.finish()   # register_timeout_s = 0.5 in this configuration
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "no Register within 0.5 s" in details
    await worker.close()


async def test_rule1_a_second_register_ends_the_stream_and_its_lease_is_retried(server):
    channel, tasks, _ = stubs(server.target)
    worker = RawWorker(server.target)
    await worker.register("second")
    task_id = await submit(tasks, "second")
    lease = await worker.recv_kind("lease")
    assert lease.task_id == task_id and lease.attempt == 1
    await worker.send(register=pb.Register(pool="second", slots=1, protocol_version=3))
    _, code, details = await worker.finish()
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "second Register" in details
    other = RawWorker(server.target)
    await other.register("second")
    again = await other.recv_kind("lease")
    assert (again.task_id, again.attempt) == (task_id, 2)   # the disconnect failed attempt 1 as retryable
    await other.send(complete=pb.Complete(lease=again.lease, output=b"ok"))
    assert (await result(tasks, task_id)).status == pb.TASK_STATUS_SUCCEEDED
    for w in (worker, other):
        await w.close()
    await channel.close()


async def test_rule1_unknown_pools_are_not_found(server):
    worker = RawWorker(server.target)
    await worker.send(register=pb.Register(pool="no-such-pool", slots=1, protocol_version=3))
    _, code, details = await worker.finish()
    assert code == grpc.StatusCode.NOT_FOUND and "no-such-pool" in details
    await worker.close()


async def test_rule1_register_with_zero_slots_is_refused(server):
    worker = RawWorker(server.target)
    await worker.send(register=pb.Register(pool="default", slots=0, protocol_version=3))
    _, code, details = await worker.finish()
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "slots must be at least 1" in details
    await worker.close()


async def test_protocol_version_other_than_3_is_refused_naming_the_version_needed(server):
    for version in (0, 2, 4):
        worker = RawWorker(server.target)
        await worker.send(register=pb.Register(pool="default", slots=1, protocol_version=version))
        _, code, details = await worker.finish()
        assert code == grpc.StatusCode.FAILED_PRECONDITION
        assert "protocol version 3" in details and f"protocol_version {version}" in details
        await worker.close()


# ---------------------------------------------------------------- 2. Capacity is slots


async def test_rule2_capacity_is_the_sum_of_granted_slots_and_never_exceeded(server):
    channel, tasks, admin = stubs(server.target)
    first = RawWorker(server.target)
    registered = await first.register("capacity", slots=10)
    assert registered.slots == 4            # max_slots_per_worker
    assert registered.protocol_version == 3 and registered.worker_id > 0
    second = RawWorker(server.target)
    assert (await second.register("capacity", slots=4)).slots == 2   # the pool's max is 6
    third = RawWorker(server.target)
    await third.send(register=pb.Register(pool="capacity", slots=1, protocol_version=3))
    _, code, details = await third.finish()
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "max of 6" in details
    snapshot = await admin.Snapshot(pb.SnapshotRequest())
    pool = next(p for p in snapshot.pools if p.name == "capacity")
    assert (pool.capacity, pool.workers_connected) == (6, 2)

    ids = [await submit(tasks, "capacity") for _ in range(9)]
    leases = {1: [], 2: []}
    for _ in range(4):
        leases[1].append(await first.recv_kind("lease"))
    for _ in range(2):
        leases[2].append(await second.recv_kind("lease"))
    await no_message(first)
    await no_message(second)
    # A slot that frees takes the next task; the worker never holds more than its slots.
    await second.send(complete=pb.Complete(lease=leases[2][0].lease))
    leases[2].append(await second.recv_kind("lease"))
    await no_message(second)
    assert len({m.task_id for held in leases.values() for m in held}) == 7
    # Fewer slots: SetSlots answers with the grant; 0 drains (no new leases).
    await first.send(set_slots=pb.SetSlots(slots=0))
    assert (await first.recv_kind("slots_granted")).slots == 0
    for lease in leases[1]:
        await first.send(complete=pb.Complete(lease=lease.lease))
    await no_message(first)
    snapshot = await admin.Snapshot(pb.SnapshotRequest())
    assert next(p for p in snapshot.pools if p.name == "capacity").capacity == 2
    for task_id in ids[:4]:
        assert (await result(tasks, task_id)).status == pb.TASK_STATUS_SUCCEEDED
    for w in (first, second, third):
        await w.close()
    await channel.close()


# ---------------------------------------------------------------- 3. Heartbeats and lease expiry


async def test_rule3_heartbeats_keep_a_lease_and_without_them_it_expires(server):
    channel, tasks, _ = stubs(server.target)
    worker = RawWorker(server.target)
    registered = await worker.register("ttl", slots=1)
    assert registered.lease_ttl_s == 1.0
    task_id = await submit(tasks, "ttl")
    lease = await worker.recv_kind("lease")
    for _ in range(8):                       # 2 s of heartbeats every 0.25 s: twice the TTL
        await worker.send(heartbeat=pb.Heartbeat(lease=lease.lease))
        await asyncio.sleep(0.25)
    assert (await info(tasks, task_id)).status == pb.TASK_STATUS_RUNNING
    # No more heartbeats: the lease expires, the worker is told, the attempt is retried.
    abort = await worker.recv_kind("abort", timeout=30)
    assert abort.lease == lease.lease and abort.code == pb.ABORT_REASON_LEASE_EXPIRED
    assert "no heartbeat for 1 s" in abort.reason
    # The worker said nothing for the whole TTL: it is suspect, so the retry waits
    # for another worker, or for a word from this one (any message: here a
    # heartbeat of the lease it lost, which is otherwise ignored).
    await no_message(worker)
    await worker.send(heartbeat=pb.Heartbeat(lease=lease.lease))
    retry = await worker.recv_kind("lease", timeout=30)
    assert (retry.task_id, retry.attempt) == (task_id, 2)
    await worker.send(complete=pb.Complete(lease=retry.lease, output=b"second"))
    done = await result(tasks, task_id)
    assert done.status == pb.TASK_STATUS_SUCCEEDED and done.output == b"second"
    await worker.close()
    await channel.close()


# ---------------------------------------------------------------- 4. One outcome; others ignored


async def test_rule4_one_outcome_per_lease_and_reports_for_leases_not_held_are_ignored(server):
    channel, tasks, _ = stubs(server.target)
    worker = RawWorker(server.target)
    await worker.register("report", slots=1)
    first = await submit(tasks, "report")
    lease = await worker.recv_kind("lease")
    await worker.send(complete=pb.Complete(lease=lease.lease, output=b"one", content_type="text/plain"))
    # A second outcome for the same lease, and reports for leases never held: ignored.
    await worker.send(fail=pb.Fail(lease=lease.lease, message="late", permanent=True))
    await worker.send(complete=pb.Complete(lease=123456789, output=b"nobody's"))
    await worker.send(heartbeat=pb.Heartbeat(lease=987654321))
    await worker.send(nack=pb.Nack(lease=555))
    await worker.send(cancelled=pb.Cancelled(lease=556))
    done = await result(tasks, first)
    assert (done.status, done.output, done.content_type) == (pb.TASK_STATUS_SUCCEEDED, b"one", "text/plain")
    # The stream still works: the next task comes and a failure counts.
    second = await submit(tasks, "report", retry=pb.RetryPolicy(max_attempts=1))
    lease = await worker.recv_kind("lease")
    await worker.send(fail=pb.Fail(lease=lease.lease, message="bad\x00input " + "x" * 9000, permanent=True))
    failed = await result(tasks, second)
    assert failed.status == pb.TASK_STATUS_FAILED
    assert failed.message.startswith("bad\ufffdinput") and len(failed.message) <= 8192   # sanitized
    await worker.close()
    await channel.close()


# ---------------------------------------------------------------- 5. Nack


async def test_rule5_nack_offers_the_lease_to_another_worker_without_using_an_attempt(server):
    channel, tasks, _ = stubs(server.target)
    first = RawWorker(server.target)
    await first.register("nack", slots=1, name="first")
    second = RawWorker(server.target)
    await second.register("nack", slots=1, name="second")
    task_id = await submit(tasks, "nack")
    got = None
    for w in (first, second):
        try:
            got = (w, await w.recv_kind("lease", timeout=2))
            break
        except asyncio.TimeoutError:
            continue
    assert got is not None
    holder, lease = got
    other = second if holder is first else first
    await holder.send(nack=pb.Nack(lease=lease.lease, reason="busy here"))
    moved = await other.recv_kind("lease")
    assert (moved.lease, moved.task_id, moved.attempt) == (lease.lease, task_id, 1)
    # Nobody else has a free slot: a nack fails the attempt as retryable.
    await other.send(nack=pb.Nack(lease=moved.lease, reason="busy too"))
    retried = None
    for w in (holder, other):
        try:
            retried = await w.recv_kind("lease", timeout=2)
            worker = w
            break
        except asyncio.TimeoutError:
            continue
    assert retried is not None and (retried.task_id, retried.attempt) == (task_id, 2)
    await worker.send(complete=pb.Complete(lease=retried.lease))
    assert (await result(tasks, task_id)).status == pb.TASK_STATUS_SUCCEEDED
    for w in (first, second):
        await w.close()
    await channel.close()


# ---------------------------------------------------------------- 6. Abort


async def test_rule6_abort_frees_the_slot_and_a_later_cancelled_is_ignored(server):
    channel, tasks, _ = stubs(server.target)
    worker = RawWorker(server.target)
    await worker.register("abort", slots=1)
    running = await submit(tasks, "abort")
    waiting = await submit(tasks, "abort")
    lease = await worker.recv_kind("lease")
    assert lease.task_id == running
    assert (await tasks.Cancel(pb.CancelRequest(task=pb.TaskRef(id=running)))).cancelled
    abort = await worker.recv_kind("abort")
    assert abort.lease == lease.lease and abort.reason == "the task was cancelled"
    assert abort.code == pb.ABORT_REASON_CANCELLED
    nxt = await worker.recv_kind("lease")     # the slot was free at once
    assert nxt.task_id == waiting
    await worker.send(cancelled=pb.Cancelled(lease=lease.lease))   # allowed, ignored
    await worker.send(complete=pb.Complete(lease=nxt.lease, output=b"fine"))
    assert (await result(tasks, running)).status == pb.TASK_STATUS_CANCELLED
    assert (await result(tasks, waiting)).output == b"fine"
    # Cancelled for a lease it holds ends the task as cancelled.
    third = await submit(tasks, "abort")
    lease = await worker.recv_kind("lease")
    await worker.send(cancelled=pb.Cancelled(lease=lease.lease, message="not wanted"))
    done = await result(tasks, third)
    assert done.status == pb.TASK_STATUS_CANCELLED and done.message == "not wanted"
    await worker.close()
    await channel.close()


# ---------------------------------------------------------------- 8. Disconnects


async def test_rule8_a_disconnect_fails_running_leases_as_retryable(server):
    channel, tasks, _ = stubs(server.target)
    worker = RawWorker(server.target)
    await worker.register("drop", slots=2)
    ids = [await submit(tasks, "drop") for _ in range(2)]
    for _ in ids:
        await worker.recv_kind("lease")
    await worker.close()                      # the stream goes away with both leases
    again = RawWorker(server.target)
    await again.register("drop", slots=2)
    seen = {}
    for _ in ids:
        lease = await again.recv_kind("lease")
        seen[lease.task_id] = lease.attempt
        await again.send(complete=pb.Complete(lease=lease.lease))
    assert seen == {ids[0]: 2, ids[1]: 2}
    for task_id in ids:
        assert (await result(tasks, task_id)).status == pb.TASK_STATUS_SUCCEEDED
    await again.close()
    await channel.close()


# ---------------------------------------------------------------- 13. Draining


async def test_rule13_a_drained_worker_reports_what_it_holds_then_half_closes_and_the_stream_ends_ok(server):
    channel, tasks, _ = stubs(server.target)
    worker = RawWorker(server.target)
    await worker.register("drain", slots=2)
    ids = [await submit(tasks, "drain") for _ in range(3)]
    leases = [await worker.recv_kind("lease") for _ in range(2)]
    await worker.send(set_slots=pb.SetSlots(slots=0))
    assert (await worker.recv_kind("slots_granted")).slots == 0
    # Its leases are still its to report (a heartbeat, a Complete); the third task gets no lease here.
    await worker.send(heartbeat=pb.Heartbeat(lease=leases[0].lease))
    await worker.send(complete=pb.Complete(lease=leases[0].lease, output=b"drained"))
    done = await result(tasks, leases[0].task_id)
    assert (done.status, done.output) == (pb.TASK_STATUS_SUCCEEDED, b"drained")
    await no_message(worker)
    # Half-closing with a lease still held ends the stream with OK; that lease fails as retryable.
    await worker.call.done_writing()
    messages, code, _ = await worker.finish()
    assert messages == [] and code == grpc.StatusCode.OK
    other = RawWorker(server.target)
    await other.register("drain", slots=2)
    seen = {}
    for _ in range(2):
        lease = await other.recv_kind("lease")
        seen[lease.task_id] = lease.attempt
        await other.send(complete=pb.Complete(lease=lease.lease))
    assert seen == {leases[1].task_id: 2, next(i for i in ids if i not in {m.task_id for m in leases}): 1}
    for w in (worker, other):
        await w.close()
    await channel.close()


# ---------------------------------------------------------------- 10. Message limits


async def test_rule10_messages_are_limited_to_max_message_bytes(server):
    channel, tasks, _ = stubs(server.target)
    worker = RawWorker(server.target)
    registered = await worker.register("size", slots=1)
    assert registered.max_message_bytes == 65536
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await submit(tasks, "size", payload=b"p" * 70_000)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    task_id = await submit(tasks, "size", retry=pb.RetryPolicy(max_attempts=1))
    lease = await worker.recv_kind("lease")
    await worker.send(complete=pb.Complete(lease=lease.lease, output=b"o" * 70_000))
    _, code, _ = await worker.finish()
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    done = await result(tasks, task_id)
    assert done.status == pb.TASK_STATUS_DEAD_LETTERED and "worker disconnected" in done.message
    await worker.close()
    await channel.close()


# ---------------------------------------------------------------- batches and labels


async def test_batches_go_only_to_workers_that_accept_them_and_may_not_nest(server):
    channel, tasks, _ = stubs(server.target)
    plain = RawWorker(server.target)
    await plain.register("batch", slots=4, batches=False)
    ids = [(await tasks.SubmitBatch(pb.SubmitBatchRequest(tasks=[pb.TaskSpec(pool="batch")] * 4))).tasks]
    leases = [await plain.recv_kind("lease") for _ in range(4)]   # one message each, never a batch
    assert sorted(m.task_id for m in leases) == sorted(t.id for t in ids[0])
    # A worker may always send a batch; it counts as its messages one by one.
    await plain.send(batch=pb.WorkerBatch(messages=[pb.WorkerMessage(complete=pb.Complete(lease=m.lease))
                                                    for m in leases]))
    for t in ids[0]:
        assert (await result(tasks, t.id)).status == pb.TASK_STATUS_SUCCEEDED
    await plain.send(batch=pb.WorkerBatch(messages=[pb.WorkerMessage(
        register=pb.Register(pool="batch", slots=1, protocol_version=3))]))
    _, code, details = await plain.finish()
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "batch may not hold a register" in details

    batching = RawWorker(server.target)
    await batching.register("batch", slots=4, batches=True)
    await tasks.SubmitBatch(pb.SubmitBatchRequest(tasks=[pb.TaskSpec(pool="batch")] * 4))
    received = []
    while len(received) < 4:
        message = await batching.recv()
        assert message is not None
        if message.WhichOneof("msg") == "batch":
            received += [m.lease for m in message.batch.messages]
        else:
            received.append(message.lease)
    assert len({m.lease for m in received}) == 4
    for w in (plain, batching):
        await w.close()
    await channel.close()


async def messages_until(worker: RawWorker, kind: str) -> list[pb.ServerMessage]:
    """The server's messages (batches unpacked) up to and including the first of ``kind``."""
    got: list[pb.ServerMessage] = []
    while not got or got[-1].WhichOneof("msg") != kind:
        message = await worker.recv()
        assert message is not None
        got += list(message.batch.messages) if message.WhichOneof("msg") == "batch" else [message]
    return got


async def test_the_leases_a_batch_frees_and_its_answers_go_out_once_each_in_order(server):
    # Completes and a SetSlots in one batch: the leases they free and the answer go out
    # once each, in the order the server made them.
    channel, tasks, _ = stubs(server.target)
    worker = RawWorker(server.target)
    await worker.register("flush", slots=4, batches=True)
    ids = [t.id for t in (await tasks.SubmitBatch(pb.SubmitBatchRequest(tasks=[pb.TaskSpec(pool="flush")] * 12))).tasks]
    held = [m.lease for m in await messages_until(worker, "lease")]
    while len(held) < 4:
        held += [m.lease for m in await messages_until(worker, "lease")]
    assert len(held) == 4
    seen = {lease.task_id for lease in held}
    for slots in (2, 2, 2):
        await worker.send(batch=pb.WorkerBatch(
            messages=[pb.WorkerMessage(complete=pb.Complete(lease=lease.lease)) for lease in held]
            + [pb.WorkerMessage(set_slots=pb.SetSlots(slots=slots))]))
        got = await messages_until(worker, "slots_granted")
        assert [m.WhichOneof("msg") for m in got] == ["lease"] * (len(got) - 1) + ["slots_granted"]
        assert got[-1].slots_granted.slots == slots
        held = [m.lease for m in got[:-1]]
        # The completes freed their slots before SetSlots took effect: first four, then two.
        assert len(held) == (4 if not seen - set(ids[:4]) else 2)
        assert not {lease.task_id for lease in held} & seen
        seen |= {lease.task_id for lease in held}
    await worker.send(batch=pb.WorkerBatch(
        messages=[pb.WorkerMessage(complete=pb.Complete(lease=lease.lease)) for lease in held]))
    assert seen == set(ids)
    for task_id in ids:
        assert (await result(tasks, task_id)).status == pb.TASK_STATUS_SUCCEEDED
    await no_message(worker, 0.2)
    await worker.close()
    await channel.close()


async def test_labels_make_worker_groups_and_labelled_tasks_wait_for_their_group(server):
    channel, tasks, admin = stubs(server.target)
    plain = RawWorker(server.target)
    await plain.register("labels", slots=1)
    gpu = RawWorker(server.target)
    await gpu.register("labels", slots=1, labels={"gpu": "a100"})
    snapshot = await admin.Snapshot(pb.SnapshotRequest())
    groups = {tuple(sorted(g.labels.items())): g.capacity
              for g in next(p for p in snapshot.pools if p.name == "labels").groups}
    assert groups == {(): 1, (("gpu", "a100"),): 1}
    task_id = await submit(tasks, "labels", labels={"gpu": "a100"})
    lease = await gpu.recv_kind("lease")
    assert lease.task_id == task_id and dict(lease.labels) == {"gpu": "a100"}
    await no_message(plain)
    await gpu.send(complete=pb.Complete(lease=lease.lease))
    assert (await result(tasks, task_id)).status == pb.TASK_STATUS_SUCCEEDED
    for w in (plain, gpu):
        await w.close()
    await channel.close()


# ---------------------------------------------------------------- 7. A worker that stops reading


async def test_rule7_a_worker_that_stops_reading_is_disconnected_and_its_leases_go_elsewhere(servers):
    server = servers(LISTEN + """
[[pools]]
name = "default"
lease_ttl_s = 0.3
retry = { max_attempts = 100, initial_backoff_s = 0.01, jitter = false }
""")
    channel, tasks, admin = stubs(server.target)
    stalled = RawWorker(server.target)
    # Registers, then never reads again (but still speaks, so it is not merely
    # silent: see test_server_worker_health.py): its transport buffers the first
    # leases, then the server's writes stall, its queue fills, and it is disconnected.
    await stalled.send(register=pb.Register(pool="default", slots=1, protocol_version=3, worker_name="stalled"))

    async def speak() -> None:
        while True:
            await stalled.send(heartbeat=pb.Heartbeat(lease=2**64 - 1))   # a lease it does not hold: ignored
            await asyncio.sleep(0.05)

    speaking = asyncio.get_running_loop().create_task(speak())
    payload = b"x" * (2 * 1024 * 1024)
    ids = [await submit(tasks, "default", payload=payload) for _ in range(3)]
    await asyncio.to_thread(server.wait_for, "does not read its stream", timeout=60)   # (the loop speaks on)
    speaking.cancel()
    reader = RawWorker(server.target)
    await reader.register("default", slots=3)
    done = set()
    while len(done) < len(ids):
        message = await reader.recv()
        assert message is not None
        if message.WhichOneof("msg") == "lease":
            await reader.send(complete=pb.Complete(lease=message.lease.lease))
            done.add(message.lease.task_id)
    assert done == set(ids)
    workers = await admin.ListWorkers(pb.ListWorkersRequest())
    assert [w.name for w in workers.workers] == ["raw"]   # the stalled one is gone
    _, code, details = await stalled.finish()
    assert code != grpc.StatusCode.OK
    for w in (stalled, reader):
        await w.close()
    await channel.close()


# ---------------------------------------------------------------- 9. Shutdown


async def test_rule9_sigterm_lets_running_leases_finish_then_sends_shutdown_and_exits_0(servers):
    import signal
    server = servers(LISTEN.replace("shutdown_grace_s = 2", "shutdown_grace_s = 3"))
    channel, tasks, _ = stubs(server.target)
    worker = RawWorker(server.target)
    await worker.register("default", slots=2)
    finishing = await submit(tasks, "default")
    hanging = await submit(tasks, "default")
    leases = {}
    for _ in range(2):
        lease = await worker.recv_kind("lease")
        leases[lease.task_id] = lease
    server.signal(signal.SIGTERM)
    server.wait_for("stopping: running attempts have 3 s")
    # New calls are refused while it drains; the worker's reports still count.
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await submit(tasks, "default")
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    await worker.send(complete=pb.Complete(lease=leases[finishing].lease, output=b"made it"))
    # After the grace: the lease still running is given up, then the worker is told to go.
    abort = await worker.recv_kind("abort", timeout=30)
    assert abort.lease == leases[hanging].lease and abort.code == pb.ABORT_REASON_SHUTDOWN
    shutdown = await worker.recv_kind("shutdown", timeout=30)
    assert shutdown.not_leader is False and shutdown.reason
    messages, code, _ = await worker.finish()
    assert messages == [] and code == grpc.StatusCode.OK        # the stream ends about a second later
    assert server.wait(30) == 0
    assert "stopped" in server.log
    await worker.close()
    await channel.close()
