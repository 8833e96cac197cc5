"""One task group owns a scheduler's background tasks; its shutdown
cancels and awaits those left, so none outlives it."""

from __future__ import annotations

import asyncio

import pytest

import cronoq
from cronoq.runtime.lifecycle import State, TaskGroup
from storekit import Work, pool, sqlite_backend  # noqa: F401  (sqlite_backend is a fixture)

pytestmark = pytest.mark.asyncio


async def test_close_cancels_and_awaits_what_is_left_but_the_caller():
    group = TaskGroup()
    cleaned = []

    async def forever(name):
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.append(name)

    async def closer():
        group.spawn(forever("b"))
        await asyncio.sleep(0)
        await group.close()
        return "closed"

    group.spawn(forever("a"))
    own = group.spawn(closer())
    assert await own == "closed"
    assert sorted(cleaned) == ["a", "b"] and len(group) == 0


async def test_a_task_leaves_the_group_as_it_ends():
    group = TaskGroup()

    async def quick():
        return 1

    assert await group.spawn(quick()) == 1
    assert len(group) == 0


async def test_no_task_of_a_scheduler_outlives_its_shutdown(sqlite_backend):
    before = asyncio.all_tasks()
    leader = cronoq.Scheduler([pool(Work(), capacity=1)], store=sqlite_backend.store())
    await leader.start()
    follower = cronoq.Scheduler([pool(Work(), capacity=1)], store=sqlite_backend.store())
    await follower.start()
    handle = await follower.submit({"name": "x"})
    assert await handle == {"done": "x"}
    await follower.shutdown()
    await leader.shutdown()
    assert str(leader._life.state) == State.STOPPED == "stopped"
    left = [task for task in asyncio.all_tasks() - before if not task.done()]
    assert left == []


async def test_a_second_shutdown_returns_when_the_first_has_stopped_the_scheduler():
    work = Work()
    sched = cronoq.Scheduler([pool(work, capacity=1)])
    await sched.start()
    await sched.submit({"op": "block", "name": "busy"})
    await asyncio.wait_for(work.running.wait(), 10)
    first = asyncio.create_task(sched.shutdown(grace=0.2))
    await asyncio.sleep(0)
    assert not sched.running
    await asyncio.wait_for(sched.shutdown(), 10)
    assert first.done() and repr(sched).startswith("<cronoq.Scheduler stopped")
    await first
