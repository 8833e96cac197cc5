"""Backpressure (overflow="wait" / "reject") and shutdown."""

import asyncio
import threading
import time

import pytest

import cronoq


def waiting(sched) -> int:
    """Submitters waiting for queue room (the scheduler keeps one line per pool and class)."""
    return sum(len(line) for line in sched._admission.room.values())


def fixed(name, executor, capacity=1, **kwargs):
    return cronoq.Pool(name, executor, min=capacity, max=max(capacity, 1), initial=capacity,
                       autoscale=False, **kwargs)


async def failure(handle):
    with pytest.raises(cronoq.TaskFailed) as info:
        await handle
    return info.value


async def settle(rounds=10):
    for _ in range(rounds):
        await asyncio.sleep(0)


class Gate:
    def __init__(self):
        self.release = asyncio.Event()
        self.started = []
        self.cancelled = []
        self.any_started = asyncio.Event()

    async def __call__(self, ctx, payload):
        self.started.append(payload)
        self.any_started.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled.append(payload)
            raise
        return payload


# ---------------------------------------------------------------- backpressure


@pytest.mark.asyncio
async def test_overflow_wait_makes_submit_wait_for_room():
    clock = cronoq.VirtualClock()
    ran = []

    async def run(ctx, payload):
        ran.append(payload)
        await clock.sleep(1.0)
        return payload

    pool = fixed("default", run, max_pending=2, overflow="wait")
    async with cronoq.Scheduler([pool], clock=clock) as sched:
        handles = [await sched.submit(i) for i in range(3)]    # 1 running + 2 pending
        waiting = asyncio.get_running_loop().create_task(sched.submit(3))
        await settle()
        assert not waiting.done()
        assert (await sched.snapshot()).totals["submitted"] == 3
        await clock.advance(1.0)          # task 0 ends, task 1 starts: room for one
        handle3 = await asyncio.wait_for(waiting, 5)
        assert (await sched.snapshot()).totals["submitted"] == 4
        await clock.advance(10.0)
        assert [await h for h in handles] == [0, 1, 2]
        assert await handle3 == 3
    assert ran == [0, 1, 2, 3]


@pytest.mark.asyncio
async def test_waiting_submitters_are_admitted_one_per_free_place():
    clock = cronoq.VirtualClock()
    ran = []

    async def run(ctx, payload):
        ran.append(payload)
        await clock.sleep(1.0)
        return payload

    pool = fixed("default", run, max_pending=2, overflow="wait")
    async with cronoq.Scheduler([pool], clock=clock) as sched:
        for i in range(3):
            await sched.enqueue(i)
        loop = asyncio.get_running_loop()
        waiters = [loop.create_task(sched.submit(3)), loop.create_task(sched.enqueue(4))]
        await settle()
        assert not any(w.done() for w in waiters)
        await clock.advance(1.0)          # room for exactly one
        assert sum(w.done() for w in waiters) == 1
        assert (await sched.snapshot()).pool("default").pending == 2
        await clock.advance(1.0)          # and for the other
        assert all(w.done() for w in waiters)
        await clock.advance(10.0)
        snap = await sched.snapshot()
    assert sorted(ran) == [0, 1, 2, 3, 4]
    assert ran[:3] == [0, 1, 2]
    assert snap.totals["submitted"] == 5 and snap.totals["succeeded"] == 5


@pytest.mark.asyncio
async def test_cancelled_waiting_submitter_is_removed_and_not_admitted():
    gate = Gate()
    pool = fixed("default", gate, max_pending=1, overflow="wait")
    async with cronoq.Scheduler([pool]) as sched:
        first = await sched.submit("first")
        second = await sched.submit("second")
        waiter = asyncio.get_running_loop().create_task(sched.submit("never"))
        await settle()
        assert waiting(sched) == 1
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert waiting(sched) == 0
        later = asyncio.get_running_loop().create_task(sched.submit("later"))
        await settle()
        gate.release.set()
        assert [await first, await second] == ["first", "second"]
        assert await (await asyncio.wait_for(later, 5)) == "later"
        snap = await sched.snapshot()
    assert gate.started == ["first", "second", "later"]
    assert snap.totals["submitted"] == 3


@pytest.mark.asyncio
async def test_woken_submitter_cancelled_before_it_resumes_passes_its_turn_on():
    loop = asyncio.get_running_loop()
    forever = asyncio.Event()
    release_a = asyncio.Event()
    waiters = []

    async def run(ctx, payload):
        if payload == "a":
            await release_a.wait()
            # cancel the first waiting submitter in the very step that wakes it
            loop.call_soon(waiters[0].cancel)
            return "a"
        await forever.wait()
        return payload

    pool = fixed("default", run, max_pending=1, overflow="wait")
    async with cronoq.Scheduler([pool], shutdown_grace=0) as sched:
        a = await sched.submit("a")
        await sched.submit("b")
        waiters.append(loop.create_task(sched.submit("w1")))
        waiters.append(loop.create_task(sched.submit("w2")))
        await settle()
        assert waiting(sched) == 2
        release_a.set()
        assert await a == "a"
        with pytest.raises(asyncio.CancelledError):
            await waiters[0]
        handle = await asyncio.wait_for(waiters[1], 2)
        assert (await sched.info(handle.id)).status == "ready"


@pytest.mark.asyncio
async def test_many_waiting_submitters_all_get_in_exactly_once_in_arrival_order():
    clock = cronoq.VirtualClock()
    ran = []

    async def run(ctx, payload):
        ran.append(payload)
        await clock.sleep(1.0)
        return payload

    pool = fixed("default", run, max_pending=1, overflow="wait")
    async with cronoq.Scheduler([pool], clock=clock) as sched:
        await sched.submit(0)
        await sched.submit(1)
        loop = asyncio.get_running_loop()
        waiters = [loop.create_task(sched.submit(i)) for i in range(2, 8)]
        await settle()
        await sched.snapshot()        # unrelated calls in between change nothing
        await clock.advance(20.0)
        handles = [await asyncio.wait_for(w, 5) for w in waiters]
        assert [await h for h in handles] == [2, 3, 4, 5, 6, 7]
        assert waiting(sched) == 0
    assert ran == list(range(8))          # exactly once each, in arrival order


@pytest.mark.asyncio
async def test_a_waiter_for_one_pool_does_not_hold_up_another_pool():
    clock = cronoq.VirtualClock()
    ran = []

    async def slow(ctx, payload):
        ran.append(payload)
        await clock.sleep(100.0)
        return payload

    async def quick(ctx, payload):
        ran.append(payload)
        await clock.sleep(1.0)
        return payload

    pools = [fixed("a", slow, max_pending=1, overflow="wait"),
             fixed("b", quick, max_pending=1, overflow="wait")]
    async with cronoq.Scheduler(pools, clock=clock, shutdown_grace=0) as sched:
        for p in ("a", "b"):
            await sched.submit(f"{p}0", pool=p)
            await sched.submit(f"{p}1", pool=p)
        loop = asyncio.get_running_loop()
        waiting_a = loop.create_task(sched.submit("a2", pool="a"))
        await settle()
        waiting_b = loop.create_task(sched.submit("b2", pool="b"))
        await settle()
        await clock.advance(1.0)       # pool b has room now; pool a does not
        assert not waiting_a.done()
        handle = await asyncio.wait_for(waiting_b, 0.5)
        await clock.advance(2.0)
        assert await handle == "b2"


@pytest.mark.asyncio
async def test_waiting_batch_is_admitted_whole_when_room_appears():
    gate = Gate()
    pool = fixed("default", gate, max_pending=2, overflow="wait")
    async with cronoq.Scheduler([pool]) as sched:
        blocker = await sched.submit("blocker")
        await asyncio.wait_for(gate.any_started.wait(), 5)
        await sched.submit("p1")
        batch = asyncio.get_running_loop().create_task(
            sched.submit_batch([cronoq.Task("b1"), cronoq.Task("b2")]))
        await settle()
        assert not batch.done()
        assert (await sched.snapshot()).totals["submitted"] == 2
        gate.release.set()
        handles = await asyncio.wait_for(batch, 5)
        assert [await h for h in handles] == ["b1", "b2"]
        assert await blocker == "blocker"


@pytest.mark.asyncio
async def test_overflow_reject_raises_queue_full():
    gate = Gate()
    pool = fixed("default", gate, max_pending=2, overflow="reject")
    async with cronoq.Scheduler([pool]) as sched:
        handles = [await sched.submit(i) for i in range(3)]
        with pytest.raises(cronoq.QueueFull) as info:
            await sched.submit(3)
        assert info.value.index is None
        with pytest.raises(cronoq.QueueFull):
            await sched.enqueue(3)
        with pytest.raises(cronoq.QueueFull) as batch_info:
            await sched.submit_batch([cronoq.Task("x"), cronoq.Task("y")])
        assert batch_info.value.index == 0
        assert isinstance(batch_info.value, cronoq.AdmissionError)
        assert (await sched.snapshot()).totals["submitted"] == 3
        gate.release.set()
        assert [await h for h in handles] == [0, 1, 2]
        # room again
        assert await (await sched.submit(4)) == 4


@pytest.mark.asyncio
async def test_per_class_bounds_and_scheduler_wide_bound():
    gate = Gate()
    pool = fixed("default", gate, max_pending={"low": 1}, overflow="reject")
    async with cronoq.Scheduler([pool], max_pending_total=3) as sched:
        await sched.submit("running")
        await asyncio.wait_for(gate.any_started.wait(), 5)
        await sched.submit("low-1", priority="low")
        with pytest.raises(cronoq.QueueFull, match="low"):
            await sched.submit("low-2", priority="low")
        await sched.submit("n1")
        await sched.submit("n2")
        with pytest.raises(cronoq.QueueFull, match="scheduler"):
            await sched.submit("n3")
        gate.release.set()


@pytest.mark.asyncio
async def test_shutdown_fails_waiting_submitters():
    gate = Gate()
    pool = fixed("default", gate, max_pending=1, overflow="wait")
    sched = cronoq.Scheduler([pool], shutdown_grace=0)
    await sched.start()
    await sched.submit("a")
    await sched.submit("b")
    waiter = asyncio.get_running_loop().create_task(sched.submit("c"))
    await settle()
    await sched.shutdown()
    with pytest.raises(cronoq.SchedulerError):
        await asyncio.wait_for(waiter, 5)
    assert gate.started == ["a"]


# ---------------------------------------------------------------- shutdown


@pytest.mark.asyncio
async def test_running_attempts_finish_within_the_grace():
    gate = Gate()
    sched = cronoq.Scheduler([fixed("default", gate, capacity=2)], shutdown_grace=30.0)
    await sched.start()
    a = await sched.submit("a")
    b = await sched.submit("b")
    queued = await sched.submit("queued")
    await asyncio.wait_for(gate.any_started.wait(), 5)
    stopping = asyncio.get_running_loop().create_task(sched.shutdown())
    await settle()
    assert not stopping.done()
    # no longer admitting while stopping
    assert sched.running is False
    with pytest.raises(cronoq.SchedulerError):
        await sched.submit("too late")
    gate.release.set()
    await asyncio.wait_for(stopping, 5)
    assert [await a, await b] == ["a", "b"]
    err = await failure(queued)
    assert (err.status, err.task_id) == ("shutdown", queued.id)
    assert "shut down" in err.message
    assert gate.started == ["a", "b"] and gate.cancelled == []


@pytest.mark.asyncio
async def test_attempts_still_running_after_the_grace_are_cancelled():
    gate = Gate()
    sched = cronoq.Scheduler([fixed("default", gate)])
    await sched.start()
    running = await sched.submit("running")
    queued = [await sched.submit(f"q{i}") for i in range(3)]
    by_key = await sched.submit("keyed", key="k")
    extra_handle = await sched.handle("k")
    await asyncio.wait_for(gate.any_started.wait(), 5)
    t = time.monotonic()
    await sched.shutdown(grace=0.05)
    elapsed = time.monotonic() - t
    assert 0.04 <= elapsed < 2.0
    for handle in [running, *queued, by_key, extra_handle]:
        err = await failure(handle)
        assert err.status == "shutdown" and err.task_id == handle.id
    await settle()
    assert gate.started == ["running"]
    assert gate.cancelled == ["running"]


@pytest.mark.asyncio
async def test_async_with_exit_uses_shutdown_grace():
    gate = Gate()
    t = time.monotonic()
    async with cronoq.Scheduler([fixed("default", gate)], shutdown_grace=0.05) as sched:
        handle = await sched.submit("stuck")
        await asyncio.wait_for(gate.any_started.wait(), 5)
    assert time.monotonic() - t < 2.0
    assert (await failure(handle)).status == "shutdown"
    await settle()
    assert gate.cancelled == ["stuck"]


@pytest.mark.asyncio
async def test_shutdown_with_zero_grace_cancels_at_once():
    gate = Gate()
    sched = cronoq.Scheduler([fixed("default", gate)], shutdown_grace=60.0)
    await sched.start()
    handle = await sched.submit("stuck")
    await asyncio.wait_for(gate.any_started.wait(), 5)
    t = time.monotonic()
    await sched.shutdown(grace=0)
    assert time.monotonic() - t < 1.0
    assert (await failure(handle)).status == "shutdown"


@pytest.mark.asyncio
async def test_idle_shutdown_returns_immediately_and_scheduled_work_is_dropped():
    clock = cronoq.VirtualClock()
    ran = []

    async def run(ctx, payload):
        ran.append(payload)
        return payload

    sched = cronoq.Scheduler([fixed("default", run)], clock=clock, shutdown_grace=60.0)
    await sched.start()
    later = await sched.submit("later", start_in=10.0)
    await sched.add_recurring("r", "* * * * *")
    t = time.monotonic()
    await sched.shutdown()
    assert time.monotonic() - t < 1.0
    assert (await failure(later)).status == "shutdown"
    assert sched._driver.timer is None
    await clock.advance(600.0)
    assert ran == []


@pytest.mark.asyncio
async def test_concurrent_shutdowns_both_return_after_stop():
    gate = Gate()
    sched = cronoq.Scheduler([fixed("default", gate)], shutdown_grace=30.0)
    await sched.start()
    handle = await sched.submit("x")
    await asyncio.wait_for(gate.any_started.wait(), 5)
    loop = asyncio.get_running_loop()
    first = loop.create_task(sched.shutdown())
    second = loop.create_task(sched.shutdown())
    await settle()
    assert not first.done() and not second.done()
    gate.release.set()
    await asyncio.wait_for(asyncio.gather(first, second), 5)
    assert await handle == "x"
    assert sched._life.state == "stopped"


@pytest.mark.asyncio
async def test_sync_executor_is_told_it_was_cancelled_at_shutdown():
    loop = asyncio.get_running_loop()
    started = asyncio.Event()
    done = threading.Event()
    seen = []

    def run(ctx, payload):
        loop.call_soon_threadsafe(started.set)
        try:
            for _ in range(5000):
                if ctx.is_cancelled():
                    seen.append("cancelled")
                    return None
                time.sleep(0.001)
            seen.append("not cancelled")
        finally:
            done.set()

    sched = cronoq.Scheduler([fixed("default", run)], shutdown_grace=0.02)
    await sched.start()
    handle = await sched.submit()
    await asyncio.wait_for(started.wait(), 5)
    await sched.shutdown()
    assert (await failure(handle)).status == "shutdown"
    # the thread notices at its next check
    assert await asyncio.to_thread(done.wait, 10)
    assert seen == ["cancelled"]
