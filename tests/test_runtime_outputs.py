"""Outputs reach their handles: a handle attached while the task ran always
gets the output (the output cache only serves handles attached later), and
a later handle or a duplicate submission of a finished task gets the stored
output from the store, after a restart too."""

from __future__ import annotations

import asyncio

import pytest

import cronoq
from cronoq.store import InMemoryStore, MemoryDatabase
from storekit import Work, backend, pool  # noqa: F401  (backend is a fixture)

pytestmark = pytest.mark.asyncio


async def echo(ctx, payload):
    return {"echo": payload}


def slow_commits(delay: float = 0.02) -> InMemoryStore:
    """A store whose every commit takes ``delay``: many tasks finish per commit."""
    database = MemoryDatabase()
    database.commit_delay = delay
    return InMemoryStore(database)


async def test_live_handles_get_their_outputs_when_more_tasks_finish_per_commit_than_the_cache_holds():
    store = slow_commits()
    async with cronoq.Scheduler([pool(echo, capacity=8)], store=store, output_cache=2) as sched:
        handles = await sched.submit_batch([cronoq.Task(i, key=f"k{i}") for i in range(200)])
        results = await asyncio.gather(*handles, return_exceptions=True)
        assert results == [{"echo": i} for i in range(200)]
        # each commit carried several outputs: the case the cache alone could not serve
        assert store.database.commits < 150
        # a handle attached later gets the stored output (the cache holds two)
        assert await (await sched.handle("k0")) == {"echo": 0}


async def test_live_handles_get_their_outputs_with_output_cache_zero_and_a_store():
    async with cronoq.Scheduler([pool(echo, capacity=4)], store=slow_commits(),
                                output_cache=0) as sched:
        handles = [await sched.submit(i) for i in range(20)]
        assert [await h for h in handles] == [{"echo": i} for i in range(20)]


async def test_blocking_handles_get_their_outputs_with_output_cache_zero():
    with cronoq.BlockingScheduler([pool(echo, capacity=2)], output_cache=0) as sched:
        handles = [sched.submit(i) for i in range(10)]
        assert [h.result(timeout=30) for h in handles] == [{"echo": i} for i in range(10)]


async def test_a_duplicate_submission_gets_the_stored_output_once_the_cache_lost_it():
    async with cronoq.Scheduler([pool(echo)], store=slow_commits(0.0), output_cache=1) as sched:
        first = await sched.submit("a", key="a")
        assert await first == {"echo": "a"}
        assert await (await sched.submit("b", key="b")) == {"echo": "b"}   # evicts a's output
        dup = await sched.submit("other", key="a")
        [dup_in_batch] = await sched.submit_batch([cronoq.Task("other", key="a")])
        for handle in (dup, dup_in_batch):
            assert (handle.duplicate, handle.id) == (True, first.id)
            assert await handle == {"echo": "a"}


async def test_an_output_the_store_cannot_give_fails_the_later_handle_clearly():
    store = slow_commits(0.0)
    async with cronoq.Scheduler([pool(echo)], store=store, output_cache=0) as sched:
        live = await sched.submit("a", key="a")
        assert await live == {"echo": "a"}
        store.database.available = False
        late = await sched.handle("a")
        with pytest.raises(cronoq.TaskFailed) as info:
            await late
        assert info.value.status == "succeeded" and "could not be loaded" in info.value.message
        store.database.available = True
        store.database.outputs.clear()   # pruned
        with pytest.raises(cronoq.TaskFailed) as info:
            await (await sched.submit("a", key="a"))
        assert info.value.status == "succeeded" and "no longer available" in info.value.message


async def test_resubmitting_a_finished_key_returns_its_stored_output_after_a_restart(backend):
    work = Work()
    first = cronoq.Scheduler([pool(work)], store=backend.store())
    async with first:
        done = await first.submit({"op": "echo", "value": {"answer": 42}}, key="answer")
        assert await done == {"answer": 42}
    again = cronoq.Scheduler([pool(work)], store=backend.store())
    async with again:
        dup = await again.submit({"op": "echo", "value": "not run"}, key="answer")
        [in_batch] = await again.submit_batch([cronoq.Task({"op": "echo", "value": "not run"}, key="answer")])
        for handle in (dup, in_batch):
            assert (handle.duplicate, handle.id) == (True, done.id)
            assert await handle == {"answer": 42}
        assert await (await again.handle("answer")) == {"answer": 42}
    assert [name for name, _ in work.started] == [None]   # it ran once


async def test_blocking_resubmission_after_a_restart_returns_the_stored_output(backend):
    work = Work()
    with cronoq.BlockingScheduler([pool(work)], store=backend.store()) as sched:
        done = sched.submit({"op": "echo", "value": [1, 2]}, key="list")
        assert done.result(timeout=30) == [1, 2]
    with cronoq.BlockingScheduler([pool(work)], store=backend.store(), output_cache=0) as sched:
        dup = sched.submit({"op": "echo", "value": "not run"}, key="list")
        assert (dup.duplicate, dup.id) == (True, done.id)
        assert dup.result(timeout=30) == [1, 2]
        assert sched.handle("list").result(timeout=30) == [1, 2]
