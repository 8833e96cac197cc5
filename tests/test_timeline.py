"""GET /v1/timeline against a real cronoq-server process and real workers:
the attempts of the window with the worker that got each lease (and Get's
attempts too), a retried task's attempts, fixed starts drawn ahead before
they start (and the slots held for them), deadlines missed, and who may ask."""

from __future__ import annotations

import asyncio
import time

import pytest
import pytest_asyncio

import cronoq
from cronoq.client import Client, Worker
from httpkit import client, error_of, until
from serverkit import ADMIN, AUTH, CLIENT, LISTEN, METRICS, WORKER

pytestmark = pytest.mark.asyncio

SCOPED = "timeline-scoped-token-0123456789ab"

CONFIG = LISTEN + AUTH + f"""
[[auth.tokens]]
token = "{SCOPED}"
role = "client"
pools = ["fixed"]

[[pools]]
name = "default"
retry = {{ max_attempts = 3, initial_backoff_s = 0.05, jitter = false }}
[[pools]]
name = "fixed"
"""

NS = 1_000_000_000


async def handle(lease):
    data = lease.json()
    if isinstance(data, dict):
        if data.get("flaky") and lease.attempt == 1:
            raise cronoq.Retryable("the first attempt fails")
        if "sleep" in data:
            await asyncio.sleep(data["sleep"])
    return {"done": data}


@pytest.fixture(scope="module")
def server(module_servers):
    return module_servers(CONFIG, name="timeline")


@pytest_asyncio.fixture
async def workers(server):
    started = [Worker(server.target, "default", handle, slots=2, token=WORKER, name="lane-worker",
                      initial_backoff=0.05),
               Worker(server.target, "fixed", handle, slots=1, token=WORKER, name="fixed-worker",
                      initial_backoff=0.05)]
    tasks = [asyncio.create_task(w.run()) for w in started]
    async with client(server, CLIENT) as http:
        async def connected():
            return len((await http.get("/v1/timeline")).json()["workers"]) >= 2
        await until(connected, what="the workers connecting")
    yield started
    for w in started:
        w.stop()
    await asyncio.gather(*tasks, return_exceptions=True)


async def submit(http, body):
    r = await http.post("/v1/tasks", json=body)
    assert r.status_code == 200, r.text
    return r.json()


async def attempts_of(http, task_id, count, **params):
    """The task's attempts on the timeline, once ``count`` of them ended."""
    async def ended():
        answer = (await http.get("/v1/timeline", params=params)).json()
        mine = [a for a in answer["attempts"] if a["id"] == task_id]
        return (answer, mine) if len([a for a in mine if "ended_unix_ns" in a]) >= count else None
    return await until(ended, what=f"{count} ended attempts of task {task_id} on the timeline")


async def test_each_attempt_names_the_worker_that_got_its_lease(server, workers):
    async with client(server, CLIENT) as http:
        task = await submit(http, {"payload": {"n": 1}, "key": "timeline-plain", "kind": "plain",
                                   "wait": True})
        answer, [attempt] = await attempts_of(http, task["id"], 1)
        lanes = {w["name"]: w for w in answer["workers"]}
        assert lanes["lane-worker"]["pool"] == "default" and lanes["lane-worker"]["slots"] == 2
        assert attempt["worker_id"] == lanes["lane-worker"]["id"] and attempt["worker_name"] == "lane-worker"
        assert (attempt["key"], attempt["kind"], attempt["pool"], attempt["priority"], attempt["status"],
                attempt["attempt"], attempt["max_attempts"]) == (
            "timeline-plain", "plain", "default", "normal", "succeeded", 1, 3)
        assert int(attempt["ended_unix_ns"]) >= int(attempt["started_unix_ns"]) > 0
        assert attempt["missed_deadline"] is False and "deadline_unix_ns" not in attempt
        assert int(answer["at_unix_ns"]) >= int(attempt["ended_unix_ns"])
        assert answer["range_s"] == 300 and answer["ahead_s"] == 300 and answer["unavailable_shards"] == []
        info = (await http.get(f"/v1/tasks/{task['id']}")).json()
        assert [(a["worker_id"], a["worker_name"]) for a in info["attempts"]] == [
            (lanes["lane-worker"]["id"], "lane-worker")]
    async with Client(server.target, token=CLIENT) as grpc_client:
        got = await grpc_client.get(int(task["id"]))
        assert [(a.worker_id, a.worker_name) for a in got.attempts] == [(int(lanes["lane-worker"]["id"]),
                                                                          "lane-worker")]


async def test_a_retried_task_shows_both_attempts_in_order(server, workers):
    async with client(server, CLIENT) as http:
        task = await submit(http, {"payload": {"flaky": True}, "wait": True})
        assert task["result"]["status"] == "succeeded"
        _, mine = await attempts_of(http, task["id"], 2)
        assert [(a["attempt"], a["status"], a["worker_name"]) for a in mine] == [
            (1, "retrying", "lane-worker"), (2, "succeeded", "lane-worker")]
        assert mine[0]["message"] == "the first attempt fails"
        assert int(mine[1]["started_unix_ns"]) >= int(mine[0]["ended_unix_ns"])


async def test_a_running_attempt_has_no_end_and_a_missed_deadline_is_flagged(server, workers):
    async with client(server, CLIENT) as http:
        late = await submit(http, {"payload": {"sleep": 1.0}, "deadline_in_s": 0.2})
        on_time = await submit(http, {"payload": {"sleep": 0.1}, "deadline_in_s": 60})

        async def running_late():
            answer = (await http.get("/v1/timeline")).json()
            return next((a for a in answer["attempts"] if a["id"] == late["id"] and "ended_unix_ns" not in a
                         and a["missed_deadline"]), None)
        running = await until(running_late, what="the late task running past its deadline")
        assert "status" not in running and running["worker_name"] == "lane-worker"
        _, [ended_late] = await attempts_of(http, late["id"], 1)
        assert ended_late["missed_deadline"] is True
        assert int(ended_late["ended_unix_ns"]) > int(ended_late["deadline_unix_ns"])
        _, [ok] = await attempts_of(http, on_time["id"], 1)
        assert ok["missed_deadline"] is False
        assert int(ok["deadline_unix_ns"]) > int(ok["ended_unix_ns"])


async def test_a_fixed_start_is_drawn_ahead_before_it_starts(server, workers):
    async with client(server, CLIENT) as http:
        before = time.time_ns()
        task = await submit(http, {"payload": {"n": 2}, "pool": "fixed", "key": "timeline-ahead",
                                   "kind": "nightly", "start_in_s": 60, "deadline_in_s": 120})
        try:
            answer = (await http.get("/v1/timeline", params={"pool": "fixed"})).json()
            [booked] = [r for r in answer["reservations"] if r["id"] == task["id"]]
            assert (booked["pool"], booked["key"], booked["kind"], booked["held"]) == (
                "fixed", "timeline-ahead", "nightly", False)
            assert before + 60 * NS <= int(booked["start_unix_ns"]) <= time.time_ns() + 60 * NS
            assert int(booked["deadline_unix_ns"]) > int(booked["start_unix_ns"])
            assert task["id"] not in [a["id"] for a in answer["attempts"]]
            near = (await http.get("/v1/timeline", params={"pool": "fixed", "ahead_s": 30})).json()
            assert task["id"] not in [r["id"] for r in near["reservations"]]
            other = (await http.get("/v1/timeline", params={"pool": "default"})).json()
            assert task["id"] not in [r["id"] for r in other["reservations"]]
            assert {w["pool"] for w in other["workers"]} == {"default"}
        finally:
            await http.delete(f"/v1/tasks/{task['id']}")
        gone = (await http.get("/v1/timeline", params={"pool": "fixed"})).json()
        assert task["id"] not in [r["id"] for r in gone["reservations"]]


async def test_a_slot_held_for_a_fixed_start_is_listed(server, workers):
    async with client(server, CLIENT) as http:
        # A tolerance longer than the wait: the slot is held at once (the hold lead is the tolerance).
        task = await submit(http, {"payload": {"n": 3}, "pool": "fixed", "start_in_s": 30, "tolerance_s": 40})
        try:
            async def held():
                answer = (await http.get("/v1/timeline", params={"pool": "fixed", "ahead_s": 1})).json()
                return answer if answer["holds"] else None
            answer = await until(held, what="the slot held for the fixed start")
            assert answer["holds"] == [{"pool": "fixed", "held": 1, "task_ids": [task["id"]]}]
            [booked] = answer["reservations"]       # beyond ahead_s, but holding a slot
            assert booked["id"] == task["id"] and booked["held"] is True and booked["tolerance_s"] == 40
        finally:
            await http.delete(f"/v1/tasks/{task['id']}")
        assert (await http.get("/v1/timeline", params={"pool": "fixed"})).json()["holds"] == []


async def test_who_may_read_the_timeline(server, workers):
    async with client(server) as http:
        assert error_of(await http.get("/v1/timeline"))[0] == 401
    for token in (METRICS, WORKER):
        async with client(server, token) as http:
            status, code, _ = error_of(await http.get("/v1/timeline"))
            assert (status, code) == (403, "forbidden")
    async with client(server, ADMIN) as http:
        assert (await http.get("/v1/timeline")).status_code == 200
    async with client(server, CLIENT) as http:
        await submit(http, {"payload": {"n": 4}, "wait": True})
        assert error_of(await http.get("/v1/timeline", params={"pool": "nope"}))[0] == 404
        assert error_of(await http.get("/v1/timeline", params={"range_s": "-1"}))[0] == 400
        capped = (await http.get("/v1/timeline", params={"range_s": 99999, "ahead_s": 7200})).json()
        assert capped["range_s"] == 3600 and capped["ahead_s"] == 3600
    async with client(server, SCOPED) as http:
        answer = (await http.get("/v1/timeline")).json()
        assert {w["pool"] for w in answer["workers"]} == {"fixed"}
        assert all(a["pool"] == "fixed" for a in answer["attempts"])
        assert error_of(await http.get("/v1/timeline", params={"pool": "default"}))[0] == 403


async def test_a_shard_answers_for_its_own_pools_and_names_the_others(servers, tmp_path):
    import socket

    from serverkit import shards_toml

    def free_port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    ports = {"a": free_port(), "b": free_port()}
    config = f"""
[server]
grpc_addr = "127.0.0.1:{ports['a']}"
http_addr = "127.0.0.1:0"
{AUTH}
[store]
kind = "sqlite"
path = "{tmp_path}/shard-{{shard}}.db"
full_sync = false
""" + shards_toml({"a": (["default"], f"http://127.0.0.1:{ports['a']}"),
                   "b": (["gpu"], f"http://127.0.0.1:{ports['b']}")})
    a = servers(config, args=("--shard", "a"), name="a")   # b never starts: the timeline does not ask it
    async with client(a, CLIENT) as http:
        task = await submit(http, {"payload": {"n": 5}, "start_in_s": 60})
        everything = (await http.get("/v1/timeline")).json()
        assert everything["unavailable_shards"] == ["b"]
        assert [r["id"] for r in everything["reservations"]] == [task["id"]]
        assert (await http.get("/v1/timeline", params={"pool": "default"})).json()["unavailable_shards"] == []
        other = (await http.get("/v1/timeline", params={"pool": "gpu"})).json()
        assert other["unavailable_shards"] == ["b"] and other["reservations"] == [] and other["workers"] == []
        assert error_of(await http.get("/v1/timeline", params={"pool": "nope"}))[0] == 404


# ---------------------------------------------------------------- the info cache's records behind it

async def test_the_worker_is_recorded_whether_the_lease_comes_before_or_after_the_running_event():
    from cronoq.core.types import TaskSpec
    from cronoq.server.info import InfoCache, TaskMeta

    cache = InfoCache(10)
    cache.put(1, TaskMeta(TaskSpec(None), "default", 3, 0))
    cache.leased(1, 1, 7, "w7")                        # the lease first (the usual order)
    cache.saw(1, "running", 10, attempt=1)
    cache.saw(1, "retrying", 20, attempt=1, message="boom")
    cache.saw(1, "running", 30, attempt=2)             # the event first
    cache.leased(1, 2, 8, "w8")
    cache.leased(1, 2, 9, "w9")                        # given back by w8, leased to w9
    assert [(a[0], a[6], a[7]) for a in cache.get(1).attempts] == [(1, 7, "w7"), (2, 9, "w9")]
    cache.leased(2, 1, 7, "w7")                        # before the task's record exists
    cache.put(2, TaskMeta(TaskSpec(None, deadline_at=5.0), "default", 3, 0))
    cache.saw(2, "running", 40, attempt=1)
    assert cache.get(2).attempts[0][6:] == [7, "w7"] and cache.get(2).deadline_ns == 5 * 10 ** 9


async def test_the_window_index_finds_running_and_recent_attempts_only():
    from cronoq.core.types import TaskSpec
    from cronoq.server.info import InfoCache, TaskMeta

    cache = InfoCache(100)
    for task_id in range(1, 6):
        cache.put(task_id, TaskMeta(TaskSpec(None), "default", 3, 0))
    cache.saw(1, "running", 10, attempt=1)            # still running: always in the window
    cache.saw(2, "running", 11, attempt=1)
    cache.saw(2, "succeeded", 12, attempt=1)          # ended long ago
    cache.saw(3, "running", 90, attempt=1)
    cache.saw(3, "succeeded", 95, attempt=1)
    cache.saw(4, "ready", 96)                         # never ran
    assert sorted(task_id for task_id, _ in cache.active_since(50, 100)) == [1, 3]
    assert len(cache.active_since(0, 1)) == 1
