"""Nothing lost at the edges of the stores: length limits at admission, a row
the database refuses, submits that raised, passwords in PostgreSQL URLs."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import traceback

import pytest

import cronoq
from cronoq.core.types import KEY_LIMIT, NAME_LIMIT, RECURRING_KEY_LIMIT, VALUE_LIMIT
from cronoq.store import InMemoryStore, MemoryDatabase, StoreRejected
from pgserver import need_psycopg
from storekit import Work, backend, eventually, pool, postgres_backend, sqlite_backend  # noqa: F401

pytestmark = pytest.mark.asyncio


def half_past() -> cronoq.VirtualClock:
    """Time for tests that add hourly schedules and then count stored rows:
    half past an hour, so no occurrence is due or held yet (with the real
    clock, near the top of an hour, one would be)."""
    return cronoq.VirtualClock(start=1_767_227_400.0)   # 2026-01-01T00:30:00Z


def text_of(size: int, seed: int = 0) -> str:
    """``size`` bytes of UTF-8 that do not compress (a PostgreSQL index stores
    long values compressed: repeated characters would fit where these do not)."""
    rng = random.Random(seed)
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(size))


# ---------------------------------------------------------------- length limits


async def test_lengths_are_limited_at_admission_without_a_store():
    too_long = {
        "key": ("key", KEY_LIMIT, {"key": "é" * (KEY_LIMIT // 2 + 1)}),
        "kind": ("kind", NAME_LIMIT, {"kind": "k" * (NAME_LIMIT + 1)}),
        "pool": ("pool", NAME_LIMIT, {"pool": "p" * (NAME_LIMIT + 1)}),
        "tenant": ("tenant", NAME_LIMIT, {"tenant": "t" * (NAME_LIMIT + 1)}),
        "tag name": ("tags name", NAME_LIMIT, {"tags": {"n" * (NAME_LIMIT + 1): "v"}}),
        "tag value": ("tags['n']", VALUE_LIMIT, {"tags": {"n": "v" * (VALUE_LIMIT + 1)}}),
        "label name": ("labels name", NAME_LIMIT, {"labels": {"n" * (NAME_LIMIT + 1): "v"}}),
        "label value": ("labels['n']", VALUE_LIMIT, {"labels": {"n": "v" * (VALUE_LIMIT + 1)}}),
        "dependency": ("a dependency's key", KEY_LIMIT, {"after": "d" * (KEY_LIMIT + 1)}),
        "resource": ("resource name", NAME_LIMIT, {"resources": {"r" * (NAME_LIMIT + 1): 1}}),
    }
    for what, (field, limit, options) in too_long.items():
        with pytest.raises(cronoq.InvalidTask) as caught:
            cronoq.Task({}, **options)
        assert f"{field} is" in str(caught.value) and f"the limit is {limit} bytes" in str(caught.value), what
    # At the limit, in bytes: two-byte characters count twice.
    assert cronoq.Task({}, key="é" * (KEY_LIMIT // 2)).key == "é" * (KEY_LIMIT // 2)
    assert cronoq.Task({}, kind="k" * NAME_LIMIT, tags={"n" * NAME_LIMIT: "v" * VALUE_LIMIT}).kind
    with pytest.raises(ValueError, match="pool name is 256 bytes"):
        cronoq.Pool("p" * (NAME_LIMIT + 1), Work())

    # Virtual time: on the wall clock, the every-minute schedule's first occurrence
    # is created at once when this runs in the last seconds of a minute.
    sched = cronoq.Scheduler([pool(Work(), capacity=0)], clock=cronoq.VirtualClock())
    async with sched:
        with pytest.raises(cronoq.InvalidTask, match=f"key is {KEY_LIMIT + 1} bytes"):
            await sched.submit({}, key="x" * (KEY_LIMIT + 1))
        with pytest.raises(cronoq.InvalidTask, match=f"schedule name is {KEY_LIMIT + 1} bytes"):
            await sched.add_recurring("n" * (KEY_LIMIT + 1), "* * * * *", {})
        with pytest.raises(cronoq.InvalidTask, match=f"recurring schedule's key is {RECURRING_KEY_LIMIT + 1}"):
            await sched.add_recurring("fine", "* * * * *", {}, key="k" * (RECURRING_KEY_LIMIT + 1))
        await sched.add_recurring("n" * KEY_LIMIT, "* * * * *", {}, key="k" * RECURRING_KEY_LIMIT)
        snap = await sched.snapshot()
        assert snap.totals["submitted"] == 0, "nothing of a refused submission may be admitted"


async def test_a_long_key_is_refused_at_admission_and_every_store_keeps_working(backend):
    store = backend.store()
    work = Work()
    sched = cronoq.Scheduler([pool(work, capacity=0)], store=store, clock=half_past())
    await sched.start()
    try:
        before = await sched.enqueue({"name": "before"}, key="before")
        for options in ({"key": text_of(3000)}, {"kind": text_of(3000)}, {"tags": {"t": text_of(3000)}}):
            with pytest.raises(cronoq.InvalidTask, match="the limit is"):
                await sched.enqueue({"name": "long"}, **options)
        with pytest.raises(cronoq.InvalidTask, match="schedule name"):
            await sched.add_recurring(text_of(3000), "0 * * * *", {})
        at_limit = await sched.enqueue({"name": "at limit"}, key=text_of(KEY_LIMIT, seed=1))
        await sched.add_recurring(text_of(KEY_LIMIT, seed=2), "0 * * * *", {"name": "recurring"})
        after = await sched.enqueue({"name": "after"}, key="after")
    finally:
        await sched.shutdown()
    assert [row[0] for row in backend.rows()] == [before, at_limit, after]
    again = cronoq.Scheduler([pool(work, capacity=0)], store=backend.store(), clock=half_past())
    await again.start()
    try:
        assert (await again.info(text_of(KEY_LIMIT, seed=1))).id == at_limit
        assert len(again._driver.core.recurring) == 1
    finally:
        await again.shutdown()


# ---------------------------------------------------------------- a row the database refuses


def refuse_kind(backend, kind: str) -> None:
    """Make the database itself refuse task rows of ``kind`` (a constraint)."""
    if backend.kind == "sqlite":
        backend.sql(f"CREATE TRIGGER refuse_{kind} BEFORE INSERT ON cronoq_tasks "
                    f"WHEN NEW.kind = '{kind}' BEGIN SELECT RAISE(ABORT, 'refused by a test'); END")
    else:
        backend.sql(f"ALTER TABLE {backend.table('cronoq_tasks')} "
                    f"ADD CONSTRAINT refuse_{kind} CHECK (kind <> '{kind}')")


async def test_a_row_the_database_refuses_does_not_block_the_commits_after_it(backend, caplog):
    store = backend.store()
    work = Work()
    sched = cronoq.Scheduler([pool(work, capacity=2)], store=store)
    await sched.start()
    refuse_kind(backend, "poison")
    try:
        with caplog.at_level(logging.ERROR, logger="cronoq.store"):
            # One commit carries them all (group commit): the refused row must be isolated.
            results = await asyncio.gather(
                *(sched.submit({"name": f"good-{i}"}, key=f"good-{i}") for i in range(10)),
                sched.submit({"name": "poison"}, kind="poison", key="poison"),
                *(sched.submit({"name": f"good-{i}"}, key=f"good-{i}") for i in range(10, 20)),
                return_exceptions=True)
        refused = results[10]
        assert isinstance(refused, StoreRejected), refused
        assert "refused" in str(refused) and "not admitted" in str(refused)
        good = results[:10] + results[11:]
        assert all(isinstance(h, cronoq.TaskHandle) for h in good), good
        for handle in good:
            assert await handle == {"done": handle.key}
        with pytest.raises(cronoq.UnknownTask):
            await sched.info("poison")
        # Later commits go through, and the key is free again for a good submission.
        assert await (await sched.submit({"name": "poison"}, key="poison")) == {"done": "poison"}
        assert "poison" not in [name for name, _ in work.started[:20]]
        assert any(getattr(r, "action", None) == "store_rejected" and r.levelno == logging.ERROR
                   for r in caplog.records)
    finally:
        await sched.shutdown()
    rows = backend.rows()
    assert sorted(row[1] for row in rows) == sorted([f"good-{i}" for i in range(20)] + ["poison"])
    assert all(row[2] == "succeeded" for row in rows)


async def test_a_schedule_the_database_refuses_is_removed_and_the_others_are_written(sqlite_backend):  # noqa: F811
    store = sqlite_backend.store()
    sched = cronoq.Scheduler([pool(Work(), capacity=0)], store=store, clock=half_past())
    await sched.start()
    sqlite_backend.sql("CREATE TRIGGER refuse_schedule BEFORE INSERT ON cronoq_schedules "
                       "WHEN NEW.name = 'refused' BEGIN SELECT RAISE(ABORT, 'refused by a test'); END")
    try:
        refused, kept, task = await asyncio.gather(
            sched.add_recurring("refused", "0 * * * *", {}), sched.add_recurring("kept", "0 * * * *", {}),
            sched.enqueue({"name": "task"}, key="task"), return_exceptions=True)
        assert isinstance(refused, StoreRejected) and "refused" in str(refused), refused
        assert kept is None and isinstance(task, int)
        assert sorted(sched._driver.core.recurring) == ["kept"], "memory and store agree"
        assert await sched.remove_recurring("refused") is False
    finally:
        await sched.shutdown()
    assert [row[0] for row in sqlite_backend.sql("SELECT name FROM cronoq_schedules")] == ["kept"]
    assert [row[1] for row in sqlite_backend.rows()] == ["task"]


async def test_a_refused_task_never_runs_and_its_dependents_are_skipped():
    database = MemoryDatabase()
    database.reject = lambda row: "no" if row.kind == "poison" else None
    work = Work()
    sched = cronoq.Scheduler([pool(work, capacity=2)], store=InMemoryStore(database))
    await sched.start()
    try:
        parent, child, other = await asyncio.gather(
            sched.submit({"name": "parent"}, kind="poison", key="parent"),
            sched.submit({"name": "child"}, key="child", after="parent"),
            sched.submit({"name": "other"}, key="other"), return_exceptions=True)
        assert isinstance(parent, StoreRejected)
        assert await other == {"done": "other"}
        assert isinstance(child, cronoq.TaskHandle)   # admitted: its own row was written
        with pytest.raises(cronoq.TaskFailed) as caught:
            await child
        assert caught.value.status == "skipped"
        assert [name for name, _ in work.started] == ["other"]
        assert sched._driver.log.refused == 1
    finally:
        await sched.shutdown()
    assert sorted(row["key"] for row in database.tasks.values()) == ["child", "other"]


async def test_a_stored_schedule_without_its_payload_is_quarantined_whatever_the_codec():
    class LenientCodec:   # reads a missing payload as None instead of raising
        def encode(self, value):
            return json.dumps(value).encode()

        def decode(self, data):
            return None if data is None else json.loads(data)

    database = MemoryDatabase()
    first = cronoq.Scheduler([pool(Work(), capacity=0)], store=InMemoryStore(database), codec=LenientCodec(),
                             clock=half_past())
    async with first:
        await first.add_recurring("hourly", "0 * * * *", {"n": 1})
        await first.add_recurring("daily", "0 0 * * *", {"n": 2})
    record, _ = database.schedules["hourly"]
    database.schedules["hourly"] = (record, None)   # a store that lost the bytes
    second = cronoq.Scheduler([pool(Work(), capacity=0)], store=InMemoryStore(database), codec=LenientCodec(),
                              clock=half_past())
    async with second:
        snap = await second.snapshot()
    assert snap.totals["recurring_invalid"] == 1


# ---------------------------------------------------------------- a submit that raised was not admitted


async def test_a_submit_that_raised_during_an_outage_is_not_admitted():
    database = MemoryDatabase()
    work = Work()
    store = InMemoryStore(database)
    store.commit_timeout = 0.3   # the calls after the first wait this long, then raise
    sched = cronoq.Scheduler([pool(work, capacity=2)], store=store)
    await sched.start()
    try:
        database.available = False
        for call in (sched.submit({"name": "lost"}, key="lost"), sched.enqueue({"name": "lost-2"}),
                     sched.submit_batch([cronoq.Task({"name": "lost-3"}), cronoq.Task({"name": "lost-4"})])):
            with pytest.raises(cronoq.SchedulerError, match="not admitted"):
                await call
        with pytest.raises(cronoq.UnknownTask):
            await sched.info("lost")
        database.available = True
        assert await (await sched.submit({"name": "after"})) == {"done": "after"}
        retry = await sched.submit({"name": "lost"}, key="lost")
        assert not retry.duplicate
        await retry
        assert (await sched.snapshot()).totals["submitted"] == 2
    finally:
        await sched.shutdown()
    assert sorted(name for name, _ in work.started) == ["after", "lost"]
    assert sorted(row["key"] or "" for row in database.tasks.values()) == ["", "lost"]
    # After a restart too: nothing of what raised comes back.
    again = cronoq.Scheduler([pool(work, capacity=2)], store=InMemoryStore(database))
    await again.start()
    await again.shutdown()
    assert sorted(name for name, _ in work.started) == ["after", "lost"]


async def test_a_submit_that_timed_out_is_not_admitted_and_one_being_written_gets_the_outcome():
    database = MemoryDatabase()
    store = InMemoryStore(database)
    store.commit_timeout = 0.2
    work = Work()
    sched = cronoq.Scheduler([pool(work, capacity=2)], store=store)
    await sched.start()
    try:
        database.commit_delay = 1.0   # the next commit stays under way well past commit_timeout
        first = asyncio.ensure_future(sched.submit({"name": "being written"}, key="first"))
        await eventually(lambda: sched._driver.log.sending, what="the first commit to be under way")
        with pytest.raises(cronoq.SchedulerError, match="not admitted"):
            await sched.submit({"name": "timed out"}, key="second")   # waits in the next batch
        with pytest.raises(cronoq.UnknownTask):
            await sched.info("second")
        # The first one's rows were being written when its time ran out: the commit decides.
        handle = await first
        database.commit_delay = 0.0
        assert await handle == {"done": "being written"}
        assert await (await sched.submit({"name": "after"})) == {"done": "after"}
    finally:
        await sched.shutdown()
    assert sorted(name for name, _ in work.started) == ["after", "being written"]
    assert sorted(row["key"] or "" for row in database.tasks.values()) == ["", "first"]


async def test_a_submit_that_raised_on_sqlite_is_not_in_the_file(sqlite_backend):  # noqa: F811
    store = sqlite_backend.store(commit_timeout=0.5)
    work = Work()
    sched = cronoq.Scheduler([pool(work, capacity=0)], store=store)
    await sched.start()
    try:
        kept = await sched.enqueue({"name": "kept"}, key="kept")
        with sqlite_backend.writes_blocked():
            with pytest.raises(cronoq.SchedulerError, match="not admitted"):
                await sched.enqueue({"name": "raised"}, key="raised")
        after = await sched.enqueue({"name": "after"}, key="after")
    finally:
        await sched.shutdown()
    assert [row[1] for row in sqlite_backend.rows()] == ["kept", "after"]
    assert [row[0] for row in sqlite_backend.rows()] == [kept, after]


# ---------------------------------------------------------------- passwords in PostgreSQL URLs


async def test_a_postgresql_password_is_masked_in_every_form(unused_tcp_port):
    need_psycopg()
    secret = "pa@ss-SEKRIT"
    urls = [f"postgresql://user:{secret}@127.0.0.1:{unused_tcp_port}/db",
            f"postgresql://user@127.0.0.1:{unused_tcp_port}/db?password={secret}&sslmode=disable"]
    for url in urls:
        store = cronoq.PostgresStore(url, session_timeout=1.0, lock_poll=0.05)
        assert store.url.password == secret, "the password still reaches the driver"
        assert store.url.host == "127.0.0.1" and "password" not in store.url.query
        for text in (repr(store), str(store.url), repr(store.url)):
            assert "SEKRIT" not in text, text
        sched = cronoq.Scheduler([pool(Work())], store=store)
        with pytest.raises(cronoq.SchedulerError) as caught:
            await sched.start()
        shown = "".join(traceback.format_exception(caught.value))
        assert "SEKRIT" not in shown, shown
        await store.close()
    with pytest.raises(ValueError) as caught:
        cronoq.PostgresStore(f"postgresql://user:{secret}@host:port/db")
    assert "SEKRIT" not in str(caught.value)
