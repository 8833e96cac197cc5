"""TaskHandle as an asyncio future: gather, wait, as_completed, wait_for and
shield take it directly (no Task per handle), and cancelling a wait never
cancels the task."""

from __future__ import annotations

import asyncio

import pytest

import cronoq


async def double(ctx, x):
    if x == "fail":
        raise cronoq.Permanent("no")
    await asyncio.sleep(0)
    return 2 * x


def pool(executor=double, slots=4):
    return cronoq.Pool("default", executor, min=slots, max=slots, autoscale=False)


@pytest.mark.asyncio
async def test_a_handle_is_a_future_to_asyncio():
    async with cronoq.Scheduler([pool()]) as sched:
        handle = await sched.submit(1)
        assert asyncio.isfuture(handle)
        assert asyncio.ensure_future(handle) is handle
        assert handle.get_loop() is asyncio.get_running_loop()
        assert await handle == 2


@pytest.mark.asyncio
async def test_gather_over_handles_makes_no_task_per_handle():
    release = asyncio.Event()

    async def held(ctx, x):
        await release.wait()
        return x

    async with cronoq.Scheduler([pool(held, slots=100)]) as sched:
        handles = [await sched.submit(i) for i in range(100)]
        before = len(asyncio.all_tasks())
        gathering = asyncio.gather(*handles)
        await asyncio.sleep(0)
        assert len(asyncio.all_tasks()) == before      # no wrapping Task per handle
        release.set()
        assert await gathering == list(range(100))


@pytest.mark.asyncio
async def test_gather_reports_failures_as_task_failed():
    async with cronoq.Scheduler([pool()]) as sched:
        ok, bad = await sched.submit(1), await sched.submit("fail", retry=cronoq.RetryPolicy.none())
        results = await asyncio.gather(ok, bad, return_exceptions=True)
        assert results[0] == 2 and isinstance(results[1], cronoq.TaskFailed)
        assert results[1].status == "failed"
        with pytest.raises(cronoq.TaskFailed):
            await asyncio.gather(ok, bad)
        assert ok.exception() is None and isinstance(bad.exception(), cronoq.TaskFailed)


@pytest.mark.asyncio
async def test_wait_and_as_completed():
    async with cronoq.Scheduler([pool()]) as sched:
        handles = [await sched.submit(i) for i in range(5)]
        done, pending = await asyncio.wait(handles)
        assert done == set(handles) and not pending
        handles = [await sched.submit(i) for i in range(5)]
        seen = sorted([await f for f in asyncio.as_completed(handles)])
        assert seen == [0, 2, 4, 6, 8]


@pytest.mark.asyncio
async def test_cancelling_a_gather_cancels_the_waits_not_the_tasks():
    release = asyncio.Event()

    async def held(ctx, x):
        await release.wait()
        return x

    async with cronoq.Scheduler([pool(held)]) as sched:
        handles = [await sched.submit(i) for i in range(3)]
        waiting = asyncio.ensure_future(asyncio.gather(*handles))
        await asyncio.sleep(0.01)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert [(await sched.info(h.id)).status for h in handles] == ["running"] * 3
        assert not any(h.done() for h in handles)
        release.set()
        assert await asyncio.gather(*handles) == [0, 1, 2]     # a new wait starts afresh
        assert [h.status for h in handles] == ["succeeded"] * 3


@pytest.mark.asyncio
async def test_a_timed_out_wait_for_leaves_the_handle_usable_and_shield_works():
    release = asyncio.Event()

    async def held(ctx, x):
        await release.wait()
        return x

    async with cronoq.Scheduler([pool(held)]) as sched:
        handle = await sched.submit("v")
        for _ in range(2):
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(handle, 0.01)
        shielded = asyncio.shield(handle)
        release.set()
        assert await shielded == "v"
        assert await handle == "v" and handle.result() == "v"
        assert handle.cancel() is False      # a finished handle cannot be cancelled


@pytest.mark.asyncio
async def test_a_cancelled_wait_raises_cancelled_error_until_a_new_wait():
    release = asyncio.Event()

    async def held(ctx, x):
        await release.wait()
        return x

    async with cronoq.Scheduler([pool(held)]) as sched:
        handle = await sched.submit("v")
        assert handle.cancel() is True and handle.cancelled()
        with pytest.raises(asyncio.CancelledError):
            handle.result()
        assert handle.done() is False and not handle.cancelled()   # the next wait starts afresh
        release.set()
        assert await handle == "v"
