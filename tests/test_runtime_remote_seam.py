"""The runtime's core scenarios, run through the Runner seam twice: with the
local thread runner, and with a fake remote runner whose "worker" lives on
other threads and talks to the scheduler only through the RunnerLink (lease
values out, outcomes and heartbeats back through call_soon_threadsafe), as a
worker over the network would. Same scenarios, same expected outcomes."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import cronoq
from remote_runner import remote_pool

WAIT = 20.0
KINDS = ["local", "remote"]


def make_pool(kind: str, behaviour, *, slots: int = 2, name: str = "default", **options):
    """``behaviour(payload, attempt, still_held, heartbeat)`` runs the attempt
    (on a pool thread locally, on a worker thread remotely)."""
    if kind == "local":
        options.pop("heartbeat_every", None)   # local executors heartbeat themselves

        def work(ctx, payload):
            return behaviour(payload, ctx.attempt, lambda: not ctx.is_cancelled(), ctx.heartbeat)
        return cronoq.Pool(name, work, min=slots, max=slots, initial=slots, autoscale=False, **options), None
    heartbeat_every = options.pop("heartbeat_every", None)
    pool, made = remote_pool(name, lambda lease, held: behaviour(lease.payload, lease.attempt, held, lambda: True),
                             slots=slots, heartbeat_every=heartbeat_every, **options)
    return pool, made


def hold_until_released(release: threading.Event):
    def behaviour(payload, attempt, still_held, heartbeat):
        while still_held() and not release.wait(0.005):
            pass
        return payload
    return behaviour


async def until(predicate, timeout=WAIT):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the condition did not come true"
        await asyncio.sleep(0.002)


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", KINDS)
async def test_results_come_back(kind):
    pool, _ = make_pool(kind, lambda payload, *_: payload * 2, slots=4)
    async with cronoq.Scheduler([pool]) as sched:
        handles = [await sched.submit(i) for i in range(40)]
        assert await asyncio.wait_for(asyncio.gather(*handles), WAIT) == [2 * i for i in range(40)]
        snap = await sched.snapshot()
        assert snap.totals["succeeded"] == 40 and snap.pool("default").capacity == 4


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", KINDS)
async def test_retryable_and_permanent_failures(kind):
    def behaviour(payload, attempt, *_):
        if payload == "retry" and attempt == 1:
            raise cronoq.Retryable("once more")
        if payload == "fail":
            raise cronoq.Permanent("no")
        return (payload, attempt)

    pool, _ = make_pool(kind, behaviour, retry=cronoq.RetryPolicy(max_attempts=3, initial_backoff=0.0,
                                                                  jitter=False))
    async with cronoq.Scheduler([pool]) as sched:
        retried = await sched.submit("retry")
        failed = await sched.submit("fail")
        assert await asyncio.wait_for(retried, WAIT) == ("retry", 2)
        with pytest.raises(cronoq.TaskFailed) as info:
            await asyncio.wait_for(failed, WAIT)
        assert (info.value.status, info.value.message) == ("failed", "no")


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", KINDS)
async def test_a_timeout_aborts_the_attempt_and_its_late_report_is_ignored(kind):
    release = threading.Event()
    pool, _ = make_pool(kind, hold_until_released(release))
    try:
        async with cronoq.Scheduler([pool], shutdown_grace=0) as sched:
            handle = await sched.submit("slow", timeout=0.05, retry=cronoq.RetryPolicy.none())
            with pytest.raises(cronoq.TaskFailed) as info:
                await asyncio.wait_for(handle, WAIT)
            assert "timed out" in info.value.message
            after = await sched.submit("next")
            release.set()
            assert await asyncio.wait_for(after, WAIT) == "next"
            assert (await sched.info(handle.id)).status == "dead_lettered"
    finally:
        release.set()


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", KINDS)
async def test_cancelling_a_running_task(kind):
    saw_abort = threading.Event()
    started = threading.Event()

    def behaviour(payload, attempt, still_held, heartbeat):
        started.set()
        while still_held():
            time.sleep(0.002)
        saw_abort.set()
        return "too late"

    pool, _ = make_pool(kind, behaviour)
    async with cronoq.Scheduler([pool]) as sched:
        handle = await sched.submit("x")
        await until(started.is_set)
        assert await sched.cancel(handle.id) is True
        with pytest.raises(cronoq.TaskFailed) as info:
            await asyncio.wait_for(handle, WAIT)
        assert info.value.status == "cancelled"
        assert await asyncio.to_thread(saw_abort.wait, WAIT)


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", KINDS)
async def test_dependencies_run_in_order(kind):
    order = []
    lock = threading.Lock()

    def behaviour(payload, *_):
        with lock:
            order.append(payload)
        return payload

    pool, _ = make_pool(kind, behaviour, slots=3)
    async with cronoq.Scheduler([pool]) as sched:
        handles = await sched.submit_batch([
            cronoq.Task("load", key="load", after="transform"),
            cronoq.Task("transform", key="transform", after="extract"),
            cronoq.Task("extract", key="extract"),
        ])
        await asyncio.wait_for(asyncio.gather(*handles), WAIT)
    assert order == ["extract", "transform", "load"]


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", KINDS)
async def test_priorities_decide_the_order_on_one_slot(kind):
    release = threading.Event()
    order = []

    def behaviour(payload, attempt, still_held, heartbeat):
        if payload == "blocker":
            release.wait(WAIT)
        order.append(payload)
        return payload

    pool, _ = make_pool(kind, behaviour, slots=1)
    async with cronoq.Scheduler([pool]) as sched:
        blocker = await sched.submit("blocker")
        await until(lambda: sched.snapshot_from_thread().pool("default").busy == 1)
        handles = [await sched.submit(p, priority=p) for p in ("low", "normal", "high", "critical")]
        release.set()
        await asyncio.wait_for(asyncio.gather(blocker, *handles), WAIT)
    assert order == ["blocker", "critical", "high", "normal", "low"]


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", KINDS)
async def test_heartbeats_keep_a_long_attempt_alive(kind):
    def behaviour(payload, attempt, still_held, heartbeat):
        for _ in range(20):
            if not heartbeat():
                return "given up"
            time.sleep(0.02)
        return (payload, attempt)

    pool, _ = make_pool(kind, behaviour, lease_ttl=0.2, heartbeat_every=0.02)
    async with cronoq.Scheduler([pool]) as sched:
        handle = await sched.submit("long")
        assert await asyncio.wait_for(handle, WAIT) == ("long", 1)
        assert (await sched.snapshot()).totals["lease_expiries"] == 0


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", KINDS)
async def test_shutdown_gives_unfinished_handles_a_shutdown_status(kind):
    release = threading.Event()
    pool, _ = make_pool(kind, hold_until_released(release), slots=1)
    try:
        sched = cronoq.Scheduler([pool], shutdown_grace=0)
        await sched.start()
        running = await sched.submit("running")
        queued = await sched.submit("queued")
        await until(lambda: sched.snapshot_from_thread().pool("default").busy == 1)
        await sched.shutdown()
        for handle in (running, queued):
            with pytest.raises(cronoq.TaskFailed) as info:
                await handle
            assert info.value.status == "shutdown"
    finally:
        release.set()


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", KINDS)
async def test_events_report_every_end(kind):
    pool, _ = make_pool(kind, lambda payload, *_: payload)
    async with cronoq.Scheduler([pool]) as sched:
        async with sched.events() as events:
            for i in range(5):
                await sched.enqueue(i, key=f"k{i}")
            seen = set()
            async for event in events:
                seen.add((event.key, event.status))
                if len(seen) == 5:
                    break
    assert seen == {(f"k{i}", "succeeded") for i in range(5)}


@pytest.mark.parametrize("kind", KINDS)
def test_blocking_scheduler_from_threads(kind):
    pool, _ = make_pool(kind, lambda payload, *_: payload + 1, slots=4)
    results: list = []
    with cronoq.BlockingScheduler([pool]) as sched:
        def producer(base: int) -> None:
            handles = [sched.submit(base + i) for i in range(50)]
            results.extend(h.result(timeout=WAIT) for h in handles)

        threads = [threading.Thread(target=producer, args=(1000 * t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT)
    assert sorted(results) == sorted(1000 * t + i + 1 for t in range(4) for i in range(50))


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", KINDS)
async def test_with_a_store_queued_work_survives_a_restart(kind, tmp_path):
    release = threading.Event()
    path = tmp_path / "seam.db"
    pool, _ = make_pool(kind, hold_until_released(release), slots=1)
    try:
        store = cronoq.SqliteStore(path)
        sched = cronoq.Scheduler([pool], store=store, shutdown_grace=0)
        await sched.start()
        await sched.submit("first", key="first")
        await sched.submit("second", key="second")
        await until(lambda: sched.snapshot_from_thread().pool("default").busy == 1)
        await sched.shutdown()
        await store.close()
        release.set()
        pool, _ = make_pool(kind, lambda payload, *_: payload.upper(), slots=1)
        store = cronoq.SqliteStore(path)
        async with cronoq.Scheduler([pool], store=store) as again:
            second = await again.handle("second")
            assert await asyncio.wait_for(second, WAIT) == "SECOND"
            assert (await again.info("second")).attempt == 1     # never started before
        await store.close()
    finally:
        release.set()


@pytest.mark.asyncio
async def test_a_runner_can_give_an_attempt_back_without_using_it():
    # A remote worker that refuses ("Nack") the first offer of every task: the
    # attempt goes back to the queue uncounted, and the next offer runs.
    from cronoq.runtime.runner import Attempt, RunnerLink

    refused: set[int] = set()

    class Refusing:
        def __init__(self, link: RunnerLink) -> None:
            self.link = link
            link.set_capacity({}, 1)

        def start(self, attempt: Attempt) -> None:
            if attempt.id not in refused:
                refused.add(attempt.id)
                self.link.loop.call_soon(self.link.not_started, attempt.lease, "refused by the worker")
            else:
                self.link.loop.call_soon(self.link.report, attempt, "success", attempt.attempt, None, None)

        def abort(self, lease: int) -> bool:
            return False

        def close(self) -> None:
            pass

        def cancel_all(self) -> list[int]:
            return []

        stray_threads = 0

    pool = cronoq.Pool("default", runner=Refusing, min=0, max=4, initial=0, autoscale=False)
    clock = cronoq.VirtualClock()
    async with cronoq.Scheduler([pool], clock=clock) as sched:
        handle = await sched.submit("x")
        await clock.advance(2)                 # a start given back waits a second before the next offer
        assert await asyncio.wait_for(handle, WAIT) == 1          # attempt 1: the refusal did not count
        assert (await sched.info(handle.id)).attempt == 1


@pytest.mark.asyncio
async def test_runners_hear_why_an_attempt_was_given_up_and_older_runners_still_work():
    from cronoq.runtime.runner import Attempt, RunnerLink

    heard: dict[int, str] = {}          # task id -> reason, from a runner that takes one
    plain: list[int] = []               # leases aborted on a runner written before reasons

    class Holding:
        """Runs nothing: each attempt stays running until the scheduler gives it up."""

        def __init__(self, link: RunnerLink) -> None:
            self.held: dict[int, Attempt] = {}
            link.set_capacity({}, 4)

        def start(self, attempt: Attempt) -> None:
            self.held[attempt.lease] = attempt

        def abort(self, lease: int, reason: str = "cancelled") -> bool:
            attempt = self.held.pop(lease, None)
            if attempt is None:
                return False
            heard[attempt.id] = reason
            return True

        def close(self) -> None:
            pass

        def cancel_all(self) -> list[int]:
            return []

        stray_threads = 0

    class Older(Holding):
        def abort(self, lease: int) -> bool:   # type: ignore[override]
            if self.held.pop(lease, None) is None:
                return False
            plain.append(lease)
            return True

    once = cronoq.RetryPolicy(max_attempts=1)
    pools = [cronoq.Pool("new", runner=Holding, min=0, max=4, initial=0, autoscale=False, lease_ttl=5),
             cronoq.Pool("old", runner=Older, min=0, max=4, initial=0, autoscale=False)]
    clock = cronoq.VirtualClock()
    async with cronoq.Scheduler(pools, clock=clock) as sched:
        slow = await sched.submit("slow", pool="new", timeout=1, retry=once)
        doomed = await sched.submit("doomed", pool="new", retry=once)
        silent = await sched.submit("silent", pool="new", retry=once)
        older = await sched.submit("older", pool="old", retry=once)
        await clock.advance(0.1)
        await sched.cancel(doomed.id)
        await sched.cancel(older.id)
        await clock.advance(6)                  # past the timeout, then past the lease TTL without a heartbeat
        for handle in (slow, silent):
            with pytest.raises(cronoq.TaskFailed):
                await asyncio.wait_for(handle, WAIT)
        assert heard == {slow.id: "timeout", doomed.id: "cancelled", silent.id: "lease expired"}
        assert len(plain) == 1                  # called with the lease alone, and it worked


def test_a_runner_that_declares_it_takes_the_reason_gets_it_without_a_signature_to_read():
    # As the package's runners compiled with mypyc: aborter cannot read their
    # abort's parameters, and a cluster member's aborts go through it too.
    from cronoq.runtime.local import LocalRunner
    from cronoq.runtime.runner import aborter
    from cronoq.runtime.threads import ThreadRunner

    heard: dict[int, str] = {}

    class Declared:
        abort_takes_reason = True

        def __init__(self) -> None:
            self.abort = heard.__setitem__   # a builtin: its parameters are not called reason

    aborter(Declared())(7, "timeout")   # type: ignore[arg-type]
    assert heard == {7: "timeout"}
    assert LocalRunner.abort_takes_reason and ThreadRunner.abort_takes_reason


@pytest.mark.asyncio
async def test_an_executor_reads_why_its_attempt_was_given_up():
    reasons: list[str | None] = []
    started: dict[str, asyncio.Event] = {}

    async def work(ctx, payload):
        started.setdefault(payload, asyncio.Event()).set()
        assert ctx.abort_reason is None
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            reasons.append(ctx.abort_reason)
            raise

    pool = cronoq.Pool("default", work, min=1, max=1, initial=1, autoscale=False)
    async with cronoq.Scheduler([pool]) as sched:
        timed = await sched.submit("x", timeout=0.05, retry=cronoq.RetryPolicy(max_attempts=1))
        with pytest.raises(cronoq.TaskFailed):
            await asyncio.wait_for(timed, WAIT)
        running = await sched.submit("y")
        await asyncio.wait_for(started.setdefault("y", asyncio.Event()).wait(), WAIT)
        await sched.cancel(running.id)
        with pytest.raises(cronoq.TaskFailed):
            await asyncio.wait_for(running, WAIT)
        await until(lambda: len(reasons) == 2)   # the executor's own task ends after the cancel
    assert reasons == ["timeout", "cancelled"]
