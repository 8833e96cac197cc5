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


# ---------------------------------------------------------------- done-callbacks (run together, once per turn)

import contextvars  # noqa: E402

from cronoq.runtime.handle import TaskHandle  # noqa: E402

var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")


def handles(n: int) -> list[TaskHandle]:
    loop = asyncio.get_running_loop()
    return [TaskHandle(i, None, False, loop) for i in range(n)]


@pytest.mark.asyncio
async def test_done_callbacks_run_soon_in_the_order_they_fell_due_never_during_the_resolution():
    a, b, c = handles(3)
    calls: list[tuple[str, int]] = []
    for h in (a, b, c):
        h.add_done_callback(lambda h: calls.append(("first", h.id)))
        h.add_done_callback(lambda h: calls.append(("second", h.id)))
    b.set_result("b")
    asyncio.get_running_loop().call_soon(calls.append, ("between", -1))   # queued after b's, before c's
    c.set_failure("failed", "no")
    a.set_result("a")
    assert calls == []   # not from inside set_result (the driver resolves under its lock)
    await asyncio.sleep(0)
    assert calls[:2] == [("first", 1), ("second", 1)]
    assert sorted(calls[2:]) == sorted([("between", -1), ("first", 2), ("second", 2), ("first", 0), ("second", 0)])
    assert [c for c in calls if c[1] != -1] == [("first", 1), ("second", 1), ("first", 2), ("second", 2),
                                                 ("first", 0), ("second", 0)]
    # Added after the resolution: soon as well.
    a.add_done_callback(lambda h: calls.append(("late", h.id)))
    assert calls[-1] != ("late", 0)
    await asyncio.sleep(0)
    assert calls[-1] == ("late", 0)


@pytest.mark.asyncio
async def test_a_failing_done_callback_goes_to_the_loops_handler_and_the_others_still_run():
    loop = asyncio.get_running_loop()
    reported: list[dict] = []
    loop.set_exception_handler(lambda loop, context: reported.append(context))
    try:
        a, b = handles(2)
        ran: list[int] = []

        def boom(h):
            raise ValueError("boom")

        a.add_done_callback(boom)
        a.add_done_callback(lambda h: ran.append(h.id))
        b.add_done_callback(lambda h: ran.append(h.id))
        a.set_result(1)
        b.set_result(2)
        await asyncio.sleep(0)
        assert ran == [0, 1]
        assert len(reported) == 1 and isinstance(reported[0]["exception"], ValueError)
        assert reported[0]["handle"] is a
    finally:
        loop.set_exception_handler(None)


@pytest.mark.asyncio
async def test_done_callbacks_run_in_their_own_context():
    a, b = handles(2)
    seen: list[str] = []

    def setting(h):
        seen.append(var.get())
        var.set(f"set by {h.id}")

    given = contextvars.copy_context()
    given.run(var.set, "given")
    a.add_done_callback(setting, context=given)
    a.add_done_callback(setting)
    b.add_done_callback(setting)
    var.set("at resolution")
    a.set_result(1)
    b.set_result(2)
    var.set("after")
    await asyncio.sleep(0)
    # The given context, else a copy of the one at resolution each: no callback sees another's change.
    assert seen == ["given", "at resolution", "at resolution"]
    assert given.run(var.get) == "set by 0"
    assert var.get() == "after"


def test_a_keyboard_interrupt_in_a_done_callback_reaches_the_loops_runner_and_the_rest_still_run():
    ran: list[int] = []

    def interrupt(h):
        raise KeyboardInterrupt

    async def resolve():
        a, b = handles(2)
        a.add_done_callback(interrupt)
        b.add_done_callback(lambda h: ran.append(h.id))
        a.set_result(1)
        b.set_result(2)
        await asyncio.sleep(0)

    async def after():
        await asyncio.sleep(0)

    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(resolve())
        assert ran == []
        loop.run_until_complete(after())
        assert ran == [1]
    finally:
        loop.close()


def resolve_one_on_a_new_loop() -> list[int]:
    """The ids whose done-callback ran, after one handle resolves on a loop of its own."""
    ran: list[int] = []

    async def resolve():
        (h,) = handles(1)
        h.add_done_callback(lambda h: ran.append(h.id))
        h.set_result(1)
        await asyncio.sleep(0)

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(resolve())
    finally:
        loop.close()
    return ran


def test_callbacks_due_on_a_loop_closed_before_it_ran_them_do_not_keep_that_loop():
    from cronoq.runtime import handle as handle_module

    closed = asyncio.new_event_loop()
    h = TaskHandle(1, None, False, closed)
    h.add_done_callback(lambda h: None)
    h.set_result(1)   # falls due on a loop that never runs again
    closed.close()
    assert closed in handle_module._due   # never run: asyncio dropped its Handle with the loop
    assert resolve_one_on_a_new_loop() == [0]
    assert closed not in handle_module._due


def test_forgetting_closed_loops_survives_another_thread_adding_its_loop_meanwhile():
    # A loop on another thread (a BlockingScheduler's) may add to the table
    # while this one forgets closed loops; here that thread runs inside
    # is_closed, deterministically.
    from cronoq.runtime import handle as handle_module

    other = asyncio.new_event_loop()

    class ClosedLoop:
        def is_closed(self) -> bool:
            handle_module._due[other] = []   # the other thread's loop, arriving now
            return True

    stale = ClosedLoop()
    handle_module._due[stale] = []   # type: ignore[index]
    try:
        assert resolve_one_on_a_new_loop() == [0]
    finally:
        handle_module._due.pop(other, None)
        other.close()
    assert stale not in handle_module._due
