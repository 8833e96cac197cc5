"""Executors: where they run, what they learn, how their failures and
cancellations are handled."""

import asyncio
import concurrent.futures
import threading
import time

import pytest

import cronoq

NO_JITTER = cronoq.RetryPolicy(max_attempts=3, initial_backoff=1.0, jitter=False)


def fixed(name, executor, capacity=1, **kwargs):
    return cronoq.Pool(name, executor, min=capacity, max=max(capacity, 1), initial=capacity,
                       autoscale=False, **kwargs)


async def failure(handle):
    with pytest.raises(cronoq.TaskFailed) as info:
        await handle
    return info.value


# ---------------------------------------------------------------- where executors run


@pytest.mark.asyncio
async def test_async_executor_runs_on_the_scheduler_loop_thread():
    loop = asyncio.get_running_loop()

    async def run(ctx, x):
        return asyncio.get_running_loop(), threading.get_ident(), x + 1

    async with cronoq.Scheduler([fixed("default", run)]) as sched:
        ran_loop, thread, value = await (await sched.submit(1))
    assert ran_loop is loop
    assert thread == threading.get_ident()
    assert value == 2


@pytest.mark.asyncio
async def test_plain_function_runs_on_threads_of_its_pool_not_the_default_executor():
    loop = asyncio.get_running_loop()
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="cronoq-test-default")
    loop.set_default_executor(pool)

    def run(ctx, x):
        with pytest.raises(RuntimeError):
            asyncio.get_running_loop()      # not on the loop
        return threading.current_thread().name, x * 3

    async with cronoq.Scheduler([fixed("crunch", run, capacity=2)]) as sched:
        handles = [await sched.submit(i, pool="crunch") for i in range(4)]
        results = [await h for h in handles]
    assert [v for _, v in results] == [0, 3, 6, 9]
    names = {name for name, _ in results}
    assert names <= {"cronoq-crunch-1", "cronoq-crunch-2"}, names


@pytest.mark.asyncio
async def test_blocking_plain_function_does_not_stall_the_loop():
    release = threading.Event()

    def blocking(ctx, x):
        assert release.wait(10)
        return x

    async def quick(ctx, x):
        return x

    pools = [fixed("slow", blocking), fixed("fast", quick)]
    async with cronoq.Scheduler(pools) as sched:
        slow = await sched.submit("slow", pool="slow")
        # the loop still serves the other pool while the thread blocks
        assert await (await sched.submit("fast", pool="fast")) == "fast"
        assert not slow.done()
        release.set()
        assert await slow == "slow"


# ---------------------------------------------------------------- the context


@pytest.mark.asyncio
async def test_task_context_fields():
    clock = cronoq.VirtualClock()
    seen = {}

    async def run(ctx, payload):
        seen.update(id=ctx.id, attempt=ctx.attempt, kind=ctx.kind, key=ctx.key, pool=ctx.pool,
                    tags=ctx.tags, timeout=ctx.timeout, deadline=ctx.deadline, group=ctx.group,
                    heartbeat=ctx.heartbeat(), cancelled=ctx.is_cancelled(),
                    tag=ctx.tag("team"), missing_tag=ctx.tag("nope"), lease=ctx.lease)
        return payload

    pool = fixed("gpu", run, capacity=0)
    async with cronoq.Scheduler([pool], clock=clock) as sched:
        await sched.set_group_capacity("gpu", {"model": "a100"}, 1)
        handle = await sched.submit({"p": 1}, pool="gpu", kind="train", key="job-1",
                                    tags={"team": "ml"}, timeout=30.0, deadline_in=120.0,
                                    labels={"model": "a100"})
        assert await handle == {"p": 1}
    assert seen == dict(id=handle.id, attempt=1, kind="train", key="job-1", pool="gpu",
                        tags={"team": "ml"}, timeout=30.0, deadline=pytest.approx(clock.now() + 120.0),
                        group={"model": "a100"}, heartbeat=True, cancelled=False,
                        tag="ml", missing_tag=None, lease=seen["lease"])
    assert isinstance(seen["lease"], int)


@pytest.mark.asyncio
async def test_task_context_defaults_for_a_plain_task():
    seen = {}

    def run(ctx, payload):    # a sync executor gets the same context
        seen.update(kind=ctx.kind, key=ctx.key, tags=ctx.tags, timeout=ctx.timeout,
                    deadline=ctx.deadline, group=ctx.group, attempt=ctx.attempt, pool=ctx.pool)
        return None

    async with cronoq.Scheduler([fixed("default", run)]) as sched:
        assert await (await sched.submit()) is None
    assert seen == dict(kind="default", key=None, tags={}, timeout=None, deadline=None, group={},
                        attempt=1, pool="default")


@pytest.mark.asyncio
async def test_context_tags_are_a_copy():
    async def run(ctx, payload):
        ctx.tags["team"] = "changed"
        return ctx.tags["team"], ctx.tag("team")

    async with cronoq.Scheduler([fixed("default", run)]) as sched:
        # each read is a fresh copy: the executor cannot alter the task's tags
        assert await (await sched.submit(tags={"team": "ml"})) == ("ml", "ml")


@pytest.mark.asyncio
async def test_attempt_numbers_increase_and_id_stays():
    clock = cronoq.VirtualClock()
    seen = []

    async def run(ctx, payload):
        seen.append((ctx.id, ctx.attempt))
        if ctx.attempt < 3:
            raise RuntimeError("flaky")
        return "ok"

    async with cronoq.Scheduler([fixed("default", run, retry=NO_JITTER)], clock=clock) as sched:
        handle = await sched.submit()
        await clock.advance(10)
        assert await handle == "ok"
    assert seen == [(handle.id, 1), (handle.id, 2), (handle.id, 3)]


# ---------------------------------------------------------------- failures


@pytest.mark.asyncio
async def test_retryable_retry_after_delays_the_retry_at_least_that_long():
    clock = cronoq.VirtualClock()
    starts = []

    async def run(ctx, payload):
        starts.append((ctx.attempt, clock.now()))
        if ctx.attempt == 1:
            raise cronoq.Retryable("rate limited", retry_after=30.0)
        return "done"

    policy = cronoq.RetryPolicy(max_attempts=3, initial_backoff=0.5, jitter=False)
    async with cronoq.Scheduler([fixed("default", run, retry=policy)], clock=clock) as sched:
        t0 = clock.now()
        handle = await sched.submit()
        await clock.advance(0)
        assert starts == [(1, t0)]
        assert (await sched.info(handle.id)).status == "retrying"
        # the driver sleeps exactly until the retry is due: no earlier tick
        assert clock.next_timer() == pytest.approx(t0 + 30.0)
        await clock.advance(29.9)
        assert len(starts) == 1 and not handle.done()
        await clock.advance(0.1)
        assert await handle == "done"
    assert starts == [(1, t0), (2, t0 + 30.0)]


@pytest.mark.asyncio
async def test_retry_after_shorter_than_backoff_keeps_the_backoff():
    clock = cronoq.VirtualClock()
    starts = []

    async def run(ctx, payload):
        starts.append(clock.now())
        if ctx.attempt == 1:
            raise cronoq.Retryable("soon", retry_after=0.1)
        return "done"

    policy = cronoq.RetryPolicy(max_attempts=2, initial_backoff=5.0, jitter=False)
    async with cronoq.Scheduler([fixed("default", run, retry=policy)], clock=clock) as sched:
        handle = await sched.submit()
        await clock.advance(4.9)
        assert len(starts) == 1
        await clock.advance(0.1)
        assert await handle == "done"
    assert starts[1] - starts[0] == pytest.approx(5.0)


@pytest.mark.asyncio
async def test_permanent_fails_without_retry():
    calls = []

    async def run(ctx, payload):
        calls.append(ctx.attempt)
        raise cronoq.Permanent("bad request")

    async with cronoq.Scheduler([fixed("default", run, retry=NO_JITTER)]) as sched:
        handle = await sched.submit(key="p")
        err = await failure(handle)
        info = await sched.info("p")
        snap = await sched.snapshot()
    assert (err.status, err.message, err.task_id) == ("failed", "bad request", handle.id)
    assert calls == [1]
    assert (info.status, info.attempt, info.message) == ("failed", 1, "bad request")
    assert snap.totals["failed"] == 1 and snap.totals["retries"] == 0


@pytest.mark.asyncio
async def test_any_other_exception_is_retried_then_dead_lettered_with_its_message():
    clock = cronoq.VirtualClock()
    calls = []

    async def run(ctx, payload):
        calls.append((ctx.attempt, clock.now()))
        raise ValueError(f"boom {ctx.attempt}")

    async with cronoq.Scheduler([fixed("default", run, retry=NO_JITTER)], clock=clock) as sched:
        t0 = clock.now()
        handle = await sched.submit()
        await clock.advance(10)
        err = await failure(handle)
        snap = await sched.snapshot()
    # backoffs of 1 s then 2 s (initial 1.0, multiplier 2, no jitter)
    assert calls == [(1, t0), (2, t0 + 1.0), (3, t0 + 3.0)]
    assert err.status == "dead_lettered"
    assert "ValueError" in err.message and "boom 3" in err.message
    assert err.task_id == handle.id
    assert snap.totals["dead_lettered"] == 1 and snap.totals["retries"] == 2


@pytest.mark.asyncio
async def test_sync_executor_exceptions_follow_the_same_rules():
    calls = []

    def run(ctx, payload):
        calls.append((payload, ctx.attempt))
        if payload == "permanent":
            raise cronoq.Permanent("no way")
        if payload == "flaky" and ctx.attempt == 1:
            raise KeyError("missing")
        if payload == "broken":
            raise OSError("disk")
        return payload

    policy = cronoq.RetryPolicy(max_attempts=2, initial_backoff=0.001, jitter=False)
    async with cronoq.Scheduler([fixed("default", run, retry=policy)]) as sched:
        permanent = await sched.submit("permanent")
        flaky = await sched.submit("flaky")
        broken = await sched.submit("broken")
        perr = await failure(permanent)
        assert await flaky == "flaky"
        berr = await failure(broken)
    assert (perr.status, perr.message) == ("failed", "no way")
    assert berr.status == "dead_lettered" and "OSError" in berr.message and "disk" in berr.message
    assert sorted(calls) == [("broken", 1), ("broken", 2), ("flaky", 1), ("flaky", 2), ("permanent", 1)]


@pytest.mark.asyncio
async def test_retryable_without_retries_left_is_dead_lettered_with_its_message():
    async def run(ctx, payload):
        raise cronoq.Retryable("upstream down")

    pool = fixed("default", run, retry=cronoq.RetryPolicy.none())
    async with cronoq.Scheduler([pool]) as sched:
        err = await failure(await sched.submit())
    assert err.status == "dead_lettered"
    assert err.message.endswith("upstream down")


@pytest.mark.asyncio
async def test_per_task_retry_overrides_the_pool_policy():
    clock = cronoq.VirtualClock()
    calls = []

    async def run(ctx, payload):
        calls.append(ctx.attempt)
        raise cronoq.Retryable("no")

    async with cronoq.Scheduler([fixed("default", run, retry=NO_JITTER)], clock=clock) as sched:
        handle = await sched.submit(retry=cronoq.RetryPolicy(max_attempts=5, initial_backoff=2.0,
                                                            multiplier=1.0, jitter=False))
        await clock.advance(100)
        err = await failure(handle)
    assert err.status == "dead_lettered"
    assert calls == [1, 2, 3, 4, 5]


@pytest.mark.asyncio
async def test_failure_messages_are_cleaned():
    async def run(ctx, payload):
        raise cronoq.Permanent("nul\x00here" + "x" * 10_000)

    async with cronoq.Scheduler([fixed("default", run)]) as sched:
        err = await failure(await sched.submit())
    assert "\x00" not in err.message
    assert err.message.startswith("nul\ufffdhere")
    assert len(err.message) == 8192


# ---------------------------------------------------------------- cancellation of attempts


class Recorder:
    """An async executor that blocks until released and records cancellations."""

    def __init__(self):
        self.events = []
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, ctx, payload):
        self.events.append(("start", ctx.attempt))
        self.started.set()
        if payload == "wait" and ctx.attempt == 1:
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.events.append(("cancelled", ctx.attempt, ctx.is_cancelled(), ctx.heartbeat()))
                self.cancelled.set()
                raise
        return f"attempt {ctx.attempt}"


@pytest.mark.asyncio
async def test_cancel_cancels_the_executors_asyncio_task():
    rec = Recorder()
    async with cronoq.Scheduler([fixed("default", rec)]) as sched:
        handle = await sched.submit("wait", key="c")
        await asyncio.wait_for(rec.started.wait(), 5)
        assert await sched.cancel("c") is True
        err = await failure(handle)
        await asyncio.wait_for(rec.cancelled.wait(), 5)
        # the slot is free again and the scheduler carries on
        assert await (await sched.submit("next")) == "attempt 1"
        assert await sched.cancel("c") is False
    assert err.status == "cancelled"
    assert rec.events == [("start", 1), ("cancelled", 1, True, False), ("start", 1)]


@pytest.mark.asyncio
async def test_timeout_cancels_the_attempt_and_the_next_attempt_runs():
    clock = cronoq.VirtualClock()
    rec = Recorder()
    async with cronoq.Scheduler([fixed("default", rec, retry=NO_JITTER)], clock=clock) as sched:
        handle = await sched.submit("wait", timeout=10.0)
        await asyncio.wait_for(rec.started.wait(), 5)
        await clock.advance(9.9)
        assert rec.events == [("start", 1)]
        await clock.advance(0.1)
        await asyncio.wait_for(rec.cancelled.wait(), 5)
        assert (await sched.info(handle.id)).status == "retrying"
        await clock.advance(1.0)      # the backoff
        assert await handle == "attempt 2"
        snap = await sched.snapshot()
    assert rec.events == [("start", 1), ("cancelled", 1, True, False), ("start", 2)]
    assert snap.totals["timeouts"] == 1


@pytest.mark.asyncio
async def test_lost_lease_cancels_the_attempt_and_the_next_attempt_runs():
    clock = cronoq.VirtualClock()
    rec = Recorder()     # never heartbeats
    pool = fixed("default", rec, retry=NO_JITTER, lease_ttl=5.0)
    async with cronoq.Scheduler([pool], clock=clock) as sched:
        handle = await sched.submit("wait")
        await asyncio.wait_for(rec.started.wait(), 5)
        await clock.advance(4.9)
        assert rec.events == [("start", 1)]
        await clock.advance(0.1)
        await asyncio.wait_for(rec.cancelled.wait(), 5)
        await clock.advance(1.0)
        assert await handle == "attempt 2"
        snap = await sched.snapshot()
    assert rec.events == [("start", 1), ("cancelled", 1, True, False), ("start", 2)]
    assert snap.totals["lease_expiries"] == 1


@pytest.mark.asyncio
async def test_heartbeats_keep_a_lease_alive():
    clock = cronoq.VirtualClock()

    async def run(ctx, payload):
        for _ in range(10):           # 20 s of work with a 5 s lease
            await clock.sleep(2.0)
            assert ctx.heartbeat() is True
        return ctx.attempt

    pool = fixed("default", run, retry=NO_JITTER, lease_ttl=5.0)
    async with cronoq.Scheduler([pool], clock=clock) as sched:
        handle = await sched.submit()
        await clock.advance(21)
        assert await handle == 1
        snap = await sched.snapshot()
    assert snap.totals["lease_expiries"] == 0


@pytest.mark.asyncio
async def test_heartbeats_from_a_sync_executor_thread_keep_a_lease_alive():
    # Real time here: the thread heartbeats every 20 ms for 0.4 s against a 0.3 s TTL.
    def run(ctx, payload):
        deadline = time.monotonic() + 0.4
        while time.monotonic() < deadline:
            assert ctx.heartbeat() is True
            time.sleep(0.02)
        return ctx.attempt

    pool = fixed("default", run, retry=cronoq.RetryPolicy.none(), lease_ttl=0.3)
    async with cronoq.Scheduler([pool]) as sched:
        assert await (await sched.submit()) == 1
        assert (await sched.snapshot()).totals["lease_expiries"] == 0


@pytest.mark.asyncio
async def test_cancelled_sync_executor_sees_is_cancelled_and_its_result_is_ignored():
    loop = asyncio.get_running_loop()
    started = asyncio.Event()
    observed = asyncio.Event()
    seen = []

    def run(ctx, payload):
        if payload == "long":
            loop.call_soon_threadsafe(started.set)
            for _ in range(5000):
                if ctx.is_cancelled():
                    seen.append(("cancelled seen", ctx.heartbeat()))
                    loop.call_soon_threadsafe(observed.set)
                    return "stale result"
                time.sleep(0.001)
            seen.append("never cancelled")
        return payload

    async with cronoq.Scheduler([fixed("default", run)]) as sched:
        handle = await sched.submit("long")
        await asyncio.wait_for(started.wait(), 5)
        assert await sched.cancel(handle.id) is True
        err = await failure(handle)
        await asyncio.wait_for(observed.wait(), 10)
        assert await (await sched.submit("after")) == "after"
        info = await sched.info(handle.id)
    assert err.status == "cancelled"
    assert info.status == "cancelled"
    assert seen == [("cancelled seen", False)]


@pytest.mark.asyncio
async def test_executor_that_swallows_cancellation_overlaps_its_retry_without_breaking_anything():
    clock = cronoq.VirtualClock()
    events = []
    swallowed = asyncio.Event()
    release = asyncio.Event()
    ended = asyncio.Event()

    async def run(ctx, payload):
        events.append(("start", payload, ctx.attempt))
        if payload == "stubborn" and ctx.attempt == 1:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                events.append(("swallowed", payload, ctx.attempt, ctx.is_cancelled()))
                swallowed.set()
            await release.wait()       # keeps running after the abort
            events.append(("late end", payload, ctx.attempt))
            ended.set()
            return "stale"
        return f"fresh {payload}"

    policy = cronoq.RetryPolicy(max_attempts=2, initial_backoff=1.0, jitter=False)
    async with cronoq.Scheduler([fixed("default", run, retry=policy)], clock=clock) as sched:
        handle = await sched.submit("stubborn", timeout=5.0)
        await clock.advance(5.0)
        await asyncio.wait_for(swallowed.wait(), 5)
        await clock.advance(1.0)
        # capacity is 1, yet the retry runs while the swallowing attempt goes on
        assert await handle == "fresh stubborn"
        release.set()
        await asyncio.wait_for(ended.wait(), 5)
        # the stale output was dropped and the scheduler still works
        assert await (await sched.submit("next")) == "fresh next"
        assert await (await sched.handle(handle.id)) == "fresh stubborn"
        snap = await sched.snapshot()
    assert events == [("start", "stubborn", 1), ("swallowed", "stubborn", 1, True),
                      ("start", "stubborn", 2), ("late end", "stubborn", 1), ("start", "next", 1)]
    assert snap.totals["succeeded"] == 2 and snap.totals["timeouts"] == 1
    assert snap.pool("default").busy == 0


@pytest.mark.asyncio
async def test_executor_swallowing_cancel_does_not_break_later_tasks():
    release = asyncio.Event()
    swallowed = asyncio.Event()
    started = asyncio.Event()

    async def run(ctx, payload):
        if payload == "stubborn":
            started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                swallowed.set()
            await release.wait()
            return "ignored"
        return payload * 2

    async with cronoq.Scheduler([fixed("default", run, capacity=2)]) as sched:
        stubborn = await sched.submit("stubborn")
        await asyncio.wait_for(started.wait(), 5)
        await sched.cancel(stubborn.id)
        await asyncio.wait_for(swallowed.wait(), 5)
        results = [await (await sched.submit(i)) for i in range(5)]
        release.set()
        results += [await (await sched.submit(i)) for i in range(5, 8)]
        err = await failure(stubborn)
        snap = await sched.snapshot()
    assert results == [i * 2 for i in range(8)]
    assert err.status == "cancelled"
    assert snap.totals["succeeded"] == 8 and snap.totals["cancelled"] == 1
    assert snap.pool("default").busy == 0


@pytest.mark.asyncio
async def test_executors_that_never_suspend_still_let_the_loop_run():
    # A worker running 1000 instant executors back to back must yield now and then.
    ticks = 0
    seen = []

    async def instant(ctx, x):
        seen.append(ticks)
        return x

    async def ticker():
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    async with cronoq.Scheduler([fixed("default", instant)]) as sched:
        handles = [await sched.submit(i) for i in range(1000)]
        tick_task = asyncio.get_running_loop().create_task(ticker())
        try:
            assert [await h for h in handles] == list(range(1000))
        finally:
            tick_task.cancel()
    assert len(seen) == 1000
    assert len(set(seen)) > 1      # the ticker ran while the backlog was being worked off
