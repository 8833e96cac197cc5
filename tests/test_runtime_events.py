"""Status event streams: terminal events, transitions, lag, end of stream."""

import asyncio

import pytest

import cronoq

TERMINAL = {"succeeded", "failed", "dead_lettered", "cancelled", "skipped", "missed", "shed"}


def fixed(name, executor, capacity=1, **kwargs):
    return cronoq.Pool(name, executor, min=capacity, max=max(capacity, 1), initial=capacity,
                       autoscale=False, **kwargs)


async def run(ctx, payload):
    if payload == "fail":
        raise cronoq.Permanent("broken")
    if payload == "flaky" and ctx.attempt == 1:
        raise cronoq.Retryable("again")
    return payload


async def collect(events, n):
    out = []
    async for e in events:
        out.append(e)
        if len(out) == n:
            break
    return out


async def settle():
    for _ in range(5):
        await asyncio.sleep(0)


@pytest.mark.asyncio
async def test_default_stream_delivers_only_terminal_events_with_all_fields():
    clock = cronoq.VirtualClock()
    retry = cronoq.RetryPolicy(max_attempts=2, initial_backoff=1.0, jitter=False)
    async with cronoq.Scheduler([fixed("default", run, retry=retry)], clock=clock) as sched:
        async with sched.events() as events:
            assert isinstance(events, cronoq.EventStream)
            ok = await sched.submit("ok", key="ok")
            bad = await sched.submit("fail", key="bad")
            flaky = await sched.submit("flaky")
            later = await sched.submit("later", start_in=100)
            await sched.cancel(later.id)
            await clock.advance(1.0)
            got = await asyncio.wait_for(collect(events, 4), 5)
            events.close()
            assert [e async for e in events] == []     # nothing but the four terminal events
    by_id = {e.id: e for e in got}
    assert set(by_id) == {ok.id, bad.id, flaky.id, later.id}
    assert all(e.status in TERMINAL for e in got)
    t0 = clock.now() - 1.0
    e = by_id[ok.id]
    assert (e.id, e.pool, e.key, e.status, e.attempt, e.message) == (ok.id, "default", "ok", "succeeded", 1, None)
    assert e.at == pytest.approx(t0)
    e = by_id[bad.id]
    assert (e.key, e.status, e.attempt, e.message) == ("bad", "failed", 1, "broken")
    e = by_id[flaky.id]
    assert (e.status, e.attempt, e.key) == ("succeeded", 2, None)
    assert e.at == pytest.approx(t0 + 1.0)
    e = by_id[later.id]
    assert (e.status, e.attempt) == ("cancelled", 0)


@pytest.mark.asyncio
async def test_emit_transitions_delivers_every_transition_in_order():
    clock = cronoq.VirtualClock()
    retry = cronoq.RetryPolicy(max_attempts=2, initial_backoff=1.0, jitter=False)
    pool = fixed("default", run, retry=retry)
    async with cronoq.Scheduler([pool], emit_transitions=True, clock=clock) as sched:
        async with sched.events() as events:
            flaky = await sched.submit("flaky", key="f")
            await clock.advance(1.0)
            assert await flaky == "flaky"
            got = await asyncio.wait_for(collect(events, 6), 5)
            fixed_start = await sched.submit("fs", start_in=10)
            parent = await sched.submit("ok", key="p", start_in=20)
            child = await sched.submit("child", after="p")
            await clock.advance(20)
            await child
            more = await asyncio.wait_for(collect(events, 9), 5)
    assert [(e.status, e.attempt) for e in got] == [
        ("ready", 0), ("running", 1), ("retrying", 1), ("ready", 1), ("running", 2), ("succeeded", 2)]
    assert all(e.id == flaky.id and e.key == "f" and e.pool == "default" for e in got)
    assert got[2].message == "again"
    by_task = {}
    for e in more:
        by_task.setdefault(e.id, []).append(e.status)
    assert by_task[fixed_start.id] == ["scheduled", "ready", "running", "succeeded"]
    assert by_task[parent.id][0] == "scheduled"
    assert by_task[child.id][0] == "blocked"


@pytest.mark.asyncio
async def test_several_streams_each_get_every_event():
    async with cronoq.Scheduler([fixed("default", run)]) as sched:
        async with sched.events() as a, sched.events() as b:
            handles = [await sched.submit(i) for i in range(5)]
            for h in handles:
                await h
            ga = await asyncio.wait_for(collect(a, 5), 5)
            gb = await asyncio.wait_for(collect(b, 5), 5)
    assert [e.id for e in ga] == [h.id for h in handles]
    assert [(e.id, e.status) for e in gb] == [(e.id, e.status) for e in ga]


@pytest.mark.asyncio
async def test_event_capacity_drops_oldest_and_counts_lagged():
    async with cronoq.Scheduler([fixed("default", run)], event_capacity=3) as sched:
        async with sched.events() as events:
            handles = [await sched.submit(i) for i in range(10)]
            for h in handles:
                await h
            assert events.lagged == 7
            got = await asyncio.wait_for(collect(events, 3), 5)
            assert [e.id for e in got] == [h.id for h in handles[-3:]]
            # it keeps going after the loss
            extra = await sched.submit("x")
            await extra
            [e] = await asyncio.wait_for(collect(events, 1), 5)
            assert (e.id, e.status) == (extra.id, "succeeded")
            assert events.lagged == 7


@pytest.mark.asyncio
async def test_on_lag_raise_raises_events_lagged_then_continues_with_buffered_events():
    async with cronoq.Scheduler([fixed("default", run)], event_capacity=4) as sched:
        events = sched.events(on_lag="raise")
        try:
            handles = [await sched.submit(i) for i in range(10)]
            for h in handles:
                await h
            with pytest.raises(cronoq.EventsLagged) as info:
                await events.__anext__()
            assert info.value.skipped == 6
            assert events.lagged == 6
            got = await asyncio.wait_for(collect(events, 4), 5)
            assert [e.id for e in got] == [h.id for h in handles[-4:]]
            # a later loss is reported with only the new count
            more = [await sched.submit(i) for i in range(5)]
            for h in more:
                await h
            with pytest.raises(cronoq.EventsLagged) as info:
                await events.__anext__()
            assert info.value.skipped == 1
            assert events.lagged == 7
            got = await asyncio.wait_for(collect(events, 4), 5)
            assert [e.id for e in got] == [h.id for h in more[-4:]]
        finally:
            await events.aclose()
        assert events.closed


@pytest.mark.asyncio
async def test_on_lag_must_be_drop_or_raise():
    async with cronoq.Scheduler([fixed("default", run)]) as sched:
        with pytest.raises(ValueError, match="on_lag"):
            sched.events(on_lag="block")


@pytest.mark.asyncio
async def test_streams_end_at_shutdown():
    sched = cronoq.Scheduler([fixed("default", run)])
    await sched.start()
    events = sched.events()
    received = []

    async def consume():
        async for e in events:
            received.append(e.status)
        return "ended"

    consumer = asyncio.get_running_loop().create_task(consume())
    await (await sched.submit(1))
    await sched.shutdown()
    assert await asyncio.wait_for(consumer, 5) == "ended"
    assert received == ["succeeded"]
    assert events.closed is True
    with pytest.raises(StopAsyncIteration):
        await events.__anext__()


@pytest.mark.asyncio
async def test_events_buffered_before_shutdown_are_still_delivered():
    sched = cronoq.Scheduler([fixed("default", run)])
    await sched.start()
    events = sched.events()
    handles = [await sched.submit(i) for i in range(3)]
    for h in handles:
        await h
    await sched.shutdown()
    got = [e.id async for e in events]
    assert got == [h.id for h in handles]


@pytest.mark.asyncio
async def test_closed_stream_stops_receiving_but_keeps_its_buffer():
    async with cronoq.Scheduler([fixed("default", run)]) as sched:
        events = sched.events()
        first = await sched.submit(1)
        await first
        events.close()
        assert events.closed is True
        assert events not in sched._driver.sinks
        second = await sched.submit(2)
        await second
        got = [e.id async for e in events]
        assert got == [first.id]
        events.close()   # idempotent


@pytest.mark.asyncio
async def test_leaving_async_with_closes_the_stream():
    async with cronoq.Scheduler([fixed("default", run)]) as sched:
        async with sched.events() as events:
            assert sched._driver.sinks == [events]
        assert events.closed and sched._driver.sinks == []


@pytest.mark.asyncio
async def test_waiting_consumer_is_woken_by_a_new_event():
    release = asyncio.Event()

    async def blocking(ctx, payload):
        await release.wait()
        return payload

    async with cronoq.Scheduler([fixed("default", blocking)]) as sched:
        async with sched.events() as events:
            handle = await sched.submit("v")
            waiting = asyncio.get_running_loop().create_task(events.__anext__())
            await settle()
            assert not waiting.done()
            release.set()
            event = await asyncio.wait_for(waiting, 5)
            assert (event.id, event.status) == (handle.id, "succeeded")


@pytest.mark.asyncio
async def test_shed_and_skipped_tasks_produce_terminal_events():
    release = asyncio.Event()

    async def blocking(ctx, payload):
        await release.wait()
        return payload

    pools = [fixed("default", blocking, max_pending=1, overflow="shed_oldest"), fixed("side", run)]
    async with cronoq.Scheduler(pools) as sched:
        async with sched.events() as events:
            running = await sched.submit("running")
            oldest = await sched.submit("oldest", priority="low", key="oldest")
            child = await sched.submit("child", pool="side", after="oldest")
            urgent = await sched.submit("urgent", priority="high")
            got = await asyncio.wait_for(collect(events, 2), 5)
            release.set()
            assert await running == "running"
            assert await urgent == "urgent"
            assert (await asyncio.wait_for(collect(events, 2), 5))[1].id == urgent.id
    assert [(e.id, e.status) for e in got] == [(oldest.id, "shed"), (child.id, "skipped")]
    assert got[0].message == "shed to admit more important work"
