"""cronoq-server records its workload ([trace]): the attempts remote workers
ran are timed from the transitions, and the trace replays with the live
capacity the workers gave the pool."""

from __future__ import annotations

import asyncio

import pytest

import cronoq
from cronoq.client import Client, Worker
from cronoq.whatif import Report, Trace, replay, variants
from serverkit import LISTEN

pytestmark = pytest.mark.asyncio


async def test_the_server_records_a_trace_that_replays_with_the_workers_capacity(servers, tmp_path):
    config = LISTEN + f"""
[trace]
path = "{tmp_path / 'trace-{epoch}.jsonl'}"
flush_interval_s = 0.05
sample_interval_s = 0.1

[[pools]]
name = "default"
retry = {{ max_attempts = 3, initial_backoff_s = 0.05, jitter = false }}
"""
    server = servers(config)
    assert server.count("recording the workload to") == 1

    async def handle(lease):
        what = lease.json()
        await asyncio.sleep(what["sleep"])
        if what.get("flaky") and lease.attempt == 1:
            raise cronoq.Retryable("try again")
        if what.get("broken"):
            raise cronoq.Permanent("no")
        return "ok"

    worker = Worker(server.target, "default", handle, slots=2, initial_backoff=0.05)
    running = asyncio.create_task(worker.run())
    async with Client(server.target) as client:
        plain = [await client.submit({"sleep": 0.2}, kind="plain", priority="high") for _ in range(3)]
        flaky = await client.submit({"sleep": 0.1, "flaky": True}, kind="flaky")
        broken = await client.submit({"sleep": 0.1, "broken": True}, kind="broken")
        ids = [s.id for s in (*plain, flaky, broken)]
        results = [await client.wait(i, timeout=30) for i in ids]
    assert [r.status for r in results] == ["succeeded"] * 4 + ["failed"]
    worker.stop()
    await asyncio.wait_for(running, 30)
    assert server.stop() == 0                          # the recorder closes with the scheduler

    trace = Trace.load(tmp_path / "trace-0.jsonl")     # no store: epoch 0
    assert trace.meta["timed_attempts"] is True and trace.meta["dropped"] == 0
    by_id = {t.id: t for t in trace.tasks}
    assert sorted(by_id) == sorted(ids)
    outcomes = {i: [a.outcome for a in by_id[i].attempts or []] for i in ids}
    assert outcomes == {**{s.id: ["success"] for s in plain}, flaky.id: ["retryable", "success"],
                        broken.id: ["permanent"]}
    for i in ids:   # an attempt cannot end before its handler returned
        sleep = 0.2 if by_id[i].spec.kind == "plain" else 0.1
        assert all(a.seconds >= sleep for a in by_id[i].attempts)
    assert by_id[plain[0].id].priority == "high"
    assert trace.policy["pools"]["default"]["initial"] == 0     # the server's pools start empty...
    (variant,) = variants(trace)
    assert variant.policy["pools"]["default"]["initial"] == 2   # ...the workers' two slots ran them
    report = Report(trace, [replay(trace, variant)])
    assert report.variants[0].endings["succeeded"] == 4 and report.variants[0].endings["failed"] == 1
    assert any("'default' does not autoscale" in note for note in report.notes())
