"""``Scheduler.add_admission_listener`` and ``Scheduler.config``: what a
recorder (cronoq.whatif) needs to know of each admission."""

import asyncio
import logging
import threading

import pytest

import cronoq
from cronoq.core import CoreConfig, PriorityConfig


def fixed(name, executor, capacity=1, **kwargs):
    return cronoq.Pool(name, executor, min=capacity, max=max(capacity, 1), initial=capacity,
                       autoscale=False, **kwargs)


async def echo(ctx, payload):
    return payload


class Heard:
    def __init__(self):
        self.calls = []
        self.threads = []

    def __call__(self, now, tasks, results, error):
        self.calls.append((now, list(tasks), None if results is None else list(results), error))
        self.threads.append(threading.get_ident())


@pytest.mark.asyncio
async def test_a_submission_is_told_with_its_time_task_and_id():
    clock = cronoq.VirtualClock()
    heard = Heard()
    async with cronoq.Scheduler([fixed("default", echo)], clock=clock) as sched:
        sched.add_admission_listener(heard)
        await clock.advance(2.5)
        task = cronoq.Task("x", key="k", priority="high")
        handle = await sched.submit_batch([task])
        again = await sched.submit("y", key="k")
    (now, tasks, results, error), (now2, tasks2, results2, error2) = heard.calls
    assert now == now2 == clock.now_ns()
    assert tasks == [task] and results == [(handle[0].id, False)] and error is None
    assert tasks2[0].key == "k" and results2 == [(again.id, True)] and error2 is None   # a duplicate


@pytest.mark.asyncio
async def test_a_batch_is_told_once_with_all_its_tasks():
    heard = Heard()
    async with cronoq.Scheduler([fixed("default", echo)]) as sched:
        sched.add_admission_listener(heard)
        batch = [cronoq.Task(i, key=f"t{i}", after=f"t{i - 1}" if i else None) for i in range(3)]
        handles = await sched.submit_batch(batch)
    assert len(heard.calls) == 1
    _, tasks, results, error = heard.calls[0]
    assert tasks == batch and error is None
    assert results == [(h.id, False) for h in handles]


@pytest.mark.asyncio
async def test_refusals_are_told_with_their_error_and_still_raised():
    heard = Heard()
    pool = fixed("default", echo, capacity=0, max_pending=1, overflow="reject")
    async with cronoq.Scheduler([pool]) as sched:
        sched.add_admission_listener(heard)
        await sched.submit("first")
        with pytest.raises(cronoq.QueueFull):
            await sched.submit("second")
        with pytest.raises(cronoq.UnknownPool):
            await sched.submit_batch([cronoq.Task("third", pool="nowhere")])
    assert [c[3].__class__ for c in heard.calls] == [type(None), cronoq.QueueFull, cronoq.UnknownPool]
    assert heard.calls[1][2] is None and heard.calls[1][1][0].payload == "second"


@pytest.mark.asyncio
async def test_a_submission_waiting_for_room_is_told_once_admitted():
    clock = cronoq.VirtualClock()
    release = asyncio.Event()

    async def slow(ctx, payload):
        await release.wait()

    heard = Heard()
    pool = fixed("default", slow, capacity=1, max_pending=1, overflow="wait")
    async with cronoq.Scheduler([pool], clock=clock) as sched:
        sched.add_admission_listener(heard)
        await sched.submit("running")
        await clock.settle()
        await sched.submit("queued")
        waiting = asyncio.create_task(sched.submit("waits"))
        await clock.settle()
        assert len(heard.calls) == 2          # not refused, not admitted yet
        await clock.advance(3)
        release.set()
        await waiting
    assert [c[1][0].payload for c in heard.calls] == ["running", "queued", "waits"]
    assert heard.calls[2][3] is None and heard.calls[2][0] == clock.now_ns()


@pytest.mark.asyncio
async def test_a_failing_listener_is_logged_and_the_admission_stands(caplog):
    def broken(now, tasks, results, error):
        raise RuntimeError("listener bug")

    async with cronoq.Scheduler([fixed("default", echo)]) as sched:
        sched.add_admission_listener(broken)
        with caplog.at_level(logging.ERROR, logger="cronoq.scheduler"):
            handle = await sched.submit(21)
            assert await handle == 21
    assert "an admission listener failed" in caplog.text


@pytest.mark.asyncio
async def test_removing_a_listener_stops_it_and_bad_listeners_are_refused():
    heard = Heard()
    async with cronoq.Scheduler([fixed("default", echo)]) as sched:
        remove = sched.add_admission_listener(heard)
        await sched.submit(1)
        remove()
        remove()   # twice: nothing more
        await sched.submit(2)
        with pytest.raises(ValueError, match="listener must be callable"):
            sched.add_admission_listener("not callable")
    assert len(heard.calls) == 1


def test_threads_are_told_on_their_own_thread():
    heard = Heard()

    def work(ctx, payload):
        return payload

    with cronoq.BlockingScheduler([fixed("default", work)]) as sched:
        sched.add_admission_listener(heard)
        handle = sched.submit("from a thread")
        assert handle.result(timeout=10) == "from a thread"
    assert heard.threads == [threading.get_ident()]
    assert heard.calls[0][2] == [(handle.id, False)]


def test_config_is_the_engine_settings_the_scheduler_was_made_with():
    sched = cronoq.Scheduler([fixed("default", echo)], seed=11, max_pending_total=5)
    assert sched.config.seed == 11 and sched.config.max_pending_total == 5
    config = CoreConfig(priority=PriorityConfig(aging_rate=(0, 0, 0, 0)), seed=3)
    assert cronoq.Scheduler([fixed("default", echo)], config=config).config is config
