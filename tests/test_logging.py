"""Logging: one ``cronoq`` hierarchy, structured fields, nothing per task at INFO."""

import asyncio
import logging
import pathlib
import re

import pytest

import cronoq
from cronoq.store import InMemoryStore, MemoryDatabase

ROOT = pathlib.Path(cronoq.__file__).parent


async def run(ctx, payload):
    if payload == "bad":
        raise cronoq.Permanent("bad input")
    if payload == "flaky":
        raise cronoq.Retryable("upstream 503")
    return payload


def pool(retry=None):
    retry = retry or cronoq.RetryPolicy(max_attempts=2, initial_backoff=1.0, jitter=False)
    return cronoq.Pool("jobs", run, min=4, max=4, initial=4, autoscale=False, retry=retry)


def cronoq_records(caplog, level=logging.DEBUG):
    return [r for r in caplog.records if r.name.startswith("cronoq") and r.levelno >= level]


@pytest.mark.asyncio
async def test_dead_letters_are_warnings_and_nothing_is_logged_per_task_at_info(caplog):
    clock = cronoq.VirtualClock()
    with caplog.at_level(logging.DEBUG, logger="cronoq"):
        async with cronoq.Scheduler([pool()], clock=clock) as sched:
            tasks = [cronoq.Task(i) for i in range(200)]
            tasks += [cronoq.Task("bad") for _ in range(5)]
            tasks += [cronoq.Task("flaky", key=f"flaky-{i}", kind="fetch") for i in range(3)]
            handles = await sched.submit_batch(tasks)
            await clock.advance(1.0)
            await clock.advance(1.0)
            statuses = [h.status for h in handles]
    assert statuses.count("succeeded") == 200 and statuses.count("failed") == 5
    assert statuses.count("dead_lettered") == 3
    # 200 successes, 5 failures and 3 retries leave no trace at INFO; each of
    # the 3 dead letters is one WARNING.
    loud = cronoq_records(caplog, logging.INFO)
    assert [(r.levelname, r.name, r.action) for r in loud] == \
        [("WARNING", "cronoq.scheduler", "dead_letter")] * 3
    by_key = {r.key: r for r in loud}
    assert set(by_key) == {"flaky-0", "flaky-1", "flaky-2"}
    for key, record in by_key.items():
        handle = handles[tasks.index(next(t for t in tasks if t.key == key))]
        assert (record.task_id, record.pool, record.attempt) == (handle.id, "jobs", 2)
        assert record.error == "gave up after 2 attempts: upstream 503"
        assert str(handle.id) in record.getMessage() and "upstream 503" in record.getMessage()


@pytest.mark.asyncio
async def test_store_events_leadership_outage_and_dead_letters_with_a_store(caplog):
    database = MemoryDatabase()
    retry = cronoq.RetryPolicy.none()
    with caplog.at_level(logging.DEBUG, logger="cronoq"):
        sched = cronoq.Scheduler([pool(retry=retry)], store=InMemoryStore(database))
        await sched.start()
        try:
            assert await (await sched.submit("ok")) == "ok"
            dead = await sched.submit("flaky", key="dead")
            with pytest.raises(cronoq.TaskFailed):
                await dead
            database.available = False
            with pytest.raises(cronoq.SchedulerError):
                await sched.submit("during the outage")
            database.available = True
            for _ in range(100):
                if any(getattr(r, "action", None) == "store_recovered" for r in caplog.records):
                    break
                await asyncio.sleep(0.02)
            sched.store.depose("the test took the lease away")
        finally:
            await sched.shutdown()
    records = cronoq_records(caplog)
    actions = [(r.levelname, r.name, getattr(r, "action", None)) for r in records]
    assert actions[0] == ("INFO", "cronoq.scheduler", "leader")
    assert records[0].epoch == 1
    assert ("INFO", "cronoq.scheduler", "recovered") in actions
    assert ("WARNING", "cronoq.scheduler", "dead_letter") in actions
    assert ("ERROR", "cronoq.store", "store_outage") in actions
    assert ("WARNING", "cronoq.store", "store_recovered") in actions
    assert ("ERROR", "cronoq.scheduler", "leader_lost") in actions
    (dead_letter,) = [r for r in records if getattr(r, "action", None) == "dead_letter"]
    assert (dead_letter.task_id, dead_letter.key, dead_letter.pool) == (dead.id, "dead", "jobs")
    # Every record above DEBUG says what happened in ``action``.
    assert all(hasattr(r, "action") for r in records if r.levelno > logging.DEBUG)


def test_every_logger_belongs_to_the_cronoq_hierarchy():
    names = {}
    for path in sorted(ROOT.rglob("*.py")) + sorted((ROOT.parent / "cronoq_compat").rglob("*.py")):
        text = path.read_text()
        for match in re.finditer(r"getLogger\(([^)]*)\)", text):
            names.setdefault(match.group(1), []).append(path.name)
        assert "logging.basicConfig" not in text, \
            f"{path.name} configures logging: leave that to the application"
        assert not re.search(r"^\s*(log|logger|logging)\.info\(\"(?:task|attempt)", text, re.M), path.name
    assert names, "no logger found"
    for argument, files in names.items():
        assert re.fullmatch(r"\"cronoq(\.[a-z_]+)+\"", argument), (argument, files)
    assert {'"cronoq.scheduler"', '"cronoq.store"', '"cronoq.telemetry"'} <= set(names)
