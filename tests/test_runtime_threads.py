"""Plain-function executors run on threads their pool owns (issue 10, point 6),
and a dispatch that finds no thread uses no attempt (point 2)."""

import asyncio
import concurrent.futures
import logging
import os
import threading

import pytest

import cronoq
from cronoq.runtime import threads as runner_module
from cronoq.telemetry import prometheus

# How many threads the loop's default executor has on this machine (asyncio's rule).
DEFAULT_EXECUTOR_THREADS = min(32, (os.cpu_count() or 1) + 4)
WAIT = 20     # seconds; only reached when a test fails


def fixed(name, executor, capacity=1, **kwargs):
    return cronoq.Pool(name, executor, min=capacity, max=max(capacity, 1), initial=capacity,
                       autoscale=False, **kwargs)


async def until(predicate, timeout=WAIT):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "the condition never came true"
        await asyncio.sleep(0.005)


@pytest.mark.asyncio
async def test_a_sync_pool_runs_as_many_functions_at_once_as_its_capacity():
    # More than the default executor holds: each function waits for all the others.
    n = DEFAULT_EXECUTOR_THREADS + 2
    barrier = threading.Barrier(n, timeout=WAIT)

    def meet(ctx, i):
        barrier.wait()
        return threading.current_thread().name

    async with cronoq.Scheduler([fixed("wide", meet, capacity=n)]) as sched:
        handles = [await sched.submit(i, pool="wide", retry=cronoq.RetryPolicy.none()) for i in range(n)]
        names = [await h for h in handles]
        snap = (await sched.snapshot()).pool("wide")
    assert sorted(names) == sorted(f"cronoq-wide-{i}" for i in range(1, n + 1))
    assert snap.succeeded == n and snap.stray_threads == 0


@pytest.mark.asyncio
async def test_hung_timed_out_functions_do_not_starve_healthy_ones():
    # As many hung functions as the default executor has threads, each timed out.
    n = DEFAULT_EXECUTOR_THREADS
    release = threading.Event()
    started = []

    def work(ctx, payload):
        if payload == "hang":
            started.append(ctx.id)
            release.wait(10 * WAIT)   # set by the test when it ends
            return "late"
        return "healthy"

    clock = cronoq.VirtualClock()
    try:
        async with cronoq.Scheduler([fixed("default", work, capacity=n)], shutdown_grace=0,
                                    clock=clock) as sched:
            hung = [await sched.submit("hang", timeout=0.05, retry=cronoq.RetryPolicy.none()) for _ in range(n)]
            await until(lambda: len(started) == n)     # every one runs on a thread of its own
            await clock.advance(0.05)                  # then they all time out
            for handle in hung:
                with pytest.raises(cronoq.TaskFailed) as info:
                    await asyncio.wait_for(handle, WAIT)
                assert "timed out" in info.value.message
            assert len(started) == n
            healthy = await sched.submit("ok")
            assert await asyncio.wait_for(healthy, WAIT) == "healthy"
            # Every hung function still holds its thread (counted); the engine's slots are free.
            pool = (await sched.snapshot()).pool("default")
            assert (pool.stray_threads, pool.busy) == (n, 0)
    finally:
        release.set()


@pytest.mark.asyncio
async def test_a_given_up_function_keeps_its_thread_until_it_returns(caplog, monkeypatch):
    monkeypatch.setattr(runner_module, "STRAY_WARNING_SECONDS", 0.0)
    loop = asyncio.get_running_loop()
    release = threading.Event()
    entered = asyncio.Event()
    seen = []

    def work(ctx, payload):
        seen.append((payload, threading.current_thread().name))
        if payload == "stuck":
            loop.call_soon_threadsafe(entered.set)
            release.wait(WAIT)      # ignores ctx.is_cancelled()
        return payload

    with caplog.at_level(logging.DEBUG, logger="cronoq"):
        async with cronoq.Scheduler([fixed("p", work, capacity=1)]) as sched:
            stuck = await sched.submit("stuck", pool="p", retry=cronoq.RetryPolicy.none())
            await asyncio.wait_for(entered.wait(), WAIT)
            assert await sched.cancel(stuck.id) is True
            await until(lambda: any(getattr(r, "action", None) == "stray_thread" for r in caplog.records))
            snap = await sched.snapshot()
            assert snap.pool("p").stray_threads == 1
            [gauge] = [f for f in prometheus.families(snap) if f.name == "cronoq_pool_stray_threads"]
            assert [(s.labels, s.value) for s in gauge.samples] == [({"pool": "p"}, 1)]
            # The next attempt gets a thread of its own at once.
            assert await asyncio.wait_for(await sched.submit("next", pool="p"), WAIT) == "next"
            release.set()
            await until(lambda: sched._driver.runners["p"].stray_threads == 0)
            # The stray came back: it is reused, no third thread is started.
            assert await asyncio.wait_for(await sched.submit("again", pool="p"), WAIT) == "again"
            assert (await sched.snapshot()).pool("p").stray_threads == 0
    assert [name for _, name in seen] == ["cronoq-p-1", "cronoq-p-2", seen[2][1]]
    assert seen[2][1] in ("cronoq-p-1", "cronoq-p-2")
    [warning] = [r for r in caplog.records if getattr(r, "action", None) == "stray_thread"]
    assert warning.levelname == "WARNING" and warning.task_id == stuck.id and warning.pool == "p"


@pytest.mark.asyncio
async def test_threads_start_lazily_and_are_reused():
    names = []

    def work(ctx, payload):
        names.append(threading.current_thread().name)
        return payload

    async with cronoq.Scheduler([fixed("lazy", work, capacity=8)]) as sched:
        runner = sched._driver.runners["lazy"]
        assert runner.threads == 0
        for i in range(5):      # one at a time: one thread is enough
            assert await (await sched.submit(i, pool="lazy")) == i
        assert runner.threads == 1
    assert names == ["cronoq-lazy-1"] * 5


@pytest.mark.asyncio
async def test_a_shut_down_default_executor_does_not_fail_sync_attempts():
    # What interpreter exit does to the default executor before atexit hooks run.
    loop = asyncio.get_running_loop()
    executor = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    loop.set_default_executor(executor)
    executor.shutdown()
    async with cronoq.Scheduler([fixed("default", lambda ctx, x: x + 1)]) as sched:
        handle = await sched.submit(1, retry=cronoq.RetryPolicy.none())
        assert await asyncio.wait_for(handle, WAIT) == 2
        assert (await sched.info(handle.id)).attempt == 1


@pytest.mark.asyncio
async def test_a_dispatch_that_finds_no_thread_waits_without_using_an_attempt(monkeypatch, caplog):
    clock = cronoq.VirtualClock()
    attempts = []
    real_start = threading.Thread.start
    failures = [RuntimeError("can't start new thread")]

    def start(thread):
        if thread.name.startswith("cronoq-") and failures:
            raise failures.pop()
        return real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start)

    def work(ctx, payload):
        attempts.append(ctx.attempt)
        return payload

    with caplog.at_level(logging.WARNING, logger="cronoq"):
        async with cronoq.Scheduler([fixed("default", work)], clock=clock) as sched:
            handle = await sched.submit("x", retry=cronoq.RetryPolicy.none())
            await until(lambda: clock.pending > 0)    # the retry timer of the give-back
            info = await sched.info(handle.id)
            assert (info.status, info.attempt) == ("retrying", 0)
            await clock.advance(1.0)
            assert await asyncio.wait_for(handle, WAIT) == "x"
            totals = (await sched.snapshot()).totals
    assert attempts == [1]
    assert totals["failed"] == 0 and totals["retries"] == 0
    [record] = [r for r in caplog.records if getattr(r, "action", None) == "not_started"]
    assert "can't start new thread" in record.getMessage()


@pytest.mark.asyncio
async def test_shutdown_gives_back_dispatches_no_thread_had_started():
    store = cronoq.store.InMemoryStore()
    gate = threading.Event()
    running = threading.Event()

    def work(ctx, payload):
        running.set()
        gate.wait(WAIT)
        return payload

    sched = cronoq.Scheduler([fixed("default", work, capacity=2)], store=store, shutdown_grace=0)
    await sched.start()
    runner = sched._driver.runners["default"]
    hand_over = runner._hand_over
    held = []

    def hold_second(job):   # the second dispatch stays queued, as if its thread had not taken it yet
        if held or not runner.current or len(runner.current) < 2:
            return hand_over(job)
        held.append(job)

    runner._hand_over = hold_second
    try:
        first = await sched.submit("a", retry=cronoq.RetryPolicy.none())
        second = await sched.submit("b", retry=cronoq.RetryPolicy.none())
        await until(lambda: len(runner.current) == 2 and held and running.is_set())
    finally:
        await sched.shutdown()
        gate.set()
    rows = {row.id: row for row in (await store.recover(0, 0)).tasks}
    assert (rows[first.id].status, rows[first.id].attempt) == ("running", 1)    # it ran: at least once
    assert (rows[second.id].status, rows[second.id].attempt) == ("ready", 0)    # it never started


class GatedStore(cronoq.store.InMemoryStore):
    """Holds the commit that makes an attempt 'running' until the test opens the gate."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.holding = asyncio.Event()

    async def commit(self, epoch, batch):
        if any(row.status == "running" for row in batch.statuses):
            self.holding.set()
            await self.gate.wait()
        await super().commit(epoch, batch)


@pytest.mark.asyncio
async def test_a_dispatch_committed_after_shutdown_began_is_given_back_not_started():
    store = GatedStore()
    ran = []

    async def work(ctx, payload):
        ran.append(payload)
        return payload

    sched = cronoq.Scheduler([fixed("default", work)], store=store, shutdown_grace=WAIT)
    await sched.start()
    submitting = asyncio.create_task(sched.submit("x"))
    await asyncio.wait_for(store.holding.wait(), WAIT)   # its dispatch waits for this commit
    stopping = asyncio.create_task(sched.shutdown())
    await asyncio.sleep(0)                               # the shutdown has begun
    store.gate.set()
    await asyncio.wait_for(stopping, WAIT)
    handle = await submitting
    with pytest.raises(cronoq.TaskFailed) as info:
        await handle
    assert info.value.status == "shutdown"
    assert ran == []
    [row] = (await store.recover(0, 0)).tasks
    assert (row.status, row.attempt) == ("ready", 0)
