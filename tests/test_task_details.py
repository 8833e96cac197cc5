"""What a task's lookup shows beyond its status, against a real
cronoq-server process and worker processes (tests/dashkit.py DashWorker):
the payload preview (outputs.payload_preview_bytes), the traceback a worker
sends with a failure (over gRPC and HTTP), and the result's max_bytes."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest

import cronoq

from cronoq._proto import cronoq_pb2 as pb
from dashkit import DashWorker, api, capacity, wait_until
from serverkit import ADMIN, AUTH, CLIENT, LISTEN, WORKER, bearer, stubs

POOLS = """
[[pools]]
name = "default"
[[pools]]
name = "idle"
[[pools]]
name = "threaded"
"""
CONFIG = LISTEN + AUTH + """
[outputs]
payload_preview_bytes = 64
""" + POOLS


def finished(http, task_id: str) -> dict:
    answer = http.get(f"/v1/tasks/{task_id}/result", params={"timeout_s": 30})
    assert answer.status_code == 200, answer.text
    return answer.json()


@pytest.fixture(scope="module")
def server(module_servers):
    server = module_servers(CONFIG, name="details")
    worker = DashWorker(server.target)
    with api(server, ADMIN) as http:
        wait_until(lambda: capacity(http) == 1, what="the worker connecting")
    yield server
    worker.stop()


def test_a_json_payload_is_shown_as_text_and_kept_after_the_task_ended(server):
    with api(server, ADMIN) as http:
        task_id = http.post("/v1/tasks", json={"payload": {"sleep": 0}}).json()["id"]
        assert finished(http, task_id)["status"] == "succeeded"
        task = http.get(f"/v1/tasks/{task_id}").json()
    assert json.loads(task["payload_text"]) == {"sleep": 0}
    assert task["payload_content_type"] == "application/json"
    assert task["payload_size"] == len(task["payload_text"].encode()) and task["payload_truncated"] is False
    assert "payload_b64" not in task


def test_a_long_text_payload_is_cut_at_the_configured_bytes(server):
    text = "é" + "abcdefgh" * 20   # 162 bytes; 64 bytes cut none of its characters in two
    with api(server, CLIENT) as http:
        task_id = http.post("/v1/tasks", json={"payload_text": text, "pool": "idle"}).json()["id"]
        task = http.get(f"/v1/tasks/{task_id}").json()
        listed = http.get("/v1/tasks", params={"pool": "idle"}).json()["tasks"]
    assert task["payload_text"] == text.encode()[:64].decode()
    assert task["payload_size"] == len(text.encode()) and task["payload_truncated"] is True
    assert task["payload_content_type"].startswith("text/plain")
    # A listing carries no previews.
    assert [t for t in listed if t["id"] == task_id] and all("payload_size" not in t for t in listed)


def test_a_text_cut_inside_a_character_drops_the_half(server):
    text = "a" + "é" * 40   # the 64th byte is the first half of an é
    with api(server, CLIENT) as http:
        task_id = http.post("/v1/tasks", json={"payload_text": text, "pool": "idle"}).json()["id"]
        task = http.get(f"/v1/tasks/{task_id}").json()
    assert task["payload_text"] == "a" + "é" * 31 and task["payload_truncated"] is True


def test_a_binary_payload_is_given_as_base64(server):
    data = bytes(range(256))
    with api(server, CLIENT) as http:
        task_id = http.post("/v1/tasks", json={"payload_b64": base64.b64encode(data).decode(),
                                               "pool": "idle"}).json()["id"]
        task = http.get(f"/v1/tasks/{task_id}").json()
    assert base64.b64decode(task["payload_b64"]) == data[:64]
    assert task["payload_size"] == 256 and task["payload_truncated"] is True
    assert task["payload_content_type"] == "application/octet-stream" and "payload_text" not in task


def test_the_preview_is_over_grpc_too(server):
    async def get(task_id: int) -> pb.TaskInfo:
        channel, tasks, _ = stubs(server.target)
        try:
            return await tasks.Get(pb.GetRequest(task=pb.TaskRef(id=task_id)), metadata=bearer(CLIENT))
        finally:
            await channel.close()

    with api(server, CLIENT) as http:
        task_id = http.post("/v1/tasks", json={"payload_text": "z" * 100, "pool": "idle"}).json()["id"]
    info = asyncio.run(get(int(task_id)))
    assert info.payload_preview == b"z" * 64 and info.payload_size == 100
    assert info.content_type.startswith("text/plain")


def test_a_cap_of_zero_keeps_no_preview(servers):
    server = servers(LISTEN + AUTH + "[outputs]\npayload_preview_bytes = 0\n" + POOLS, name="no-preview")
    with api(server, CLIENT) as http:
        task_id = http.post("/v1/tasks", json={"payload": {"a": 1}, "pool": "idle"}).json()["id"]
        task = http.get(f"/v1/tasks/{task_id}").json()
    assert not {"payload_text", "payload_b64", "payload_size", "payload_truncated", "payload_content_type"} & set(task)


def test_a_failing_handlers_traceback_reaches_get_over_http_and_grpc(server):
    with api(server, ADMIN) as http:
        task_id = http.post("/v1/tasks", json={"payload": {"raise": "the disk is full"},
                                               "retry": {"max_attempts": 2, "initial_backoff_s": 0.01}}).json()["id"]
        result = finished(http, task_id)
        task = http.get(f"/v1/tasks/{task_id}").json()
    assert result["status"] == "dead_lettered" and "the disk is full" in result["message"]
    attempts = task["attempts"]
    assert [a["status"] for a in attempts] == ["retrying", "dead_lettered"]
    for attempt in attempts:
        lines = attempt["traceback"].splitlines()
        assert lines[0] == "Traceback (most recent call last):"
        assert lines[-1] == "ValueError: the disk is full"
        # From the handler's frame on: none of the worker's own.
        frames = [line.strip() for line in lines if line.strip().startswith("File ")]
        assert [frame.rsplit(" in ", 1)[1] for frame in frames] == ["handle", "explode"]

    async def get() -> pb.TaskInfo:
        channel, tasks, _ = stubs(server.target)
        try:
            return await tasks.Get(pb.GetRequest(task=pb.TaskRef(id=int(task_id))), metadata=bearer(CLIENT))
        finally:
            await channel.close()

    info = asyncio.run(get())
    assert [a.traceback for a in info.attempts] == [a["traceback"] for a in attempts]


def test_a_retryable_raised_on_purpose_sends_its_traceback_too(server):
    with api(server, ADMIN) as http:
        task_id = http.post("/v1/tasks", json={"payload": {"fail": True},
                                               "retry": {"max_attempts": 1}}).json()["id"]
        finished(http, task_id)
        task = http.get(f"/v1/tasks/{task_id}").json()
    assert task["attempts"][-1]["traceback"].splitlines()[-1] == "cronoq.core.errors.Retryable: failed as asked"


def test_the_result_with_max_bytes_gives_the_first_bytes_and_the_size(server):
    with api(server, ADMIN) as http:
        task_id = http.post("/v1/tasks", json={"payload": {"output_size": 100_000}}).json()["id"]
        whole = finished(http, task_id)
        cut = http.get(f"/v1/tasks/{task_id}/result", params={"max_bytes": 1000}).json()
        roomy = http.get(f"/v1/tasks/{task_id}/result", params={"max_bytes": 200_000}).json()
        refused = http.get(f"/v1/tasks/{task_id}/result", params={"max_bytes": -1})
    assert whole["output_text"] == "x" * 100_000 and "output_truncated" not in whole
    assert cut["output_text"] == "x" * 1000 and "output_b64" not in cut
    assert cut["output_size"] == 100_000 and cut["output_truncated"] is True
    assert roomy["output_text"] == "x" * 100_000 and roomy["output_size"] == 100_000
    assert roomy["output_truncated"] is False
    assert refused.status_code == 400 and "max_bytes" in refused.json()["error"]


def test_a_plain_function_handlers_traceback_starts_at_the_handler(server):
    from cronoq.client import Client, Worker

    def parse(lease):   # a plain function: the worker runs it on a thread
        return int(lease.text())

    async def scenario() -> str:
        worker = Worker(server.target, "threaded", parse, token=WORKER, initial_backoff=0.05)
        running = asyncio.create_task(worker.run(handle_signals=False))
        try:
            async with Client(server.target, token=CLIENT) as client:
                task_id = (await client.submit("not a number", pool="threaded", retry=cronoq.RetryPolicy(max_attempts=1))).id
                await client.wait(task_id, timeout=30)
        finally:
            worker.stop()
            await running
        return task_id

    task_id = asyncio.run(scenario())
    with api(server, CLIENT) as http:
        lines = http.get(f"/v1/tasks/{task_id}").json()["attempts"][-1]["traceback"].splitlines()
    frames = [line.strip().rsplit(" in ", 1)[1] for line in lines if line.strip().startswith("File ")]
    assert frames == ["parse"]
    assert lines[-1] == "ValueError: invalid literal for int() with base 10: 'not a number'"


# ---------------------------------------------------------------- the info cache's tracebacks (no process)

def _meta(payload: bytes = b"", preview: int = 0):
    from cronoq.core.types import TaskSpec
    from cronoq.server.codec import Blob
    from cronoq.server.info import TaskMeta

    return TaskMeta(TaskSpec(Blob(payload, "text/plain")), "default", 3, 0, preview)


def test_a_traceback_sent_before_the_attempt_is_seen_waits_for_it():
    from cronoq.server.info import InfoCache

    cache = InfoCache(10)
    cache.put(1, _meta())
    cache.failed_with(1, 1, "Traceback: early")   # the Fail came before the running event
    cache.saw(1, "running", 10, 1)
    cache.saw(1, "retrying", 20, 1, "boom")
    cache.saw(1, "running", 30, 2)
    assert [entry[5] for entry in cache.get(1).attempts] == ["Traceback: early", ""]


def test_the_cache_keeps_a_bounded_number_of_tracebacks_each_cut_to_its_end():
    from cronoq.server.info import TRACEBACK_KEPT, InfoCache

    cache = InfoCache(10, tracebacks=2)
    for task_id in (1, 2, 3):
        cache.put(task_id, _meta())
        cache.saw(task_id, "running", 10, 1)
        cache.failed_with(task_id, 1, f"trace {task_id}" + "x" * TRACEBACK_KEPT)
    kept = [cache.get(task_id).attempts[0][5] for task_id in (1, 2, 3)]
    assert kept[0] == "" and all(len(text) == TRACEBACK_KEPT and text.startswith("\u2026") for text in kept[1:])


def test_the_preview_is_the_payloads_first_bytes():
    meta = _meta(b"abcdef", preview=4)
    assert (meta.payload_preview, meta.payload_size, meta.payload_type) == (b"abcd", 6, "text/plain")
    assert _meta(b"abcdef", preview=0).payload_preview is None
