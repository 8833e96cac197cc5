"""The Tasks and Admin services through cronoq.client (Client, Worker,
BlockingClient) against a real server: submissions and batches, lookups by
id and key, waiting, cancelling, listing pages, watching, recurring
schedules, snapshots, the [limits], errors mapped to cronoq's exceptions,
and the Python worker's outcomes, heartbeats, reconnection and drain."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
import pytest_asyncio

import cronoq
from cronoq._proto import cronoq_pb2 as pb
from cronoq.client import AccessDenied, BlockingClient, CancelTask, Client, Reject, ServerError, Worker
from serverkit import LISTEN, stubs

pytestmark = pytest.mark.asyncio

CONFIG = LISTEN + """
[limits]
max_tasks_per_batch = 20
max_list = 50
max_tags = 2
max_key_bytes = 64
max_deps = 3
max_wait_s = 20

[[pools]]
name = "default"
retry = { max_attempts = 3, initial_backoff_s = 0.05, jitter = false }
[[pools]]
name = "idle"
[[pools]]
name = "bounded"
max_pending = 2
overflow = "reject"
[[pools]]
name = "outcomes"
lease_ttl_s = 0.6
retry = { max_attempts = 2, initial_backoff_s = 0.05, jitter = false }
[[pools]]
name = "nack"
retry = { max_attempts = 2, initial_backoff_s = 0.05, jitter = false }
[[pools]]
name = "aborts"

[[resources]]
name = "gpu"
kind = "semaphore"
permits = 1

[[recurring]]
name = "from-config"
cron = "0 0 1 1 *"
pool = "idle"
payload = { report = "yearly" }
"""


async def echo(lease):
    if lease.content_type == "application/json":
        return {"echo": lease.json(), "attempt": lease.attempt, "tags": lease.tags}
    return lease.payload


@pytest.fixture(scope="module")
def server(module_servers):
    return module_servers(CONFIG, name="api")


@pytest_asyncio.fixture
async def worker(server):
    worker = Worker(server.target, "default", echo, slots=4, initial_backoff=0.05)
    task = asyncio.create_task(worker.run())
    yield worker
    worker.stop()
    await asyncio.wait_for(task, 30)


async def test_submit_wait_get_by_id_and_key_with_every_payload_kind(server, worker):
    async with Client(server.target) as client:
        sub = await client.submit({"n": 1}, key="json-1", priority="high", tags={"team": "a"}, wait=True,
                                  wait_timeout=30)
        assert not sub.duplicate and sub.result.ok
        assert sub.result.json() == {"echo": {"n": 1}, "attempt": 1, "tags": {"team": "a"}}
        assert sub.result.content_type == "application/json"
        again = await client.submit({"n": 2}, key="json-1")
        assert (again.id, again.duplicate) == (sub.id, True)
        raw = await client.submit(b"\x00\xffbytes", wait=True, wait_timeout=30)
        assert raw.result.output == b"\x00\xffbytes" and raw.result.content_type == "application/octet-stream"
        text = await client.submit("h\u00e9llo", wait=True, wait_timeout=30)
        assert text.result.text() == "h\u00e9llo"
        info = await client.get("json-1")
        assert (info.id, info.status, info.key, info.priority, info.pool) == (
            sub.id, "succeeded", "json-1", "high", "default")
        assert info.tags == {"team": "a"} and info.max_attempts == 3 and info.output_available
        assert info.created <= info.started <= info.finished
        by_key = await client.wait("json-1", timeout=5)
        assert by_key.json()["echo"] == {"n": 1}
        with pytest.raises(cronoq.UnknownTask):
            await client.get(10 ** 12)
        with pytest.raises(cronoq.UnknownTask):
            await client.wait("no such key", timeout=1)


async def test_wait_times_out_while_the_task_runs_and_cancel_ends_it(server):
    async with Client(server.target) as client:
        sub = await client.submit("x", pool="idle")
        with pytest.raises(TimeoutError, match="still running"):
            await client.wait(sub.id, timeout=0.2)
        with pytest.raises(TimeoutError):
            await client.submit("y", pool="idle", wait=True, wait_timeout=0.1)
        assert await client.cancel(sub.id) is True
        assert await client.cancel(sub.id) is False          # already finished
        result = await client.wait(sub.id)
        assert result.status == "cancelled" and result.output is None and not result.output_available
        with pytest.raises(ValueError, match="no output"):
            result.json()


async def test_batches_are_atomic_and_may_depend_on_each_other(server, worker):
    async with Client(server.target) as client:
        subs = await client.submit_batch([
            cronoq.Task("load", key="b-load", after="b-extract"),
            cronoq.Task("extract", key="b-extract"),
            {"payload": "alert", "deps": [cronoq.Dep("b-load", on="failure")]},
        ])
        assert [s.duplicate for s in subs] == [False] * 3
        assert (await client.wait(subs[0].id, timeout=30)).output == b"load"
        assert (await client.wait(subs[2].id, timeout=30)).status == "skipped"
        before = (await client.list(limit=50)).tasks
        with pytest.raises(cronoq.UnknownDependency, match="task 1 of the batch"):
            await client.submit_batch([cronoq.Task("ok", key="b-fine"), cronoq.Task("bad", after="b-nowhere")])
        with pytest.raises(cronoq.UnknownTask):
            await client.get("b-fine")                       # nothing of the batch was admitted
        with pytest.raises(cronoq.Cycle):
            await client.submit_batch([cronoq.Task(1, key="c1", after="c2"), cronoq.Task(2, key="c2", after="c1")])
        with pytest.raises(cronoq.InvalidTask, match="at most 20 tasks"):
            await client.submit_batch([cronoq.Task(i) for i in range(21)])
        assert [t.id for t in (await client.list(limit=50)).tasks][:len(before)] == [t.id for t in before]


async def test_errors_map_to_cronoq_exceptions(server):
    async with Client(server.target) as client:
        with pytest.raises(cronoq.UnknownPool, match="nowhere"):
            await client.submit("x", pool="nowhere")
        with pytest.raises(cronoq.UnknownResource):
            await client.submit("x", pool="idle", resources={"tpu": 1})
        with pytest.raises(cronoq.ResourceExceedsCapacity):
            await client.submit("x", pool="idle", resources={"gpu": 2})
        with pytest.raises(cronoq.InvalidTask, match="deadline_in"):
            await client.submit("x", pool="idle", deadline_in=-1.0)
        with pytest.raises(cronoq.InvalidTask, match="deadline_in_s or deadline_unix_ns"):
            channel, tasks, _ = stubs(server.target)
            try:
                await tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(deadline_in_s=1, deadline_unix_ns=1)))
            except grpc.aio.AioRpcError as exc:
                from cronoq.client.wire import error_from
                raise error_from(exc) from None
            finally:
                await channel.close()
        await client.submit("1", pool="bounded")
        await client.submit("2", pool="bounded")
        with pytest.raises(cronoq.QueueFull):
            await client.submit("3", pool="bounded")


async def test_limits_on_strings_collections_and_nul(server):
    async with Client(server.target) as client:
        with pytest.raises(cronoq.InvalidTask, match="key is longer than 64 bytes"):
            await client.submit("x", pool="idle", key="k" * 65)
        with pytest.raises(cronoq.InvalidTask, match="at most 2 tags"):
            await client.submit("x", pool="idle", tags={"a": "1", "b": "2", "c": "3"})
        with pytest.raises(cronoq.InvalidTask, match="at most 3 dependencies"):
            await client.submit("x", pool="idle", after=[1, 2, 3, 4])
        for options in ({"key": "a\x00b"}, {"kind": "a\x00b"}, {"tags": {"t": "a\x00"}}, {"tenant": "\x00"}):
            with pytest.raises(cronoq.InvalidTask, match="NUL"):
                await client.submit("x", pool="idle", **options)


async def test_list_pages_through_tasks_with_filters(server, worker):
    async with Client(server.target) as client:
        ids = [s.id for s in await client.submit_batch([{"payload": f"l{i}", "pool": "idle"} for i in range(7)])]
        page_ids, after = [], 0
        while True:
            page = await client.list(pools=["idle"], statuses=["ready"], after=after, limit=3)
            page_ids += [t.id for t in page.tasks]
            assert len(page.tasks) <= 3
            if page.next_after is None:
                break
            after = page.next_after
        assert [i for i in page_ids if i in ids] == ids
        assert all(t.pool == "idle" for t in (await client.list(pools=["idle"], limit=50)).tasks)
        with pytest.raises(ValueError, match="unknown status"):
            await client.list(statuses=["done"])
        with pytest.raises(cronoq.UnknownPool):
            await client.list(pools=["nowhere"])
        capped = await client.list(limit=10_000)
        assert len(capped.tasks) <= 50                  # limits.max_list
        for task_id in ids:
            await client.cancel(task_id)


async def test_watch_streams_transitions_of_the_pools_asked_for(server, worker):
    async with Client(server.target) as client:
        events: list[cronoq.StatusEvent] = []
        terminal: list[cronoq.StatusEvent] = []

        async def follow(into, **filters):
            async for event in client.watch(**filters):
                into.append(event)

        watching = [asyncio.create_task(follow(events, pools=["default"])),
                    asyncio.create_task(follow(terminal, pools=["default"], terminal_only=True))]
        await asyncio.sleep(0.3)
        await client.submit("idle pool", pool="idle")
        sub = await client.submit("watched", key="watched-1", wait=True, wait_timeout=30)
        # The two streams are independent: wait until each has seen the end.
        for _ in range(1000):
            if terminal and any(e.id == sub.id and e.status == "succeeded" for e in events):
                break
            await asyncio.sleep(0.01)
        for task in watching:
            task.cancel()
        mine = [e for e in events if e.id == sub.id]
        assert [e.status for e in mine][-2:] == ["running", "succeeded"]
        assert all(e.pool == "default" for e in events) and mine[-1].key == "watched-1"
        assert [(e.id, e.status) for e in terminal] == [(sub.id, "succeeded")]


async def test_recurring_schedules_from_config_and_over_admin(server):
    async with Client(server.target) as client:
        names = [s.name for s in await client.recurring()]
        assert "from-config" in names
        next_at = await client.add_recurring("nightly", "0 0 3 * * *", {"r": 1}, tz="Europe/Berlin",
                                             overlap="queue", pool="idle", kind="report", key="night")
        assert next_at is not None
        nightly = next(s for s in await client.recurring() if s.name == "nightly")
        assert (nightly.cron, nightly.tz, nightly.pool, nightly.kind, nightly.overlap) == (
            "0 0 3 * * *", "Europe/Berlin", "idle", "report", "queue")
        assert nightly.next_at == next_at and nightly.last_task_id is None
        with pytest.raises(cronoq.InvalidTask, match="cron"):
            await client.add_recurring("bad", "not a cron", pool="idle")
        with pytest.raises(cronoq.InvalidTask, match="recurring template may not"):
            await client.add_recurring("bad", "* * * * *", pool="idle", start_in=5)
        assert await client.remove_recurring("nightly") is True
        assert await client.remove_recurring("nightly") is False


async def test_snapshot_and_workers(server, worker):
    async with Client(server.target) as client:
        await client.submit("s", wait=True, wait_timeout=30)
        snap = await client.snapshot()
        pool = next(p for p in snap["pools"] if p["name"] == "default")
        assert pool["capacity"] >= 4 and pool["workers_connected"] >= 1
        assert set(pool["pending_by_class"]) == {"critical", "high", "normal", "low"}
        assert pool["groups"][0] == {"labels": {}, "capacity": pool["capacity"], "busy": pool["busy"]}
        assert snap["totals"]["succeeded"] >= 1 and snap["workers_connected"] >= 1
        workers = await client.workers(pools=["default"])
        assert any(w.pool == "default" and w.slots == 4 and w.name == worker.name for w in workers)


async def test_worker_outcomes(server):
    calls: dict[str, int] = {}

    async def handle(lease):
        what = lease.text()
        calls[what] = calls.get(what, 0) + 1
        if what == "retry":
            if lease.attempt == 1:
                raise cronoq.Retryable("try again", retry_after=0.05)
            return "second time"
        if what == "permanent":
            raise cronoq.Permanent("never")
        if what == "cancel":
            raise CancelTask("not wanted")
        if what == "crash":
            raise RuntimeError("boom")
        if what == "unjsonable":
            return {1, 2}
        if what == "slow":
            await asyncio.sleep(2.0)   # over three lease TTLs: heartbeats keep it
            return "slow but fine"
        if what == "aborted":
            await lease.cancelled.wait()
        return what

    worker = Worker(server.target, "outcomes", handle, slots=4, initial_backoff=0.05)
    running = asyncio.create_task(worker.run())
    async with Client(server.target) as client:
        async def outcome(payload):
            sub = await client.submit(payload, pool="outcomes", wait=True, wait_timeout=30)
            return sub.result

        retried = await outcome("retry")
        assert (retried.status, retried.text(), calls["retry"]) == ("succeeded", "second time", 2)
        assert (await outcome("permanent")).message == "never"
        cancelled = await outcome("cancel")
        assert (cancelled.status, cancelled.message) == ("cancelled", "not wanted")
        crashed = await outcome("crash")
        assert crashed.status == "dead_lettered" and crashed.message.endswith("RuntimeError: boom")
        unjsonable = await outcome("unjsonable")
        assert unjsonable.status == "failed" and "set" in unjsonable.message
        assert (await outcome("slow")).text() == "slow but fine"
        aborted = await client.submit("aborted", pool="outcomes")
        await asyncio.sleep(0.3)
        assert await client.cancel(aborted.id)
        assert (await client.wait(aborted.id)).status == "cancelled"
        assert worker.granted_slots == 4
    worker.stop()
    await asyncio.wait_for(running, 30)


async def test_a_handler_hears_why_its_attempt_was_given_up(server):
    started: dict[str, asyncio.Event] = {}
    reasons: dict[str, asyncio.Future] = {}

    async def handle(lease):
        what = lease.text()
        started.setdefault(what, asyncio.Event()).set()
        try:
            await asyncio.sleep(3600)
        finally:
            future = reasons.setdefault(what, asyncio.get_running_loop().create_future())
            if not future.done():
                future.set_result((lease.abort_reason, lease.cancelled.is_set()))

    worker = Worker(server.target, "aborts", handle, slots=2, initial_backoff=0.05)
    running = asyncio.create_task(worker.run())
    once = cronoq.RetryPolicy(max_attempts=1)
    async with Client(server.target) as client:
        cancelled = await client.submit("cancel me", pool="aborts", retry=once)
        await asyncio.wait_for(started.setdefault("cancel me", asyncio.Event()).wait(), 30)
        assert await client.cancel(cancelled.id)
        assert await asyncio.wait_for(reasons.setdefault("cancel me", asyncio.Future()), 30) == ("cancelled", True)
        # The server enforces Lease.timeout_s: the handler is told it timed out.
        timed = await client.submit("too slow", pool="aborts", retry=once, timeout=0.2)
        result = await client.wait(timed.id, timeout=30)
        assert result.status == "dead_lettered" and "timed out" in result.message
        assert await asyncio.wait_for(reasons.setdefault("too slow", asyncio.Future()), 30) == ("timeout", True)
        # stop() after its grace gives the handlers still running up: a shutdown.
        await client.submit("still running", pool="aborts", retry=once)
        await asyncio.wait_for(started.setdefault("still running", asyncio.Event()).wait(), 30)
    worker.grace = 0.0
    worker.stop()
    await asyncio.wait_for(running, 30)
    assert await asyncio.wait_for(reasons["still running"], 30) == ("shutdown", True)


async def test_reject_hands_the_lease_to_another_worker(server):
    seen = []

    async def picky(lease):
        seen.append(("picky", lease.attempt))
        raise Reject("not here")

    async def willing(lease):
        seen.append(("willing", lease.attempt))
        return "done"

    first = Worker(server.target, "nack", picky, slots=1, name="picky")
    first_run = asyncio.create_task(first.run())
    async with Client(server.target) as client:
        for _ in range(100):
            if any(w.name == "picky" for w in await client.workers(pools=["nack"])):
                break
            await asyncio.sleep(0.05)
        second = Worker(server.target, "nack", willing, slots=1, name="willing")
        second_run = asyncio.create_task(second.run())
        for _ in range(100):
            if len(await client.workers(pools=["nack"])) == 2:
                break
            await asyncio.sleep(0.05)
        results = [await client.submit(f"n{i}", pool="nack", wait=True, wait_timeout=30) for i in range(3)]
        assert all(r.result.text() == "done" for r in results)
        assert all(attempt == 1 for who, attempt in seen)     # a reject uses no attempt
    for w, run in ((first, first_run), (second, second_run)):
        w.stop()
        await asyncio.wait_for(run, 30)


async def test_worker_reconnects_after_the_server_restarts_and_drains_on_stop(servers, tmp_path):
    config = LISTEN.replace('grpc_addr = "127.0.0.1:0"', 'grpc_addr = "127.0.0.1:{port}"')
    first = servers(LISTEN)
    port = first.grpc_port
    started = asyncio.Event()
    release = asyncio.Event()

    async def handle(lease):
        if lease.text() == "long":
            started.set()
            await release.wait()
        return lease.payload

    worker = Worker(first.target, "default", handle, slots=2, initial_backoff=0.05, max_backoff=0.2, grace=10)
    running = asyncio.create_task(worker.run())
    async with Client(first.target, retry_for=30) as client:
        assert (await client.submit(b"one", wait=True, wait_timeout=30)).result.output == b"one"
        first.stop()
        second = servers(config.format(port=port))        # the same address, a new process
        assert (await client.submit(b"two", wait=True, wait_timeout=30)).result.output == b"two"
        long = await client.submit(b"long")
        await asyncio.wait_for(started.wait(), 30)
        worker.stop()                                     # drains: the running handler may finish
        await asyncio.sleep(0.2)
        release.set()
        await asyncio.wait_for(running, 30)
        result = await client.wait(long.id, timeout=30)
        assert result.output == b"long"
        assert not any(w.name == worker.name for w in await client.workers())
    assert second.stop() == 0


async def test_access_errors_and_the_blocking_client(servers):
    from serverkit import AUTH, CLIENT, WORKER
    server = servers(LISTEN + AUTH)
    async with Client(server.target, token=WORKER) as client:
        with pytest.raises(AccessDenied) as denied:
            await client.submit("x")
        assert denied.value.code == "PERMISSION_DENIED" and isinstance(denied.value, PermissionError)
    async with Client(server.target) as client:
        with pytest.raises(AccessDenied, match="UNAUTHENTICATED"):
            await client.submit("x")

    def threaded() -> tuple:
        with BlockingClient(server.target, token=CLIENT) as blocking:
            sub = blocking.submit({"a": 1}, key="blocking")
            info = blocking.get("blocking")
            page = blocking.list(limit=5)
            cancelled = blocking.cancel(sub.id)
            return sub, info, page, cancelled, blocking.wait(sub.id, timeout=5)

    sub, info, page, cancelled, result = await asyncio.to_thread(threaded)
    assert info.id == sub.id and [t.id for t in page.tasks] == [sub.id] and cancelled
    assert result.status == "cancelled"
    assert isinstance(ServerError("ALREADY_EXISTS", "x"), cronoq.CronoqError)
    assert json.loads(b"null") is None
