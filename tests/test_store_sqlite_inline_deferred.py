"""A commit the event loop could make itself (SQLite), found the loop busy
for a moment (a timer that came due, a thread's reply, the executor that
just ran): it waits a few loop steps for the loop to be idle and is made
there, instead of going to the store's worker thread at the second step.
A loop that stays busy still sends it to the worker.

The busy moment here is a chain of callbacks queued before each submit, each
queueing the next, as a timer's callback that wakes a task does."""

from __future__ import annotations

import asyncio
import threading

import pytest

import cronoq
from cronoq.runtime import durability
from storekit import Work, eventually, pool, record_commit_threads, sqlite_backend  # noqa: F401  (a fixture)


def busy_for(steps: int) -> None:
    """Keep a callback ready to run for the next ``steps`` loop steps."""
    if steps > 0:
        asyncio.get_running_loop().call_soon(busy_for, steps - 1)


async def started(store, capacity: int) -> cronoq.Scheduler:
    store.INLINE_STALL = store.INLINE_LIMIT = 3600.0   # counts threads, not time, however slow the disk
    sched = cronoq.Scheduler([pool(Work(), capacity=capacity)], store=store)
    await sched.start()
    await sched.enqueue("warm")   # opens the loop's connection on the worker
    for _ in range(100):
        if store._inline is not None:
            break
        await asyncio.sleep(0.01)
    assert store._inline is not None
    log = sched._driver.log
    # Until nothing is being committed (the warm task's end, when it ran) and
    # the worker did what the first commit queued there (pruning).
    await eventually(lambda: log.task is None and not log.open, what="the warm-up committed")
    await store._executor.call(lambda: None)
    return sched


@pytest.mark.asyncio
@pytest.mark.parametrize("capacity", [0, 1], ids=["nothing-runs", "work-runs"])
async def test_a_loop_busy_for_a_few_steps_still_commits_on_its_own_thread(sqlite_backend, capacity):
    store = sqlite_backend.store(cluster=False, full_sync=False)
    sched = await started(store, capacity)
    threads = record_commit_threads(store)
    loop_thread = threading.get_ident()
    try:
        for i in range(20):
            busy_for(3)
            task_id = await sched.enqueue(i, key=f"k{i}")
            assert sqlite_backend.sql("SELECT id FROM cronoq_tasks WHERE key = ?", (f"k{i}",)) == [(task_id,)]
        made = list(threads)   # (not the shutdown's last commit, on the worker)
    finally:
        await sched.shutdown()
    # Every commit of those submits (and of the work that ran beside them) on the loop.
    assert made and set(made) == {loop_thread}


@pytest.mark.asyncio
async def test_a_loop_that_stays_busy_sends_the_commit_to_the_worker(sqlite_backend):
    store = sqlite_backend.store(cluster=False, full_sync=False)
    sched = await started(store, 0)
    threads = record_commit_threads(store)
    try:
        for i in range(5):
            busy_for(getattr(durability, "DEFER_STEPS", 1) + 4)
            task_id = await sched.enqueue(i, key=f"k{i}")
            assert sqlite_backend.sql("SELECT id FROM cronoq_tasks WHERE key = ?", (f"k{i}",)) == [(task_id,)]
        made = list(threads)
    finally:
        await sched.shutdown()
    assert len(made) == 5 and threading.get_ident() not in made
