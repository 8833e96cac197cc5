"""A task's info (Get: times and attempts) is complete on every store: with
a store, a submit's answer and the first attempt's events are released by
the same commit, in no set order, and the first attempt was lost when the
events came first."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from cronoq.client import Client, Retryable, Worker
from serverkit import LISTEN

pytestmark = pytest.mark.asyncio

POOLS = """
[[pools]]
name = "default"
retry = { max_attempts = 3, initial_backoff_s = 0.01, jitter = false }
"""


def config(store: str, tmp_path, pg_server) -> tuple[str, dict[str, str]]:
    if store == "memory":
        return LISTEN + POOLS, {}
    if store == "sqlite":
        return LISTEN + f'[store]\nkind = "sqlite"\npath = "{tmp_path / "info.db"}"\n' + POOLS, {}
    schema = f"info_{uuid.uuid4().hex[:8]}"
    return (LISTEN + f'[store]\nkind = "postgres"\nurl_env = "CRONOQ_TEST_DATABASE_URL"\nschema = "{schema}"\n' + POOLS,
            {"CRONOQ_TEST_DATABASE_URL": pg_server.url})


async def handler(lease):
    if lease.text().startswith("flaky") and lease.attempt == 1:
        raise Retryable("the first attempt fails")
    return lease.text()


def complete(info, attempts: list[tuple[int, str]]) -> None:
    assert info.started is not None and info.finished >= info.started >= info.created, info
    assert [(a.attempt, a.status) for a in info.attempts] == attempts, info.attempts
    for attempt in info.attempts:
        assert attempt.ended >= attempt.started > 0


@pytest.mark.parametrize("store", ["memory", "sqlite", "postgres"])
async def test_every_attempt_is_in_the_task_info_on_every_store(servers, tmp_path, request, store):
    pg_server = request.getfixturevalue("pg_server") if store == "postgres" else None
    text, env = config(store, tmp_path, pg_server)
    server = servers(text, env=env)
    worker = Worker(server.target, "default", handler, slots=8, initial_backoff=0.05, max_backoff=0.5)
    running = asyncio.create_task(worker.run())
    try:
        async with Client(server.target) as client:
            singles = []
            for i in range(20):   # one at a time: each dispatched right after its commit
                sub = await client.submit(f"single-{i}", wait=True, wait_timeout=30)
                singles.append(sub.id)
            batch = [s.id for s in await client.submit_batch([{"payload": f"batch-{i}"} for i in range(20)])]
            flaky = (await client.submit("flaky", wait=True, wait_timeout=30)).id
            for task_id in batch:
                await client.wait(task_id, timeout=30)
            for task_id in singles + batch:
                complete(await client.get(task_id), [(1, "succeeded")])
            complete(await client.get(flaky), [(1, "retrying"), (2, "succeeded")])
    finally:
        worker.stop()
        await asyncio.wait_for(running, 30)


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
async def test_a_finished_task_only_the_store_knows_still_says_how_many_attempts_it_had(
        servers, tmp_path, request, store):
    import cronoq

    pg_server = request.getfixturevalue("pg_server") if store == "postgres" else None
    text, env = config(store, tmp_path, pg_server)
    # The engine keeps a finished task 0.1 s: a restart (seconds) leaves it to the store alone.
    text = text.replace("[store]\n", "[store]\nretention_s = 0.1\n")
    assert "retention_s = 0.1" in text
    first = servers(text, env=env, name="first")
    async with Client(first.target) as client:
        own = (await client.submit("own policy", pool="default", retry=cronoq.RetryPolicy(max_attempts=5))).id
        pooled = (await client.submit("the pool's policy", pool="default")).id
        for task_id in (own, pooled):
            assert await client.cancel(task_id)
    assert first.stop() == 0
    again = servers(text, env=env, name="again")   # a new engine and no memory: only the store knows them
    async with Client(again.target) as client:
        assert [(await client.get(t)).max_attempts for t in (own, pooled)] == [5, 3]
        listed = {info.id: info.max_attempts for info in (await client.list(statuses=["cancelled"])).tasks}
        assert (listed[own], listed[pooled]) == (5, 3)
