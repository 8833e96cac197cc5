"""Checkpointed stages through cronoq-server: leases carry the checkpoints
of earlier attempts, workers send checkpoints on their stream (answered once
stored), behind the accept_checkpoints capability, so protocol 3 workers
without it see nothing new and keep working."""

from __future__ import annotations

import asyncio

import grpc
import pytest

import cronoq
from cronoq._proto import cronoq_pb2 as pb
from cronoq.client import Client, Worker
from serverkit import LISTEN, RawWorker, sqlite_store, stubs

pytestmark = pytest.mark.asyncio

STAGES = ["chunk", "embed", "index"]


def config(path) -> str:
    return LISTEN + sqlite_store(path) + """
[[pools]]
name = "default"
retry = { max_attempts = 3, initial_backoff_s = 0.05, jitter = false }
[[pools]]
name = "raw"
retry = { max_attempts = 3, initial_backoff_s = 0.05, jitter = false }
[[pools]]
name = "old"
retry = { max_attempts = 3, initial_backoff_s = 0.05, jitter = false }
"""


@pytest.fixture(scope="module")
def server(module_servers, tmp_path_factory):
    return module_servers(config(tmp_path_factory.mktemp("ckpt") / "server.db"), name="checkpoints")


async def test_a_remote_retry_runs_only_the_failed_stage(server):
    ran: list[tuple[int, str]] = []
    resumed: list[str | None] = []

    async def pipeline(lease):
        resumed.append(lease.resumed_from)
        for stage in STAGES:
            if stage in lease.checkpoints:
                continue
            ran.append((lease.attempt, stage))
            if stage == "index" and lease.attempt == 1:
                raise RuntimeError("index failed")
            saved = await lease.checkpoint(stage, {"stage": stage, "attempt": lease.attempt})
            assert saved.stage == stage
        return lease.completed_stages

    worker = Worker(server.target, "default", pipeline, slots=1, initial_backoff=0.05)
    running = asyncio.create_task(worker.run())
    try:
        async with Client(server.target) as client:
            events = []

            async def watch():
                async for event in client.watch(pools=["default"]):
                    events.append(event)
                    if event.status == "succeeded":
                        return

            watching = asyncio.create_task(watch())
            await asyncio.sleep(0.2)   # the watch is open before the task is submitted
            sub = await client.submit({"doc": 1}, stages=STAGES, wait=True, wait_timeout=30)
            assert sub.result.ok and sub.result.json() == STAGES
            info = await client.get(sub.id)
            await asyncio.wait_for(watching, 30)
    finally:
        worker.stop()
        await asyncio.wait_for(running, 30)
    assert ran == [(1, "chunk"), (1, "embed"), (1, "index"), (2, "index")]
    assert resumed == [None, "embed"]
    assert info.stages == STAGES
    assert [(c.stage, c.attempt, c.data) for c in info.checkpoints] == [
        ("chunk", 1, {"stage": "chunk", "attempt": 1}), ("embed", 1, {"stage": "embed", "attempt": 1}),
        ("index", 2, {"stage": "index", "attempt": 2})]
    assert [(e.stage, e.attempt) for e in events if e.stage] == [("chunk", 1), ("embed", 1), ("index", 2)]


async def test_a_checkpoint_is_answered_once_stored_and_refusals_say_why(server):
    channel, tasks, _ = stubs(server.target)
    worker = RawWorker(server.target)
    try:
        await worker.send(register=pb.Register(pool="raw", slots=1, worker_name="raw", protocol_version=3,
                                               accept_checkpoints=True))
        registered = await worker.recv_kind("registered")
        assert registered.checkpoints
        task_id = (await tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(
            payload=b"x", pool="raw", stages=STAGES)))).id
        lease = await worker.recv_kind("lease")
        assert list(lease.stages) == STAGES and list(lease.checkpoints) == []
        await worker.send(checkpoint=pb.Checkpoint(lease=lease.lease, stage="chunk", data=b"c1",
                                                   content_type="text/plain", seq=1))
        saved = await worker.recv_kind("checkpoint_saved")
        assert (saved.lease, saved.stage, saved.seq, saved.error) == (lease.lease, "chunk", 1, "")
        await worker.send(checkpoint=pb.Checkpoint(lease=lease.lease, stage="rerank", data=b"x", seq=2))
        refused = await worker.recv_kind("checkpoint_saved")
        assert refused.seq == 2 and "stage 'rerank' is not one of the stages" in refused.error
        await worker.send(checkpoint=pb.Checkpoint(lease=999_999, stage="chunk", data=b"x", seq=3))
        unknown = await worker.recv_kind("checkpoint_saved")
        assert unknown.seq == 3 and "does not hold this lease" in unknown.error
        await worker.send(fail=pb.Fail(lease=lease.lease, message="once"))
        again = await worker.recv_kind("lease")
        assert again.attempt == 2
        assert [(c.stage, c.data, c.content_type, c.attempt) for c in again.checkpoints] == [
            ("chunk", b"c1", "text/plain", 1)]
        assert again.checkpoints[0].saved_unix_ns > 0
        await worker.send(complete=pb.Complete(lease=again.lease, output=b"ok"))
        done = await tasks.Wait(pb.WaitRequest(task=pb.TaskRef(id=task_id), timeout_s=30))
        assert done.output == b"ok"
        got = await tasks.Get(pb.GetRequest(task=pb.TaskRef(id=task_id)))
        assert list(got.stages) == STAGES and [c.stage for c in got.checkpoints] == ["chunk"]
    finally:
        await worker.close()
        await channel.close()


async def test_a_protocol_3_worker_without_the_capability_sees_no_change(server):
    channel, tasks, _ = stubs(server.target)
    worker = RawWorker(server.target)
    try:
        registered = await worker.register(pool="old")
        assert not registered.checkpoints
        await tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(payload=b"x", pool="old", stages=STAGES)))
        lease = await worker.recv_kind("lease")
        assert not lease.stages and not lease.checkpoints   # nothing it did not ask for
        # Sending a Checkpoint without the capability is a protocol violation.
        await worker.send(checkpoint=pb.Checkpoint(lease=lease.lease, stage="chunk", data=b"x", seq=1))
        _, code, details = await worker.finish()
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "accept_checkpoints" in details
    finally:
        await worker.close()
        await channel.close()


async def test_invalid_declared_stages_are_refused_at_submission(server):
    async with Client(server.target) as client:
        with pytest.raises(cronoq.InvalidTask) as caught:
            await client.submit(None, stages=["a", "a"])
        assert "names 'a' twice" in str(caught.value)


async def test_a_plain_handler_checkpoints_from_its_thread(server):
    ran: list[tuple[int, str]] = []

    def pipeline(lease):   # a plain function: the worker runs it on a thread
        for stage in STAGES:
            if stage in lease.checkpoints:
                continue
            ran.append((lease.attempt, stage))
            if stage == "embed" and lease.attempt == 1:
                raise RuntimeError("embed failed")
            lease.checkpoint_from_thread(stage, stage.encode())   # bytes go as they are
        return {"resumed_from": lease.resumed_from, "chunk": lease.checkpoints["chunk"].decode()}

    worker = Worker(server.target, "raw", pipeline, slots=1, initial_backoff=0.05)
    running = asyncio.create_task(worker.run())
    try:
        async with Client(server.target) as client:
            sub = await client.submit(None, pool="raw", stages=STAGES, wait=True, wait_timeout=30)
    finally:
        worker.stop()
        await asyncio.wait_for(running, 30)
    assert sub.result.json() == {"resumed_from": "chunk", "chunk": "chunk"}
    assert ran == [(1, "chunk"), (1, "embed"), (2, "embed"), (2, "index")]


@pytest.fixture(scope="module")
def memory_server(module_servers):
    return module_servers(LISTEN + """
[[pools]]
name = "default"
retry = { max_attempts = 3, initial_backoff_s = 0.05, jitter = false }
""", name="checkpoints-memory")


async def test_a_server_without_a_store_keeps_checkpoints_in_memory(memory_server):
    """(Its scheduler once had no codec for Blobs without a store: every
    checkpoint was refused as not encodable.)"""
    ran: list[tuple[int, str]] = []

    async def pipeline(lease):
        for stage in STAGES:
            if stage in lease.checkpoints:
                continue
            ran.append((lease.attempt, stage))
            if stage == "index" and lease.attempt == 1:
                raise RuntimeError("index failed")
            await lease.checkpoint(stage, stage)
        return lease.resumed_from

    worker = Worker(memory_server.target, "default", pipeline, slots=1, initial_backoff=0.05)
    running = asyncio.create_task(worker.run())
    try:
        async with Client(memory_server.target) as client:
            sub = await client.submit(None, stages=STAGES, wait=True, wait_timeout=30)
            info = await client.get(sub.id)
    finally:
        worker.stop()
        await asyncio.wait_for(running, 30)
    assert sub.result.text() == "embed"
    assert ran == [(1, "chunk"), (1, "embed"), (1, "index"), (2, "index")]
    assert [(c.stage, c.data) for c in info.checkpoints] == [(s, s) for s in STAGES]


async def test_the_http_api_takes_stages_and_shows_checkpoints(server):
    import httpx

    async def pipeline(lease):
        for stage in lease.stages or ():
            if stage in lease.checkpoints:
                continue
            if stage == "index" and lease.attempt == 1:
                raise RuntimeError("index failed")
            data = "plain words" if stage == "embed" else {"stage": stage}
            await lease.checkpoint(stage, data)
        return lease.completed_stages

    worker = Worker(server.target, "default", pipeline, slots=1, initial_backoff=0.05)
    running = asyncio.create_task(worker.run())
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}", timeout=60) as http:
            refused = await http.post("/v1/tasks", json={"stages": ["chunk", ""]})
            assert refused.status_code == 400 and "stages" in refused.text
            answer = await http.post("/v1/tasks", json={"stages": STAGES, "key": "http/staged", "wait": True,
                                                         "wait_timeout_s": 30})
            assert answer.status_code == 200, answer.text
            assert answer.json()["result"]["output"] == STAGES
            info = (await http.get(f"/v1/tasks/{answer.json()['id']}")).json()
    finally:
        worker.stop()
        await asyncio.wait_for(running, 30)
    assert info["stages"] == STAGES
    checkpoints = info["checkpoints"]
    assert [(c["stage"], c["attempt"]) for c in checkpoints] == [("chunk", 1), ("embed", 1), ("index", 2)]
    assert checkpoints[0]["data"] == {"stage": "chunk"}
    assert checkpoints[1]["data_text"] == "plain words" and "data" not in checkpoints[1]
    assert all(int(c["saved_unix_ns"]) > 0 and c["data_b64"] for c in checkpoints)


async def test_a_worker_that_pipelines_checkpoints_is_read_no_faster_than_they_are_stored(server):
    # 2,000 checkpoints of 64 KiB sent without waiting (in batches), the answers read
    # as they come: the server reads on only as saves finish, so its memory stays
    # bounded and its answers never pile up past the worker's queue bound.
    channel, tasks, _ = stubs(server.target)
    worker = RawWorker(server.target)
    try:
        await worker.send(register=pb.Register(pool="raw", slots=1, worker_name="eager", protocol_version=3,
                                               accept_checkpoints=True, accept_batches=True))
        await worker.recv_kind("registered")
        task_id = (await tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(payload=b"x", pool="raw",
                                                                        stages=STAGES)))).id
        lease = await worker.recv_kind("lease")
        data = b"d" * 65536
        total = 2000

        async def send_all() -> None:
            for first in range(0, total, 100):
                await worker.send(batch=pb.WorkerBatch(messages=[
                    pb.WorkerMessage(checkpoint=pb.Checkpoint(lease=lease.lease, stage="chunk", data=data, seq=seq))
                    for seq in range(first, first + 100)]))

        sending = asyncio.get_running_loop().create_task(send_all())
        answered: list[pb.CheckpointSaved] = []
        while len(answered) < total:
            message = await worker.recv(timeout=60)
            assert message is not None, f"the stream ended after {len(answered)} answers: {await worker.status()}"
            answered += ([m.checkpoint_saved for m in message.batch.messages] if message.WhichOneof("msg") == "batch"
                         else [message.checkpoint_saved])
        await sending
        assert sorted(a.seq for a in answered) == list(range(total)) and not any(a.error for a in answered)
        await worker.send(complete=pb.Complete(lease=lease.lease, output=b"ok"))
        done = await tasks.Wait(pb.WaitRequest(task=pb.TaskRef(id=task_id), timeout_s=30))
        assert done.status == pb.TASK_STATUS_SUCCEEDED
    finally:
        await worker.close()
        await channel.close()
