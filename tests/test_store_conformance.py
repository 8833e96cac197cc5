"""The store conformance suite: every test runs against a SQLite file and
against a schema on a throwaway PostgreSQL server (``backend`` fixture), so
both stores are held to one behaviour. After each test, no store may have a
connection checked out."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

import cronoq
from cronoq.store.base import ID_EPOCH_BITS
from cronoq.store.schema import HEAD
from storekit import Work, backend, child_env, eventually, pool  # noqa: F401  (backend is a fixture)

pytestmark = pytest.mark.asyncio


def scheduler(store, *pools_, **options) -> cronoq.Scheduler:
    return cronoq.Scheduler(list(pools_), store=store, **options)


# ---------------------------------------------------------------- recovery


async def test_restart_recovers_queued_running_retrying_and_finished_tasks(backend):
    work = Work()
    a = scheduler(backend.store(cluster=False), pool(work, "work", capacity=1,
                                        retry=cronoq.RetryPolicy(max_attempts=3, initial_backoff=0.05,
                                                                 jitter=False)),
                  pool(work, "flaky", capacity=1))
    await a.start()
    done = await a.submit({"op": "echo", "name": "done", "value": {"answer": 42}}, pool="work", key="done")
    assert await done == {"answer": 42}
    blocker = await a.submit({"op": "block", "name": "blocker"}, pool="work", key="blocker")
    await asyncio.wait_for(work.running.wait(), 5)
    queued = [await a.enqueue({"name": f"q{i}"}, pool="work", key=f"q{i}") for i in range(3)]
    flaky = await a.enqueue({"op": "retry", "name": "flaky"}, pool="flaky", key="flaky",
                            retry=cronoq.RetryPolicy(max_attempts=5, initial_backoff=3600, jitter=False))
    await eventually(lambda: a.info(flaky), what="the flaky task's first attempt")
    await eventually(lambda: _status_is(a, flaky, "retrying"), what="flaky retrying")
    assert (await a.info(blocker.id)).status == "running"
    old_ids = [done.id, blocker.id, *queued, flaky]
    await a._driver.log.durable()   # everything above is stored
    assert [row[2:4] for row in backend.rows("key = ?", ("flaky",))] == [("retrying", 1)]
    assert [row[2:4] for row in backend.rows("key = ?", ("blocker",))] == [("running", 1)]
    a._leadership.lost("simulated crash")
    await backend.crash(a.store)

    work2 = Work()
    work2.release.set()   # the blocker's next attempt returns at once
    b = scheduler(backend.store(cluster=False), pool(work2, "work", capacity=1,
                                        retry=cronoq.RetryPolicy(max_attempts=3, initial_backoff=0.05,
                                                                 jitter=False)),
                  pool(work2, "flaky", capacity=1))
    await b.start()
    try:
        assert b.epoch > a.epoch
        # The finished task and its output survive; handle(key) reads the stored output.
        assert (await b.info("done")).status == "succeeded"
        assert await (await b.handle("done")) == {"answer": 42}
        # The interrupted attempt counts as used: attempt 2 runs; the queued ones follow in order.
        blocked = await b.handle("blocker")
        assert blocked.id == blocker.id
        assert await blocked == {"done": "blocker"}
        assert (await b.info(blocker.id)).attempt == 2
        for i, task_id in enumerate(queued):
            assert await (await b.handle(f"q{i}")) == {"done": f"q{i}"}
            assert (await b.info(task_id)).attempt == 1
        order = [name for name, _ in work2.started if name in ("q0", "q1", "q2")]
        assert order == ["q0", "q1", "q2"]
        assert ("blocker", 2) in work2.started and ("blocker", 1) not in work2.started
        # The retrying task keeps its attempt count: its next attempt is the second.
        await eventually(lambda: any(n == "flaky" for n, _ in work2.started), what="flaky's retry")
        assert ("flaky", 2) in work2.started
        # Ids are kept, and new ones are above every old one (the new epoch is in the top bits).
        new = await b.enqueue({"name": "new"}, pool="work")
        assert new > max(old_ids)
        assert new >> ID_EPOCH_BITS == b.epoch
    finally:
        await b.shutdown()


async def _status_is(sched, ref, status):
    return (await sched.info(ref)).status == status


async def test_running_attempt_on_its_last_try_is_dead_lettered_after_restart(backend):
    work = Work()
    a = scheduler(backend.store(), pool(work, retry=cronoq.RetryPolicy.none()))
    await a.start()
    task = await a.submit({"op": "block", "name": "last"}, key="last")
    await asyncio.wait_for(work.running.wait(), 5)
    a._leadership.lost("simulated crash")
    await backend.crash(a.store)
    b = scheduler(backend.store(), pool(Work(), retry=cronoq.RetryPolicy.none()))
    await b.start()
    try:
        info = await b.info("last")
        assert info.id == task.id and info.status == "dead_lettered" and info.attempt == 1
        assert "restart" in info.message
    finally:
        await b.shutdown()
    assert backend.rows("key = ?", ("last",))[0][2] == "dead_lettered"


async def test_clean_shutdown_keeps_queued_work_for_the_next_leader(backend):
    a = scheduler(backend.store(), pool(Work(), capacity=0))
    await a.start()
    ids = await a.enqueue_batch([cronoq.Task({"name": f"t{i}"}, key=f"t{i}") for i in range(50)])
    await a.shutdown()
    work = Work()
    b = scheduler(backend.store(), pool(work, capacity=2))
    await b.start()
    try:
        handles = [await b.handle(f"t{i}") for i in range(50)]
        assert [h.id for h in handles] == ids
        assert [await h for h in handles] == [{"done": f"t{i}"} for i in range(50)]
        assert sorted(name for name, _ in work.started) == sorted(f"t{i}" for i in range(50))
    finally:
        await b.shutdown()


async def test_dependencies_and_keys_survive_a_restart(backend):
    a = scheduler(backend.store(), pool(Work(), capacity=0))
    await a.start()
    await a.submit_batch([cronoq.Task({"name": "parent"}, key="parent"),
                          cronoq.Task({"name": "child"}, key="child", after="parent")])
    assert (await a.info("child")).status == "blocked"
    await a.shutdown()
    work = Work()
    b = scheduler(backend.store(), pool(work, capacity=2))
    await b.start()
    try:
        again = await b.submit({"name": "parent again"}, key="parent")   # the key still dedupes
        assert again.duplicate
        assert await (await b.handle("child")) == {"done": "child"}
        assert [name for name, _ in work.started] == ["parent", "child"]
    finally:
        await b.shutdown()


async def test_acknowledged_submit_survives_a_killed_process(backend):
    """Kill -9 right after the submit returned: the task is in the store."""
    if backend.kind == "sqlite":
        make = f"cronoq.SqliteStore({backend.path!r}, lease_ttl=1.0, lease_renew=0.2, lock_poll=0.05)"
    else:
        make = f"cronoq.PostgresStore({backend.server.url!r}, schema={backend.schema!r}, lock_poll=0.05)"
    script = textwrap.dedent(f"""
        import asyncio, sys, cronoq
        async def run(ctx, payload):
            return payload
        async def main():
            sched = cronoq.Scheduler([cronoq.Pool("default", run, min=0, initial=0, autoscale=False)],
                                     store={make})
            await sched.start()
            task_id = await sched.enqueue({{"doc": 42, "text": "caf\\u00e9"}}, key="summary:42")
            print(task_id, flush=True)
            await asyncio.sleep(60)
        asyncio.run(main())
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env=child_env(), text=True)
    try:
        line = await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), 60)
        assert line.strip(), child.stderr.read()
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
        child.stderr.close()
    task_id = int(line)
    work = Work()
    b = scheduler(backend.store(), pool(work))
    await asyncio.wait_for(b.start(), 10)   # SQLite: the dead child's lease runs out first
    try:
        handle = await b.handle("summary:42")
        assert handle.id == task_id
        await handle
        assert work.started == [(None, 1)]
        assert backend.rows("id = ?", (task_id,))[0][2] == "succeeded"
    finally:
        await b.shutdown()


# ---------------------------------------------------------------- leadership


async def test_standby_waits_and_takes_over_at_once_on_clean_shutdown(backend):
    a = scheduler(backend.store(cluster=False), pool(Work(), capacity=0))
    await a.start()
    task_id = await a.enqueue({"name": "from a"}, key="from-a")
    b = scheduler(backend.store(cluster=False), pool(Work(), capacity=0))
    starting = asyncio.create_task(b.start())
    await asyncio.sleep(0.4)
    assert not starting.done(), "the standby must wait in start() while the leader runs"
    loop = asyncio.get_running_loop()
    stopped = loop.time()
    await a.shutdown()
    await asyncio.wait_for(starting, 5)
    took = loop.time() - stopped
    try:
        assert took < 0.8, f"the standby took {took:.2f} s to take over after a clean shutdown"
        assert b.epoch == a.epoch + 1
        assert (await b.info("from-a")).id == task_id
    finally:
        await b.shutdown()


async def test_a_waiting_standby_can_be_shut_down(backend):
    a = scheduler(backend.store(cluster=False), pool(Work(), capacity=0))
    await a.start()
    b = scheduler(backend.store(cluster=False), pool(Work(), capacity=0))
    starting = asyncio.create_task(b.start())
    await asyncio.sleep(0.2)
    await b.shutdown()
    with pytest.raises(cronoq.SchedulerError, match="waited to lead"):
        await asyncio.wait_for(starting, 2)
    assert not b.running
    with pytest.raises(cronoq.SchedulerError):
        await b.start()
    # Cancelling a waiting start() leaves no leadership behind either.
    c = scheduler(backend.store(cluster=False), pool(Work(), capacity=0))
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(c.start(), 0.3)
    assert a.running
    await a.shutdown()
    d = scheduler(backend.store(cluster=False), pool(Work(), capacity=0))
    await asyncio.wait_for(d.start(), 1.0)   # at once: nobody else holds the lease / lock
    await d.shutdown()


async def test_standby_takes_over_when_the_leader_dies(backend):
    a = scheduler(backend.store(cluster=False), pool(Work(), capacity=0))
    await a.start()
    task_id = await a.enqueue({"name": "from a"}, key="from-a")
    b = scheduler(backend.store(cluster=False), pool(Work(), capacity=0))
    starting = asyncio.create_task(b.start())
    await asyncio.sleep(0.3)
    assert not starting.done()
    loop = asyncio.get_running_loop()
    died = loop.time()
    a._leadership.lost("simulated crash")
    await backend.crash(a.store, expire=False)   # no release: the lease must run out / the session end
    await asyncio.wait_for(starting, 10)
    took = loop.time() - died
    try:
        if backend.kind == "sqlite":
            assert 0.5 < took < 3.0, f"takeover after {took:.2f} s; the lease lasts 1 s"
        else:
            assert took < 2.0, f"takeover after {took:.2f} s"
        assert (await b.info("from-a")).id == task_id
        assert b.epoch > a.epoch
    finally:
        await b.shutdown()


async def test_a_paused_leader_is_fenced_and_stops(backend):
    a = scheduler(backend.store(cluster=False), pool(Work(), capacity=0))
    await a.start()
    before = await a.enqueue({"name": "before"}, key="before")
    b = scheduler(backend.store(cluster=False), pool(Work(), capacity=0))
    starting = asyncio.create_task(b.start())
    await asyncio.sleep(0.2)
    await backend.depose(a.store)    # a is "paused": it does not notice
    await asyncio.wait_for(starting, 5)
    assert b.epoch > a.epoch
    try:
        with pytest.raises(cronoq.SchedulerError):
            await a.enqueue({"name": "too late"}, key="too-late")
        assert not a.running
        assert "fenced" in a.lost_reason
        with pytest.raises(cronoq.SchedulerError):
            await a.enqueue({"name": "later still"})
        assert backend.rows("key = ?", ("too-late",)) == []
        assert (await b.info("before")).id == before
        with pytest.raises(cronoq.UnknownTask):
            await b.info("too-late")
    finally:
        await b.shutdown()
        await a.shutdown()


async def test_recurring_schedule_continues_across_a_failover(backend):
    started: list[tuple[str, str]] = []   # (occurrence key, which leader ran it)

    def ticker(leader: str):
        async def tick(ctx, payload):
            started.append((ctx.key, leader))
        return cronoq.Pool("default", tick, min=2, max=2, autoscale=False)

    def due(key: str) -> float:
        return dt.datetime.fromisoformat(key.split("@", 1)[1].replace("Z", "+00:00")).timestamp()

    a = scheduler(backend.store(cluster=False), ticker("a"))
    await a.start()
    await a.add_recurring("tick", "* * * * * *", {"n": 1}, key="tick", tolerance=0.3)
    def finished_on_a() -> bool:
        # Crash only once every occurrence a started is stored as finished: one still
        # running at the crash is rightly run again by the next leader (at least once).
        stored = {key: status for _, key, status, _, _ in backend.rows()}
        return len(started) >= 2 and all(stored.get(key) == "succeeded" for key, _ in started)

    await eventually(finished_on_a, timeout=5, what="two occurrences finished on the first leader")
    a._leadership.lost("simulated crash")   # no await since the check: nothing new starts on a
    await backend.crash(a.store)
    await asyncio.sleep(1.6)   # nobody leads for a while: at least one occurrence comes due meanwhile
    b = scheduler(backend.store(cluster=False), ticker("b"))
    await asyncio.wait_for(b.start(), 10)
    resumed = dt.datetime.now(dt.timezone.utc).timestamp()
    try:
        await eventually(lambda: any(due(k) > resumed + 1 for k, leader in started if leader == "b"),
                         timeout=5, what="on-time occurrences on the new leader")
    finally:
        await b.shutdown()
    keys = [key for key, _ in started]
    assert len(keys) == len(set(keys)), f"an occurrence ran twice: {started}"
    # What came due while nobody led runs once, late (on_miss="run_late"), not once per missed second.
    late = [key for key, leader in started if leader == "b" and due(key) < resumed - 0.05]
    assert len(late) == 1, f"not exactly one late occurrence after the failover: {late} (resumed {resumed})"
    assert [leader for _, leader in started][:2] == ["a", "a"]


# ---------------------------------------------------------------- bad data and bad input


async def test_undecodable_rows_are_quarantined_instead_of_blocking_start(backend):
    a = scheduler(backend.store(), pool(Work(), capacity=0))
    await a.start()
    good = await a.enqueue({"name": "good"}, key="good")
    bad_record = await a.enqueue({"name": "bad record"}, key="bad-record")
    bad_payload = await a.enqueue({"name": "bad payload"}, key="bad-payload")
    bad_status = await a.enqueue({"name": "bad status"}, key="bad-status")
    # Due only at midnight of a 29 February: neither fires while the test runs (an hourly
    # one fired once at the top of the hour, and live_tasks counted its task).
    await a.add_recurring("broken", "0 0 29 2 *", {"n": 1})
    await a.add_recurring("fine", "0 0 29 2 *", {"n": 2})
    await a.shutdown()
    tasks, schedules = backend.table("cronoq_tasks"), backend.table("cronoq_schedules")
    backend.sql(f"UPDATE {tasks} SET record = ? WHERE id = ?", ("{not json", bad_record))
    backend.sql(f"UPDATE {tasks} SET payload = ? WHERE id = ?", (b"\xff\xfe not json", bad_payload))
    backend.sql(f"UPDATE {tasks} SET status = ? WHERE id = ?", ("exploded", bad_status))
    backend.sql(f"UPDATE {schedules} SET record = ? WHERE name = ?", ('{"v": 1}', "broken"))

    b = scheduler(backend.store(), pool(Work(), capacity=0))
    await asyncio.wait_for(b.start(), 5)
    try:
        assert (await b.info(good)).status == "ready"
        for task_id in (bad_record, bad_payload, bad_status):
            info = await b.info(task_id)
            assert info.status == "failed", info
            assert "quarantined" in info.message
        snap = await b.snapshot()
        assert snap.totals["recurring_invalid"] == 1
        assert snap.live_tasks == 1
    finally:
        await b.shutdown()
    stored = {row[0]: row for row in backend.rows()}
    for task_id in (bad_record, bad_payload, bad_status):
        assert stored[task_id][2] == "failed" and "quarantined" in stored[task_id][4]
    assert stored[good][2] == "ready"


async def test_a_payload_json_cannot_hold_is_refused_before_anything_is_stored(backend):
    sched = scheduler(backend.store(), pool(Work(), capacity=0))
    await sched.start()
    try:
        for payload in (b"bytes", {1, 2}, float("nan"), object(), {"text": "\ud800"}):
            with pytest.raises(TypeError):
                await sched.enqueue(payload, key="k")
        with pytest.raises(TypeError):
            await sched.enqueue_batch([cronoq.Task({"ok": 1}, key="b1"), cronoq.Task(b"no", key="b2")])
        with pytest.raises(TypeError):
            await sched.add_recurring("r", "0 * * * *", {"x": {3}})
        with pytest.raises(cronoq.UnknownTask):
            await sched.info("k")
        with pytest.raises(cronoq.UnknownTask):
            await sched.info("b1")
        assert backend.rows() == []
        assert backend.sql(f"SELECT count(*) FROM {backend.table('cronoq_schedules')}") == [(0,)]
        # The scheduler still works.
        await sched.enqueue({"fine": True}, key="fine")
    finally:
        await sched.shutdown()
    assert [row[1] for row in backend.rows()] == ["fine"]


async def test_nul_characters_are_handled_the_same_in_both_stores(backend):
    work = Work()

    async def run(ctx, payload):
        if payload.get("fail"):
            raise cronoq.Permanent("bad\x00thing \ud800 here")
        return {"echo": payload["text"]}

    sched = scheduler(backend.store(), cronoq.Pool("default", run, min=2, max=2, autoscale=False))
    await sched.start()
    try:
        for options in ({"key": "a\x00b"}, {"kind": "k\x00"}, {"tags": {"t": "x\x00"}}, {"pool": "p\x00"}):
            with pytest.raises(cronoq.InvalidTask):
                await sched.enqueue({"x": 1}, **options)
        with pytest.raises(ValueError):
            await sched.add_recurring("na\x00me", "0 * * * *", {})
        ok = await sched.submit({"text": "nul \x00 inside"}, key="payload-nul")
        assert await ok == {"echo": "nul \x00 inside"}
        failed = await sched.submit({"fail": True}, key="message-nul")
        with pytest.raises(cronoq.TaskFailed) as caught:
            await failed
        assert caught.value.message == "bad\ufffdthing \ud800 here"
    finally:
        await sched.shutdown()
    # Stored: the payload and output exactly (JSON escapes NUL), the message with U+FFFD.
    row = backend.rows("key = ?", ("message-nul",))[0]
    assert row[4] == "bad\ufffdthing \ufffd here"
    assert len(backend.rows()) == 2
    again = scheduler(backend.store(), cronoq.Pool("default", run, min=1, max=1, autoscale=False))
    await again.start()
    try:
        assert await (await again.handle("payload-nul")) == {"echo": "nul \x00 inside"}
        assert (await again.info("message-nul")).message == "bad\ufffdthing \ufffd here"
    finally:
        await again.shutdown()


# ---------------------------------------------------------------- outages


async def test_a_store_that_is_down_fails_calls_clearly_and_loses_nothing_accepted(backend):
    sched = scheduler(backend.store(commit_timeout=0.5), pool(Work(), capacity=0))
    await sched.start()
    try:
        accepted = [await sched.enqueue({"n": i}, key=f"before-{i}") for i in range(3)]
        with backend.writes_blocked():
            with pytest.raises(cronoq.SchedulerError) as caught:
                await sched.enqueue({"n": 99}, key="during")
            assert "store" in str(caught.value) and "not admitted" in str(caught.value)
            with pytest.raises(cronoq.SchedulerError) as caught:
                await sched.cancel("before-0")
            assert "written when the store returns" in str(caught.value)
        # Back: the cancel is written; the submit that raised was not admitted, so its retry is new.
        retry = await sched.submit({"n": 99}, key="during")
        assert not retry.duplicate
        accepted.append(retry.id)
        assert (await sched.info("before-0")).status == "cancelled"
        after = await sched.enqueue({"n": 100}, key="after")
        accepted.append(after)
    finally:
        await sched.shutdown()
    rows = {row[0]: row for row in backend.rows()}
    assert set(accepted) == set(rows)
    assert rows[accepted[0]][2] == "cancelled"


async def test_a_batch_committed_twice_is_written_once(backend):
    """The runtime retries a batch whose commit answer was lost: writing it
    again must succeed and change nothing."""
    from cronoq.store.base import Batch, StatusRow, TaskRow

    store = backend.store()
    epoch = await store.acquire_leadership()
    try:
        base = epoch << ID_EPOCH_BITS
        batch = Batch(tasks=[TaskRow(base + i, "default", "default", 2, f"k{i}",
                                     {"v": 1, "kind": "default", "priority": 2, "key": f"k{i}"},
                                     b'{"i": %d}' % i, 1_000 + i) for i in range(1, 41)],
                      statuses=[StatusRow(base + 1, "succeeded", 1, 5_000, None)],
                      outputs=[(base + 1, b'"out"')], high_water=base + 40)
        await store.commit(epoch, batch)
        await store.commit(epoch, batch)
        recovered = await store.recover(10_000, 3600 * 10**9)
        tasks = sorted(recovered.tasks, key=lambda task: task.id)
        assert [t.id for t in tasks] == [base + i for i in range(1, 41)]
        assert tasks[0].status == "succeeded" and tasks[1].status == "ready"
        assert tasks[5].payload == b'{"i": 6}' and tasks[5].record["key"] == "k6"
        assert recovered.high_water == base + 40
        assert await store.load_output(base + 1) == b'"out"'
        assert await store.load_output(base + 2) is None
    finally:
        await store.release_leadership()


# ---------------------------------------------------------------- schema


async def test_the_migrated_database_matches_the_metadata(backend):
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from cronoq.store.schema import tables

    store = backend.store()
    await store.prune()   # connects and migrates
    engine = create_engine(store.url if backend.kind == "postgres" else f"sqlite:///{backend.path}",
                           poolclass=NullPool)
    schema = backend.schema
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={
                "compare_type": True, "include_schemas": schema is not None,
                "version_table": "cronoq_schema_version", "version_table_schema": schema,
                "include_name": lambda name, type_, parent: type_ != "schema" or name == schema})
            assert compare_metadata(context, tables(schema).metadata) == []
            names = {row[0] for row in conn.exec_driver_sql(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'" if schema is None else
                f"SELECT tablename FROM pg_tables WHERE schemaname = '{schema}'")}
            assert names == {"cronoq_tasks", "cronoq_schedules", "cronoq_meta", "cronoq_schema_version",
                             "cronoq_checkpoints", "cronoq_members", "cronoq_inbox",
                             "cronoq_attempts"}
            assert conn.exec_driver_sql(
                f"SELECT version_num FROM {backend.table('cronoq_schema_version')}").scalar() == HEAD
    finally:
        engine.dispose()


async def test_the_newest_revision_is_the_one_the_build_expects():
    from alembic.script import ScriptDirectory

    from cronoq.store.migrate import alembic_config

    script = ScriptDirectory.from_config(alembic_config())
    assert script.get_heads() == [HEAD]
    assert os.path.isdir(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                      "migrations", "versions"))


async def test_an_older_build_refuses_a_newer_schema(backend):
    store = backend.store()
    await store.prune()
    backend.sql(f"UPDATE {backend.table('cronoq_schema_version')} SET version_num = ?", ("0099_future",))
    sched = scheduler(backend.store(), pool(Work()))
    with pytest.raises(cronoq.SchedulerError) as caught:
        await asyncio.wait_for(sched.start(), 10)
    assert "0099_future" in str(caught.value) and repr(HEAD) in str(caught.value)
    assert not sched.running


def _checkpoints_revision() -> tuple[str, str]:
    """(revision, the revision it upgrades) of the migration that adds
    checkpoints, found by its file, not by its number (revisions may be
    renumbered when branches merge)."""
    from alembic.script import ScriptDirectory

    from cronoq.store.migrate import alembic_config

    script = ScriptDirectory.from_config(alembic_config())
    for rev in script.walk_revisions():
        if rev.path is not None and rev.path.endswith("_checkpoints.py"):
            assert isinstance(rev.down_revision, str)
            return rev.revision, rev.down_revision
    raise AssertionError("no migration adds the checkpoints")


async def test_a_database_before_checkpoints_is_upgraded_to_the_head_with_its_tasks(backend):
    """A database written by a build without checkpoints gains their table on
    the next connection, and those of the processes' cluster (every revision
    up to the head), and keeps its tasks."""
    from alembic import command

    from cronoq.store.migrate import alembic_config

    _, before = _checkpoints_revision()
    engine = create_engine(backend.store().url if backend.kind == "postgres" else f"sqlite:///{backend.path}",
                           poolclass=NullPool)
    try:
        with engine.begin() as conn:
            if backend.schema is not None:
                conn.exec_driver_sql(f'CREATE SCHEMA IF NOT EXISTS "{backend.schema}"')
            command.upgrade(alembic_config(conn, backend.schema), before)
    finally:
        engine.dispose()
    tasks = backend.table("cronoq_tasks")
    backend.sql(f"INSERT INTO {tasks} (id, pool, kind, priority, key, record, payload, status, attempt, "
                f"submitted_ns, updated_ns) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (7, "default", "default", 2, "kept", '{"v":1}', b"{}", "ready", 0, 1, 1))
    with pytest.raises(Exception):   # not there yet
        backend.sql(f"SELECT count(*) FROM {backend.table('cronoq_checkpoints')}")
    store = backend.store()
    await store.prune()   # connects and migrates
    assert backend.sql(f"SELECT version_num FROM {backend.table('cronoq_schema_version')}") == [(HEAD,)]
    assert backend.sql(f"SELECT id, key FROM {tasks}") == [(7, "kept")]
    assert backend.sql(f"SELECT count(*) FROM {backend.table('cronoq_checkpoints')}") == [(0,)]
    assert backend.sql(f"SELECT count(*) FROM {backend.table('cronoq_inbox')}") == [(0,)]
    await store.close()


async def test_concurrent_first_connections_migrate_once(backend):
    stores = [backend.store() for _ in range(4)]
    await asyncio.gather(*(s.prune() for s in stores))
    assert backend.sql(f"SELECT version_num FROM {backend.table('cronoq_schema_version')}") == [(HEAD,)]
    assert backend.sql(f"SELECT epoch, high_water FROM {backend.table('cronoq_meta')}") == [(0, 0)]


# ---------------------------------------------------------------- retention


async def test_the_store_retention_decides_which_finished_tasks_a_restart_still_knows(backend):
    a = scheduler(backend.store(), pool(Work()))
    await a.start()
    for key in ("old", "older"):
        await (await a.submit({"name": key}, key=key))
    await a.shutdown()
    hour = 3600 * 10**9
    now = int(dt.datetime.now(dt.timezone.utc).timestamp() * 10**9)
    tasks = backend.table("cronoq_tasks")
    backend.sql(f"UPDATE {tasks} SET finished_ns = ? WHERE key = ?", (now - 3 * hour // 2, "old"))
    backend.sql(f"UPDATE {tasks} SET finished_ns = ? WHERE key = ?", (now - 3 * hour, "older"))
    b = scheduler(backend.store(retention=2 * 3600.0), pool(Work(), capacity=0))
    await b.start()
    try:
        assert (await b.info("old")).status == "succeeded"   # 1.5 h ago: within 2 h
        assert (await b.submit({"name": "again"}, key="old")).duplicate
        assert not (await b.submit({"name": "again"}, key="older")).duplicate   # 3 h ago: forgotten
    finally:
        await b.shutdown()


async def test_finished_tasks_are_pruned_and_ids_never_repeat(backend):
    store = backend.store(keep_finished=0.2)
    work = Work()
    a = scheduler(store, pool(work))
    await a.start()
    finished = [await a.submit({"name": f"f{i}"}) for i in range(5)]
    for handle in finished:
        await handle
    live = await a.enqueue({"op": "block", "name": "live"})
    await asyncio.sleep(0.3)
    assert await store.prune() == 5
    remaining = backend.rows()
    assert [row[0] for row in remaining] == [live]
    top = max(h.id for h in finished)
    work.release.set()
    await a.shutdown()
    backend.sql(f"DELETE FROM {backend.table('cronoq_tasks')}")   # even with every row gone
    b = scheduler(backend.store(), pool(Work()))
    await b.start()
    try:
        assert await b.enqueue({"name": "new"}) > max(top, live)
    finally:
        await b.shutdown()
