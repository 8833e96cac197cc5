"""Worker health, with real processes: a worker that stops answering (SIGSTOP:
a GC pause, a frozen VM, a closed laptop lid) while it holds leases.

Its leases expire; it is marked suspect and gets no lease until it speaks
again, so the retries run on the healthy worker of the pool instead of
burning every attempt on the silent one. Waits are for log lines, printed
lines and answers, with generous timeouts; every process is stopped by pid.
"""

from __future__ import annotations

import asyncio
import re
import signal
import time

import httpx
import pytest

from cronoq._proto import cronoq_pb2 as pb
from cronoq.client import Client
from serverkit import LISTEN, WorkerProcess, stubs

pytestmark = pytest.mark.asyncio

CONFIG = LISTEN + """
[[pools]]
name = "default"
lease_ttl_s = 1
retry = { max_attempts = 2, initial_backoff_s = 0.05, jitter = false }
"""


async def workers_by_name(admin) -> dict[str, pb.WorkerInfo]:
    return {w.name: w for w in (await admin.ListWorkers(pb.ListWorkersRequest())).workers}


async def until(probe, what: str, timeout: float = 60.0):
    """Ask ``probe()`` again until it answers something true (a wait for a state, not a timing)."""
    deadline = time.monotonic() + timeout
    while True:
        answer = await probe()
        if answer:
            return answer
        if time.monotonic() > deadline:
            raise AssertionError(f"never: {what}")
        await asyncio.sleep(0.05)


def series(text: str, name: str, pool: str = "default") -> float:
    match = re.search(rf'^{name}{{pool="{pool}"}} (\S+)$', text, re.M)
    assert match is not None, f"no {name} for pool {pool} in:\n{text}"
    return float(match.group(1))


async def test_a_stopped_worker_is_suspect_its_retries_run_on_the_healthy_one_and_it_recovers(servers):
    server = servers(CONFIG)
    channel, _, admin = stubs(server.target)
    # The frozen worker has more slots than the healthy one: placement by free
    # slots alone would send the retries straight back to it.
    frozen = WorkerProcess(server.target, slots=4, name="frozen")
    healthy = None
    try:
        async with Client(server.target) as client, httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{server.http_port}") as http:
            await until(lambda: _named(admin, "frozen"), "the frozen worker registered")
            ids = [(await client.submit(f"job-{n}")).id for n in range(4)]
            for task_id in ids:
                frozen.wait_for(f"started {task_id} 1")
            frozen.signal(signal.SIGSTOP)        # connected, holding 4 leases, silent
            healthy = WorkerProcess(server.target, slots=2, sleep=0, name="healthy")
            # Every retry ran on the healthy worker and succeeded (attempt 2 of 2).
            for task_id in ids:
                result = await client.wait(task_id, timeout=60)
                assert result.status == "succeeded", (result.status, result.message)
                assert result.json() == {"by": "healthy", "attempt": 2}
            server.wait_for("worker 1 'frozen' of pool default is suspect", timeout=60)

            listed = await workers_by_name(admin)
            assert listed["frozen"].health == pb.WORKER_HEALTH_SUSPECT
            assert listed["frozen"].lease_expiries == 4 and listed["frozen"].busy == 0
            assert listed["healthy"].health == pb.WORKER_HEALTH_HEALTHY
            assert listed["healthy"].lease_expiries == 0
            pool = next(p for p in (await admin.Snapshot(pb.SnapshotRequest())).pools if p.name == "default")
            assert pool.capacity == 2               # the suspect worker's slots left the capacity
            shown = (await http.get("/v1/workers")).json()["workers"]
            assert {w["name"]: w["health"] for w in shown} == {"frozen": "suspect", "healthy": "healthy"}
            text = (await http.get("/metrics")).text
            assert series(text, "cronoq_worker_lease_expiries_total") == 4
            assert series(text, "cronoq_worker_suspicions_total") == 1
            assert series(text, "cronoq_pool_suspect_workers") == 1

            # It wakes up: it hears why its attempts were given up, speaks, and is healthy again.
            frozen.signal(signal.SIGCONT)
            for task_id in ids:
                frozen.wait_for(f"aborted {task_id} 1 lease expired")
            server.wait_for("worker 1 'frozen' of pool default shows life again", timeout=60)
            listed = await workers_by_name(admin)
            assert listed["frozen"].health == pb.WORKER_HEALTH_HEALTHY
            text = (await http.get("/metrics")).text
            assert series(text, "cronoq_pool_suspect_workers") == 0
            assert series(text, "cronoq_worker_suspicions_total") == 1
            pool = next(p for p in (await admin.Snapshot(pb.SnapshotRequest())).pools if p.name == "default")
            assert pool.capacity == 6
            # And it gets leases again (it has the most free slots).
            again = (await client.submit("after")).id
            frozen.wait_for(f"started {again} 1")
    finally:
        frozen.stop()                               # SIGCONT, then SIGKILL, by pid
        if healthy is not None:
            healthy.stop()
        await channel.close()


async def _named(admin, name: str) -> bool:
    return name in await workers_by_name(admin)
