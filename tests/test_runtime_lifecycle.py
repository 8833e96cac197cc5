"""Runtime lifecycle: start, shutdown, the loop a scheduler belongs to."""

import asyncio

import pytest

import cronoq


async def double(ctx, x):
    return x * 2


def make(**kwargs):
    return cronoq.Scheduler([cronoq.Pool("default", double, autoscale=False)], **kwargs)


# Every public call with arguments that would be valid on a running scheduler.
CALLS = {
    "submit": lambda s: s.submit(1),
    "enqueue": lambda s: s.enqueue(1),
    "submit_batch": lambda s: s.submit_batch([cronoq.Task(1)]),
    "enqueue_batch": lambda s: s.enqueue_batch([cronoq.Task(1)]),
    "cancel": lambda s: s.cancel(1),
    "handle": lambda s: s.handle(1),
    "info": lambda s: s.info(1),
    "snapshot": lambda s: s.snapshot(),
    "set_capacity": lambda s: s.set_capacity("default", 2),
    "set_group_capacity": lambda s: s.set_group_capacity("default", {"gpu": "a100"}, 1),
    "add_recurring": lambda s: s.add_recurring("r", "* * * * *", 1),
    "remove_recurring": lambda s: s.remove_recurring("r"),
}


async def _call(sched, name):
    if name == "events":
        return sched.events()
    return await CALLS[name](sched)


ALL_CALLS = sorted(CALLS) + ["events"]


@pytest.mark.asyncio
async def test_async_with_starts_serves_and_shuts_down():
    sched = make()
    assert sched.running is False
    async with sched as entered:
        assert entered is sched
        assert sched.running is True
        assert await (await sched.submit(21)) == 42
    assert sched.running is False
    with pytest.raises(cronoq.SchedulerError):
        await sched.submit(1)


@pytest.mark.asyncio
async def test_explicit_start_and_shutdown():
    sched = make()
    await sched.start()
    try:
        handle = await sched.submit(5)
        assert await handle == 10
    finally:
        await sched.shutdown()
    assert sched.running is False
    # shutdown is idempotent
    await sched.shutdown()
    assert sched.running is False


@pytest.mark.asyncio
@pytest.mark.parametrize("name", ALL_CALLS)
async def test_calls_before_start_raise_runtime_error(name):
    sched = make()
    with pytest.raises(RuntimeError, match="not started"):
        await _call(sched, name)
    # the scheduler can still be started afterwards
    async with sched:
        assert await (await sched.submit(1)) == 2


@pytest.mark.asyncio
@pytest.mark.parametrize("name", ALL_CALLS)
async def test_calls_after_shutdown_raise_scheduler_error(name):
    sched = make()
    async with sched:
        pass
    with pytest.raises(cronoq.SchedulerError):
        await _call(sched, name)


@pytest.mark.asyncio
async def test_start_twice_or_after_shutdown_raises():
    sched = make()
    async with sched:
        with pytest.raises(cronoq.SchedulerError):
            await sched.start()
    with pytest.raises(cronoq.SchedulerError):
        await sched.start()


@pytest.mark.asyncio
async def test_scheduler_error_is_not_a_runtime_error_and_vice_versa():
    # Users catch the two cases separately: before start vs stopped.
    sched = make()
    with pytest.raises(RuntimeError) as info:
        await sched.submit(1)
    assert not isinstance(info.value, cronoq.SchedulerError)
    async with sched:
        pass
    with pytest.raises(cronoq.SchedulerError) as info2:
        await sched.submit(1)
    assert not isinstance(info2.value, RuntimeError)
    assert isinstance(info2.value, cronoq.CronoqError)


def test_call_from_another_event_loop_raises_scheduler_error():
    sched = make()
    home = asyncio.new_event_loop()
    try:
        home.run_until_complete(sched.start())
        assert home.run_until_complete(_result(sched, 4)) == 8

        async def from_elsewhere():
            with pytest.raises(cronoq.SchedulerError, match="another event loop"):
                await sched.submit(1)
            with pytest.raises(cronoq.SchedulerError, match="another event loop"):
                sched.events()
            return "checked"

        assert asyncio.run(from_elsewhere()) == "checked"
        # the home loop still serves it
        assert home.run_until_complete(_result(sched, 6)) == 12
        home.run_until_complete(sched.shutdown())
    finally:
        home.close()


def test_call_without_a_running_loop_raises_scheduler_error():
    sched = make()
    home = asyncio.new_event_loop()
    try:
        home.run_until_complete(sched.start())
        # no loop is running here at all
        with pytest.raises(cronoq.SchedulerError):
            sched.events()
        home.run_until_complete(sched.shutdown())
    finally:
        home.close()


async def _result(sched, x):
    return await (await sched.submit(x))


def test_loop_closed_without_shutdown_then_calls_raise_scheduler_error():
    sched = make()

    async def first():
        await sched.start()
        assert await (await sched.submit(2)) == 4
        # the loop ends here without a shutdown

    asyncio.run(first())

    async def later():
        with pytest.raises(cronoq.SchedulerError, match="closed"):
            await sched.submit(1)
        # and it stays stopped: the next call says so too
        with pytest.raises(cronoq.SchedulerError):
            await sched.snapshot()

    asyncio.run(later())
    assert sched.running is False
    # _check reports it directly as well
    with pytest.raises(cronoq.SchedulerError):
        sched._engine.check()


def test_loop_closed_with_a_running_task_does_not_hang_later_calls():
    seen = []

    async def forever(ctx, x):
        seen.append("started")
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    sched = cronoq.Scheduler([cronoq.Pool("default", forever, autoscale=False)])

    async def first():
        nonlocal started
        started = asyncio.Event()
        await sched.start()
        await sched.enqueue(1)
        await asyncio.wait_for(started.wait(), 5)
        # asyncio.run cancels the worker when it closes the loop

    started = None
    asyncio.run(first())
    assert seen == ["started", "cancelled"]


    async def later():
        with pytest.raises(cronoq.SchedulerError):
            await sched.info(1)

    asyncio.run(later())


@pytest.mark.parametrize("kwargs, field", [
    (dict(shutdown_grace=-1), "shutdown_grace"),
    (dict(shutdown_grace=float("nan")), "shutdown_grace"),
    (dict(event_capacity=0), "event_capacity"),
    (dict(event_capacity=True), "event_capacity"),
    (dict(output_cache=-1), "output_cache"),
])
def test_invalid_scheduler_options_raise_value_error(kwargs, field):
    with pytest.raises(ValueError, match=field):
        make(**kwargs)


def test_pools_are_required_and_must_be_pools():
    with pytest.raises(ValueError, match="pools"):
        cronoq.Scheduler([])
    with pytest.raises(ValueError, match="Pool"):
        cronoq.Scheduler(["default"])


@pytest.mark.parametrize("kwargs, field", [
    (dict(min=-1), "min"),
    (dict(min=3, max=2), "max"),
    (dict(overflow="bogus"), "overflow"),
    (dict(lease_ttl=-1.0), "lease_ttl"),
])
def test_invalid_pool_options_raise_value_error(kwargs, field):
    with pytest.raises(ValueError, match=field):
        cronoq.Pool("default", double, **kwargs)


def test_pool_executor_must_be_callable_and_kind_is_detected():
    with pytest.raises(ValueError, match="callable"):
        cronoq.Pool("default", 42)

    def plain(ctx, x):
        return x

    class AsyncCallable:
        async def __call__(self, ctx, x):
            return x

    assert cronoq.Pool("a", double).is_async is True
    assert cronoq.Pool("b", plain).is_async is False
    assert cronoq.Pool("c", AsyncCallable()).is_async is True


@pytest.mark.asyncio
async def test_async_callable_object_executor_runs_on_the_loop():
    class Doubler:
        async def __call__(self, ctx, x):
            return (x * 2, asyncio.get_running_loop())

    loop = asyncio.get_running_loop()
    async with cronoq.Scheduler([cronoq.Pool("default", Doubler(), autoscale=False)]) as sched:
        value, ran_on = await (await sched.submit(4))
    assert value == 8
    assert ran_on is loop


@pytest.mark.asyncio
async def test_tasks_without_pool_go_to_default_pool_else_first():
    async def tag_a(ctx, x):
        return ("a", ctx.pool)

    async def tag_b(ctx, x):
        return ("b", ctx.pool)

    # a pool named "default" wins even if it is not first
    pools = [cronoq.Pool("first", tag_a, autoscale=False), cronoq.Pool("default", tag_b, autoscale=False)]
    async with cronoq.Scheduler(pools) as sched:
        assert await (await sched.submit(0)) == ("b", "default")
        assert await (await sched.submit(0, pool="first")) == ("a", "first")
        with pytest.raises(cronoq.UnknownPool):
            await sched.submit(0, pool="nope")
    # otherwise the first pool
    pools = [cronoq.Pool("alpha", tag_a, autoscale=False), cronoq.Pool("beta", tag_b, autoscale=False)]
    async with cronoq.Scheduler(pools) as sched:
        assert await (await sched.submit(0)) == ("a", "alpha")


@pytest.mark.asyncio
async def test_repr_mentions_state_and_pools():
    sched = make()
    assert "new" in repr(sched) and "default" in repr(sched)
    async with sched:
        assert "running" in repr(sched)
    assert "stopped" in repr(sched)
