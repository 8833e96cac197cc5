"""Executors that raise a BaseException which is not an Exception (issue 10,
point 7): the attempt ends failed, named after the exception, and its slot
is freed. KeyboardInterrupt and SystemExit from an async executor go on to
the code running the loop; from a thread, or on a BlockingScheduler's
private loop, they end nothing else."""

import asyncio
import logging
import threading

import pytest

import cronoq

WAIT = 20     # seconds; only reached when a test fails


def fixed(name, executor, capacity=1, **kwargs):
    return cronoq.Pool(name, executor, min=capacity, max=max(capacity, 1), initial=capacity,
                       autoscale=False, **kwargs)


class Custom(BaseException):
    pass


def raise_(exc: BaseException):
    raise exc


RAISERS = {
    "custom": lambda: raise_(Custom("custom base exception")),
    "generator_exit": lambda: raise_(GeneratorExit()),
    "own_cancelled_error": lambda: raise_(asyncio.CancelledError("its own")),
}
NAMES = {"custom": "Custom: custom base exception", "generator_exit": "GeneratorExit",
         "own_cancelled_error": "CancelledError: its own"}


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", sorted(RAISERS))
async def test_an_async_executors_base_exception_fails_the_attempt_and_frees_the_slot(kind):
    async def work(ctx, payload):
        if payload == "raise":
            RAISERS[kind]()
        return payload

    async with cronoq.Scheduler([fixed("default", work)]) as sched:
        bad = await sched.submit("raise", retry=cronoq.RetryPolicy.none())
        with pytest.raises(cronoq.TaskFailed) as info:
            await asyncio.wait_for(bad, WAIT)
        assert info.value.status == "dead_lettered"
        assert info.value.message == f"gave up after 1 attempt: {NAMES[kind]}"
        # The only slot is free again.
        assert await asyncio.wait_for(await sched.submit("next"), WAIT) == "next"
        assert (await sched.snapshot()).pool("default").busy == 0


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["custom", "generator_exit", "keyboard_interrupt", "system_exit"])
async def test_a_sync_executors_base_exception_fails_the_attempt_and_ends_nothing_else(kind):
    raisers = dict(RAISERS, keyboard_interrupt=lambda: raise_(KeyboardInterrupt()),
                   system_exit=lambda: raise_(SystemExit(3)))
    names = dict(NAMES, keyboard_interrupt="KeyboardInterrupt", system_exit="SystemExit: 3")

    def work(ctx, payload):
        if payload == "raise":
            raisers[kind]()
        return payload

    async with cronoq.Scheduler([fixed("default", work)]) as sched:
        bad = await sched.submit("raise", retry=cronoq.RetryPolicy(max_attempts=2, initial_backoff=0))
        with pytest.raises(cronoq.TaskFailed) as info:
            await asyncio.wait_for(bad, WAIT)
        assert info.value.message == f"gave up after 2 attempts: {names[kind]}"
        assert await asyncio.wait_for(await sched.submit("next"), WAIT) == "next"


@pytest.mark.parametrize("exc_type", [KeyboardInterrupt, SystemExit])
def test_keyboard_interrupt_from_an_async_executor_ends_the_attempt_then_reaches_the_loops_runner(exc_type):
    async def work(ctx, payload):
        if payload == "raise":
            raise exc_type()
        return payload

    loop = asyncio.new_event_loop()
    try:
        sched = cronoq.Scheduler([fixed("default", work)])
        loop.run_until_complete(sched.start())
        handles = []

        async def submit_and_wait():
            handles.append(await sched.submit("raise", retry=cronoq.RetryPolicy.none()))
            handles.append(await sched.submit("queued behind it"))
            await asyncio.sleep(WAIT)

        with pytest.raises(exc_type):
            loop.run_until_complete(submit_and_wait())    # the executor's exception interrupts this
        bad, queued = handles
        # The attempt ended (named), and the scheduler goes on when the loop runs again.
        assert loop.run_until_complete(asyncio.wait_for(queued, WAIT)) == "queued behind it"
        info = loop.run_until_complete(sched.info(bad.id))
        assert (info.status, info.message) == ("dead_lettered", f"gave up after 1 attempt: {exc_type.__name__}")
        loop.run_until_complete(sched.shutdown())
    finally:
        for task in asyncio.all_tasks(loop):
            task.cancel()
        loop.run_until_complete(asyncio.sleep(0))
        loop.close()


@pytest.mark.parametrize("exc_type", [KeyboardInterrupt, SystemExit])
def test_a_blocking_schedulers_loop_thread_survives_an_async_executors_keyboard_interrupt(exc_type, caplog):
    async def work(ctx, payload):
        if payload == "raise":
            raise exc_type()
        return payload

    with caplog.at_level(logging.ERROR, logger="cronoq"):
        with cronoq.BlockingScheduler([fixed("default", work)]) as bs:
            bad = bs.submit("raise", retry=cronoq.RetryPolicy.none())
            with pytest.raises(cronoq.TaskFailed) as info:
                bad.result(timeout=WAIT)
            assert info.value.message == f"gave up after 1 attempt: {exc_type.__name__}"
            assert bs.submit("next").result(timeout=WAIT) == "next"
            assert bs._portal.thread.is_alive()
    [record] = [r for r in caplog.records if getattr(r, "action", None) == "executor_exit"]
    assert exc_type.__name__ in record.getMessage()


def test_a_blocking_schedulers_sync_executor_keyboard_interrupt_is_a_failure():
    def work(ctx, payload):
        if payload == "raise":
            raise KeyboardInterrupt
        return threading.current_thread().name

    with cronoq.BlockingScheduler([fixed("default", work)]) as bs:
        bad = bs.submit("raise", retry=cronoq.RetryPolicy.none())
        with pytest.raises(cronoq.TaskFailed) as info:
            bad.result(timeout=WAIT)
        assert info.value.message == "gave up after 1 attempt: KeyboardInterrupt"
        assert bs.submit("next").result(timeout=WAIT).startswith("cronoq-default-")


@pytest.mark.asyncio
@pytest.mark.parametrize("plain", [False, True])
async def test_an_exception_that_cannot_be_printed_still_ends_the_attempt(plain):
    class Unprintable(Exception):
        def __str__(self):
            raise ValueError("no")

    def fail(ctx, payload):
        raise Unprintable()

    async def fail_async(ctx, payload):
        raise Unprintable()

    async with cronoq.Scheduler([fixed("default", fail if plain else fail_async)]) as sched:
        handle = await sched.submit(None, retry=cronoq.RetryPolicy.none())
        with pytest.raises(cronoq.TaskFailed) as info:
            await asyncio.wait_for(handle, WAIT)
    assert info.value.message == "gave up after 1 attempt: Unprintable: <the exception could not be printed>"
