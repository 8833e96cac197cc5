"""The PostgreSQL store's commit of a single submit beside running work (the
new task's row, its dispatch, the end and output of the task before it), in
pipeline mode: BEGIN with the fence, then the writes with COMMIT, two round
trips to the server instead of one per statement. Counted as the times the
driver waits for the server, on the writer connection."""

from __future__ import annotations


import pytest

from cronoq.store.base import Fenced, StoreRejected
from storekit import postgres_backend, submit_beside_a_completion  # noqa: F401  (a fixture)


def record_waits(store) -> list[list[str]]:
    """Per commit, what the writer connection waited for (psycopg runs each
    exchange with the server as a generator through ``Connection.wait``)."""
    commits: list[list[str]] = []
    original = store._commit_sync

    def commit_sync(epoch, batch):
        raw = store._writer().dbapi_connection
        wait = raw.wait
        names: list[str] = []

        def recorded(gen, *args, **kwargs):
            names.append(getattr(gen, "__name__", type(gen).__name__))
            return wait(gen, *args, **kwargs)

        raw.wait = recorded
        try:
            original(epoch, batch)
        finally:
            del raw.wait
            commits.append(names)

    store._commit_sync = commit_sync
    return commits


@pytest.mark.asyncio
async def test_a_submit_beside_a_completion_commits_in_two_round_trips(postgres_backend):
    store = postgres_backend.store(cluster=False)
    epoch = await store.acquire_leadership()
    try:
        await store.commit(epoch, submit_beside_a_completion(epoch, 0))   # connects, prepares
        commits = record_waits(store)
        for n in range(1, 4):
            await store.commit(epoch, submit_beside_a_completion(epoch, n))
    finally:
        await store.close()
    assert len(commits) == 3
    for names in commits:
        # One pipeline carries the whole commit, entered before its first
        # statement (BEGIN and the fence); answers are read from the server
        # twice: the fence's, then those of the writes and COMMIT together.
        # (Without it: BEGIN, the fence, each write and COMMIT, five.)
        assert names[0] == "_enter_gen" and names.count("_enter_gen") == 1, names
        assert [n for n in names if n in ("_fetch_gen", "_commit_gen")] == ["_fetch_gen", "_commit_gen"], names
    rows = postgres_backend.sql(f"SELECT status, output IS NOT NULL FROM {postgres_backend.table('cronoq_tasks')} "
                                "ORDER BY id")
    assert rows == [("succeeded", True)] * 3 + [("running", False)]


@pytest.mark.asyncio
async def test_a_pipelined_commit_of_a_replaced_leader_is_fenced_and_writes_nothing(postgres_backend):
    store = postgres_backend.store(cluster=False)
    epoch = await store.acquire_leadership()
    try:
        await store.commit(epoch, submit_beside_a_completion(epoch, 0))
        postgres_backend.sql(f"UPDATE {postgres_backend.table('cronoq_meta')} SET epoch = epoch + 1")   # a newer leader
        with pytest.raises(Fenced):
            await store.commit(epoch, submit_beside_a_completion(epoch, 1))
    finally:
        await store.close()
    assert postgres_backend.sql(f"SELECT COUNT(*), MIN(status) FROM {postgres_backend.table('cronoq_tasks')}") \
        == [(1, "running")]


@pytest.mark.asyncio
async def test_a_pipelined_commit_the_database_refuses_writes_nothing_and_the_next_one_commits(postgres_backend):
    store = postgres_backend.store(cluster=False)
    epoch = await store.acquire_leadership()
    try:
        await store.commit(epoch, submit_beside_a_completion(epoch, 0))
        refused = submit_beside_a_completion(epoch, 1)
        refused.tasks[0].priority = 2**40   # out of range for the integer column
        with pytest.raises(StoreRejected):
            await store.commit(epoch, refused)
        await store.commit(epoch, submit_beside_a_completion(epoch, 1))
    finally:
        await store.close()
    assert postgres_backend.sql(f"SELECT status FROM {postgres_backend.table('cronoq_tasks')} ORDER BY id") \
        == [("succeeded",), ("running",)]
