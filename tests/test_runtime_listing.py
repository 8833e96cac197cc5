"""Scheduler.list_tasks and Scheduler.recurring; the stores' list_finished and find_task."""

from __future__ import annotations

import asyncio

import pytest

import cronoq
from cronoq.core import CoreConfig
from cronoq.store import InMemoryStore, MemoryDatabase


async def _echo(ctx, payload):
    if payload == "fail":
        raise cronoq.Permanent("asked to fail")
    return payload


async def _block(ctx, payload):
    await asyncio.Event().wait()


def pools():
    return [cronoq.Pool("default", _echo, min=4, max=4, autoscale=False),
            cronoq.Pool("slow", _block, min=1, max=1, autoscale=False)]


@pytest.mark.asyncio
async def test_list_tasks_pages_live_and_finished_tasks_in_id_order():
    async with cronoq.Scheduler(pools(), shutdown_grace=0.1) as sched:
        done = [await sched.submit(i, key=f"k{i}") for i in range(5)]
        failed = await sched.submit("fail")
        for handle in done:
            await handle
        with pytest.raises(cronoq.TaskFailed):
            await failed
        running = await sched.submit("x", pool="slow")
        queued = await sched.submit("y", pool="slow")
        everything = await sched.list_tasks()
        assert [t.id for t in everything] == sorted(t.id for t in everything)
        assert len(everything) == 8
        by_id = {t.id: t for t in everything}
        assert by_id[done[0].id].status == "succeeded" and by_id[done[0].id].key == "k0"
        assert by_id[failed.id].status == "failed" and by_id[failed.id].message == "asked to fail"
        assert by_id[running.id].status == "running" and by_id[running.id].pool == "slow"
        assert by_id[queued.id].status == "ready"

        # Paging: after the last id of a page, limit per page, nothing repeated or lost.
        seen = []
        after = 0
        while True:
            page = await sched.list_tasks(after=after, limit=3)
            if not page:
                break
            assert len(page) <= 3
            seen += [t.id for t in page]
            after = page[-1].id
        assert seen == [t.id for t in everything]

        slow = await sched.list_tasks(pools=["slow"])
        assert [t.id for t in slow] == [running.id, queued.id]
        ended = await sched.list_tasks(statuses=["failed", "ready"])
        assert [t.id for t in ended] == [failed.id, queued.id]
        assert await sched.list_tasks(pools=["slow"], statuses=["succeeded"]) == []


@pytest.mark.asyncio
async def test_list_tasks_rejects_bad_filters_by_name():
    async with cronoq.Scheduler(pools(), shutdown_grace=0.1) as sched:
        with pytest.raises(cronoq.UnknownPool, match="nope"):
            await sched.list_tasks(pools=["nope"])
        with pytest.raises(ValueError, match="unknown status 'done'"):
            await sched.list_tasks(statuses=["done"])
        with pytest.raises(ValueError, match="not one string"):
            await sched.list_tasks(pools="default")
        with pytest.raises(ValueError, match="after"):
            await sched.list_tasks(after=-1)
        with pytest.raises(ValueError, match="limit"):
            await sched.list_tasks(limit=0)


@pytest.mark.asyncio
async def test_finished_tasks_stay_listed_from_the_store_after_the_engine_forgot_them(tmp_path):
    path = tmp_path / "state.db"
    store = cronoq.SqliteStore(path, retention=0.0)
    async with cronoq.Scheduler(pools(), store=store, config=CoreConfig(retention=0.0)) as sched:
        ok = await sched.submit("a", key="first")
        bad = await sched.submit("fail")
        assert await ok == "a"
        with pytest.raises(cronoq.TaskFailed):
            await bad
    await store.close()

    store = cronoq.SqliteStore(path, retention=0.0)
    async with cronoq.Scheduler(pools(), store=store, config=CoreConfig(retention=0.0)) as sched:
        with pytest.raises(cronoq.UnknownTask):
            await sched.info(ok.id)            # the engine does not retain it ...
        listed = await sched.list_tasks()      # ... the store still lists it
        assert [(t.id, t.status, t.key) for t in listed] == [(ok.id, "succeeded", "first"),
                                                             (bad.id, "failed", None)]
        assert [t.id for t in await sched.list_tasks(statuses=["failed"])] == [bad.id]
        assert await sched.list_tasks(pools=["slow"]) == []
        assert [t.id for t in await sched.list_tasks(after=ok.id)] == [bad.id]
        live = await sched.submit("b")
        await live
        assert [t.id for t in await sched.list_tasks(limit=2)] == [ok.id, bad.id]
        assert [t.id for t in await sched.list_tasks(after=bad.id)] == [live.id]

        record = await store.find_task(ok.id)
        assert record is not None and record.status == "succeeded" and record.has_output
        assert record.finished_ns is not None and record.submitted_ns <= record.finished_ns
        by_key = await store.find_task("first")
        assert by_key is not None and by_key.id == ok.id
        failed = await store.find_task(bad.id)
        assert failed is not None and failed.message == "asked to fail" and not failed.has_output
        assert await store.find_task(10 ** 15) is None
        assert await store.find_task("no such key") is None
    await store.close()


@pytest.mark.asyncio
async def test_the_memory_store_lists_like_the_sql_stores():
    db = MemoryDatabase()
    store = InMemoryStore(db)
    async with cronoq.Scheduler(pools(), store=store) as sched:
        handles = [await sched.submit(i, key=f"m{i}") for i in range(3)]
        for handle in handles:
            await handle
        records = await store.list_finished(after=handles[0].id, limit=5)
        assert [r.id for r in records] == [h.id for h in handles[1:]]
        assert all(r.has_output and r.status == "succeeded" for r in records)
        assert (await store.find_task("m2")).id == handles[2].id
        assert await store.list_finished(pools=["slow"]) == []


@pytest.mark.asyncio
async def test_recurring_lists_schedules_by_name_with_next_and_last_occurrence():
    clock = cronoq.VirtualClock(start=1_767_225_600.0)   # 2026-01-01T00:00:00Z
    async with cronoq.Scheduler(pools(), clock=clock, shutdown_grace=0.1) as sched:
        assert await sched.recurring() == []
        await sched.add_recurring("nightly", "0 0 3 * * *", {"r": 1}, tz="Europe/Berlin",
                                  overlap="queue", kind="report", key="night")
        await sched.add_recurring("every-minute", "* * * * *", "tick", pool="slow")
        listed = await sched.recurring()
        assert [r.name for r in listed] == ["every-minute", "nightly"]
        minute, nightly = listed
        assert (minute.cron, minute.tz, minute.pool, minute.kind, minute.overlap) == (
            "* * * * *", "UTC", "slow", "default", "skip")
        assert minute.next_at == 1_767_225_660.0 and minute.last_task_id is None
        assert (nightly.pool, nightly.kind, nightly.key, nightly.overlap, nightly.tz) == (
            "default", "report", "night", "queue", "Europe/Berlin")
        assert nightly.next_at == 1_767_232_800.0   # 03:00 in Berlin is 02:00 UTC
        assert nightly.tolerance == 1.0 and nightly.on_miss == "run_late"
        await clock.advance(61.0)
        minute = (await sched.recurring())[0]
        assert minute.last_task_id is not None
        assert (await sched.info(minute.last_task_id)).pool == "slow"
        assert minute.next_at == 1_767_225_720.0
        assert await sched.remove_recurring("nightly")
        assert [r.name for r in await sched.recurring()] == ["every-minute"]
