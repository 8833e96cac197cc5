"""Checkpoints with a store (SQLite and PostgreSQL): committed before
``ctx.checkpoint`` returns, read back after a SIGKILL of the process and
after a failover, so the retry runs only the stage that failed; fenced;
deleted with their task."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import cronoq
from cronoq.store import InMemoryStore, MemoryDatabase
from storekit import backend, child_env  # noqa: F401  (backend is a fixture)

pytestmark = pytest.mark.asyncio

STAGES = ["chunk", "embed", "index"]


class Pipeline:
    """Three stages; each skipped when checkpointed; ``fail_in`` fails on attempt 1."""

    def __init__(self, fail_in: str | None = None) -> None:
        self.fail_in = fail_in
        self.ran: list[tuple[int, str]] = []
        self.resumed: list[str | None] = []

    async def __call__(self, ctx: cronoq.TaskContext, payload):
        self.resumed.append(ctx.resumed_from)
        for stage in STAGES:
            if stage in ctx.checkpoints:
                continue
            self.ran.append((ctx.attempt, stage))
            if stage == self.fail_in and ctx.attempt == 1:
                raise RuntimeError(f"{stage} failed")
            await ctx.checkpoint(stage, {"stage": stage, "attempt": ctx.attempt})
        return sorted(ctx.checkpoints)


def staged(work, backoff: float = 0.01) -> cronoq.Pool:
    return cronoq.Pool("default", work, min=1, max=1, initial=1, autoscale=False,
                       retry=cronoq.RetryPolicy(max_attempts=3, initial_backoff=backoff, jitter=False))


def stored(backend, task_id: int) -> list[tuple]:
    return backend.sql(f"SELECT stage, attempt FROM {backend.table('cronoq_checkpoints')} "
                       f"WHERE task_id = ? ORDER BY saved_ns", (task_id,))


async def test_a_retry_runs_only_the_failed_stage_and_each_checkpoint_is_stored_first(backend):
    rows_at_save: list[list[tuple]] = []
    ran: list[tuple[int, str]] = []

    async def pipeline(ctx, payload):
        for stage in STAGES:
            if stage in ctx.checkpoints:
                continue
            ran.append((ctx.attempt, stage))
            if stage == "index" and ctx.attempt == 1:
                raise RuntimeError("index failed")
            await ctx.checkpoint(stage, {"stage": stage})
            # the row is in the database when the call returns
            rows_at_save.append(await asyncio.to_thread(stored, backend, ctx.id))
        return sorted(ctx.checkpoints)

    sched = cronoq.Scheduler([staged(pipeline)], store=backend.store())
    await sched.start()
    try:
        handle = await sched.submit(None, stages=STAGES)
        assert await asyncio.wait_for(handle, 20) == STAGES
    finally:
        await sched.shutdown()
    assert ran == [(1, "chunk"), (1, "embed"), (1, "index"), (2, "index")]
    assert rows_at_save == [[("chunk", 1)], [("chunk", 1), ("embed", 1)],
                            [("chunk", 1), ("embed", 1), ("index", 2)]]


async def test_checkpoints_survive_a_sigkill_between_attempts(backend):
    """The process dies after attempt 1 failed in stage 3: the next process
    runs only stage 3, and sees where attempt 1 stopped."""
    if backend.kind == "sqlite":
        make = f"cronoq.SqliteStore({backend.path!r}, lease_ttl=1.0, lease_renew=0.2, lock_poll=0.05)"
    else:
        make = f"cronoq.PostgresStore({backend.server.url!r}, schema={backend.schema!r}, lock_poll=0.05)"
    script = textwrap.dedent(f"""
        import asyncio, cronoq
        async def run(ctx, payload):
            for stage in {STAGES!r}:
                if stage in ctx.checkpoints:
                    continue
                if stage == "index":
                    raise RuntimeError("index failed")
                await ctx.checkpoint(stage, {{"stage": stage, "pid": "child"}})
        async def main():
            retry = cronoq.RetryPolicy(max_attempts=3, initial_backoff=3600, jitter=False)
            sched = cronoq.Scheduler([cronoq.Pool("default", run, min=1, max=1, initial=1, autoscale=False,
                                                  retry=retry)], store={make})
            await sched.start()
            task_id = await sched.enqueue({{"doc": 42}}, key="doc-42", stages={STAGES!r})
            while (await sched.info(task_id)).status != "retrying":
                await asyncio.sleep(0.01)
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
    assert stored(backend, task_id) == [("chunk", 1), ("embed", 1)]
    work = Pipeline()
    sched = cronoq.Scheduler([staged(work)], store=backend.store())
    await asyncio.wait_for(sched.start(), 20)   # SQLite: the dead child's lease runs out first
    try:
        handle = await sched.handle("doc-42")
        assert await asyncio.wait_for(handle, 20) == STAGES
        info = await sched.info(task_id)
    finally:
        await sched.shutdown()
    assert work.ran == [(2, "index")] and work.resumed == ["embed"]
    assert info.stages == STAGES
    assert [(c.stage, c.attempt, c.data) for c in info.checkpoints] == [
        ("chunk", 1, {"stage": "chunk", "pid": "child"}), ("embed", 1, {"stage": "embed", "pid": "child"}),
        ("index", 2, {"stage": "index", "attempt": 2})]


async def test_a_process_killed_inside_the_last_stage_resumes_there(backend):
    """SIGKILL while attempt 1 runs stage 3: the interrupted attempt counts as
    used, and the next process runs only stage 3."""
    if backend.kind == "sqlite":
        make = f"cronoq.SqliteStore({backend.path!r}, lease_ttl=1.0, lease_renew=0.2, lock_poll=0.05)"
    else:
        make = f"cronoq.PostgresStore({backend.server.url!r}, schema={backend.schema!r}, lock_poll=0.05)"
    script = textwrap.dedent(f"""
        import asyncio, cronoq
        async def run(ctx, payload):
            for stage in {STAGES!r}:
                if stage in ctx.checkpoints:
                    continue
                if stage == "index":
                    print(ctx.id, flush=True)   # inside the last stage: kill me now
                    await asyncio.sleep(60)
                await ctx.checkpoint(stage, stage)
        async def main():
            sched = cronoq.Scheduler([cronoq.Pool("default", run, min=1, max=1, initial=1, autoscale=False)],
                                     store={make})
            await sched.start()
            await sched.enqueue(None, key="doc-7", stages={STAGES!r})
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
    work = Pipeline()
    sched = cronoq.Scheduler([staged(work)], store=backend.store())
    await asyncio.wait_for(sched.start(), 20)
    try:
        assert await asyncio.wait_for(await sched.handle(task_id), 20) == STAGES
    finally:
        await sched.shutdown()
    assert work.ran == [(2, "index")] and work.resumed == ["embed"]


async def test_checkpoints_survive_a_failover(backend):
    work_a = Pipeline(fail_in="index")
    a = cronoq.Scheduler([staged(work_a, backoff=3600)], store=backend.store(cluster=False))
    await a.start()
    task_id = await a.enqueue(None, key="doc", stages=STAGES)
    deadline = time.monotonic() + 20
    while (await a.info(task_id)).status != "retrying":
        assert time.monotonic() < deadline, "attempt 1 did not fail"
        await asyncio.sleep(0.01)
    a._leadership.lost("simulated crash")
    await backend.crash(a.store)
    work_b = Pipeline()
    b = cronoq.Scheduler([staged(work_b)], store=backend.store(cluster=False))
    await asyncio.wait_for(b.start(), 20)
    try:
        assert await asyncio.wait_for(await b.handle(task_id), 20) == STAGES
    finally:
        await b.shutdown()
    assert work_a.ran == [(1, "chunk"), (1, "embed"), (1, "index")]
    assert work_b.ran == [(2, "index")] and work_b.resumed == ["embed"]


async def test_a_deposed_leader_cannot_save_a_checkpoint(backend):
    store = backend.store()
    epoch = await store.acquire_leadership()
    try:
        with pytest.raises(cronoq.Fenced):
            await store.save_checkpoint(epoch + 1, 1, "chunk", b"{}", 1, 1)
        with pytest.raises(cronoq.Fenced):
            await store.delete_checkpoints(epoch + 1, 1)
    finally:
        await store.release_leadership()


async def test_a_checkpoint_of_a_task_the_store_does_not_hold_is_refused(backend):
    store = backend.store()
    epoch = await store.acquire_leadership()
    try:
        with pytest.raises(cronoq.StoreRejected, match="no task 12345"):
            await store.save_checkpoint(epoch, 12345, "chunk", b"{}", 1, 1)
        assert await store.load_checkpoints(12345) == []
    finally:
        await store.release_leadership()


async def test_checkpoints_are_deleted_with_their_task_when_it_is_pruned(backend):
    sched = cronoq.Scheduler([staged(Pipeline())], store=backend.store())
    await sched.start()
    try:
        handle = await sched.submit(None, stages=STAGES)
        await asyncio.wait_for(handle, 20)
        live = await sched.submit(None, stages=STAGES, start_in=3600)   # not run: no checkpoints
    finally:
        await sched.shutdown()
    assert [s for s, _ in stored(backend, handle.id)] == STAGES
    backend.sql(f"UPDATE {backend.table('cronoq_tasks')} SET finished_ns = 1 WHERE id = ?", (handle.id,))
    store = backend.store(keep_finished=60.0)
    assert await store.prune() == 1
    assert stored(backend, handle.id) == []
    assert backend.sql(f"SELECT count(*) FROM {backend.table('cronoq_tasks')} WHERE id = ?", (live.id,)) == [(1,)]
    await store.close()


async def test_load_and_delete_checkpoints_through_the_store(backend):
    sched = cronoq.Scheduler([staged(Pipeline())], store=backend.store())
    await sched.start()
    try:
        handle = await sched.submit(None, stages=STAGES)
        await asyncio.wait_for(handle, 20)
        rows = await sched.store.load_checkpoints(handle.id)
        assert [(r.task_id, r.stage, r.attempt) for r in rows] == [(handle.id, s, 1) for s in STAGES]
        assert await sched.store.load_checkpoints() == []   # only live tasks' at recovery
        assert await sched.store.delete_checkpoints(sched.epoch, handle.id) == 3
        assert await sched.store.load_checkpoints(handle.id) == []
    finally:
        await sched.shutdown()


async def test_the_in_memory_store_keeps_checkpoints_across_a_restart():
    database = MemoryDatabase()
    work = Pipeline(fail_in="index")
    a = cronoq.Scheduler([staged(work, backoff=3600)], store=InMemoryStore(database))
    await a.start()
    task_id = await a.enqueue(None, stages=STAGES)
    while (await a.info(task_id)).status != "retrying":
        await asyncio.sleep(0.01)
    await a.shutdown()
    assert sorted(database.checkpoints[task_id]) == ["chunk", "embed"]
    again = Pipeline()
    async with cronoq.Scheduler([staged(again)], store=InMemoryStore(database)) as b:
        assert await asyncio.wait_for(await b.handle(task_id), 20) == STAGES
    assert again.ran == [(2, "index")]


async def test_an_unavailable_store_fails_the_checkpoint_and_the_stage_runs_again():
    database = MemoryDatabase()
    work = Pipeline()
    calls = 0
    inner = work.__call__

    async def flaky_store(ctx, payload):
        nonlocal calls
        calls += 1
        if calls == 1:
            database.available = False   # the first save cannot be written
            try:
                with pytest.raises(cronoq.StoreUnavailable):
                    await ctx.checkpoint("chunk", 1)
                assert ctx.checkpoints == {}   # not kept in memory either
            finally:
                database.available = True
            raise RuntimeError("retry")
        return await inner(ctx, payload)

    async with cronoq.Scheduler([staged(flaky_store)], store=InMemoryStore(database)) as sched:
        assert await asyncio.wait_for(await sched.submit(None, stages=STAGES), 20) == STAGES
    assert work.ran == [(2, "chunk"), (2, "embed"), (2, "index")]


async def test_a_leader_that_was_replaced_unnoticed_cannot_checkpoint_and_stops():
    """A paused leader (its leadership taken without it noticing) is fenced at
    its next checkpoint: nothing is written, and it stops serving."""
    database = MemoryDatabase()
    outcome: list[BaseException] = []
    go = asyncio.Event()

    async def pipeline(ctx, payload):
        await go.wait()
        try:
            await ctx.checkpoint("chunk", 1)
        except BaseException as exc:
            outcome.append(exc)
            raise

    sched = cronoq.Scheduler([staged(pipeline)], store=InMemoryStore(database))
    await sched.start()
    try:
        await sched.enqueue(None, stages=STAGES)
        while not sched.snapshot_from_thread().running:
            await asyncio.sleep(0.005)
        database.leader = None     # another process took over; this one did not hear of it
        database.epoch += 1
        go.set()
        deadline = time.monotonic() + 10
        while not outcome or sched.running:
            assert time.monotonic() < deadline, "the fenced checkpoint did not stop the scheduler"
            await asyncio.sleep(0.005)
    finally:
        await sched.shutdown()
    assert isinstance(outcome[0], cronoq.Fenced)
    assert database.checkpoints == {}
    assert "fenced" in (sched.lost_reason or "")


FOLLOWER = """
import asyncio, json, sys, cronoq
STAGES, LOG, STORE, MODE = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
def log(**fields):
    with open(LOG, "a") as out:
        out.write(json.dumps(fields) + "\\n")
def stages_to_run(ctx):
    log(attempt=ctx.attempt, resumed_from=ctx.resumed_from, completed=ctx.completed_stages)
    for stage in STAGES:
        if stage in ctx.checkpoints:
            continue
        log(attempt=ctx.attempt, stage=stage)
        if stage == STAGES[-1] and ctx.attempt == 1:
            raise RuntimeError(stage + " failed")
        yield stage
async def in_the_loop(ctx, payload):
    for stage in stages_to_run(ctx):
        await ctx.checkpoint(stage, {"stage": stage, "attempt": ctx.attempt})
    return sorted(ctx.checkpoints)
def in_a_thread(ctx, payload):
    for stage in stages_to_run(ctx):
        ctx.checkpoint_from_thread(stage, {"stage": stage, "attempt": ctx.attempt}, timeout=30)
    return sorted(ctx.checkpoints)
run = in_the_loop if MODE == "async" else in_a_thread
async def main():
    retry = cronoq.RetryPolicy(max_attempts=3, initial_backoff=0.01, jitter=False)
    sched = cronoq.Scheduler([cronoq.Pool("default", run, min=1, max=1, initial=1, autoscale=False,
                                          retry=retry)], store=eval(STORE))
    await sched.start()
    print("started", flush=True)
    await asyncio.to_thread(sys.stdin.read)   # until the test closes our stdin
    await sched.shutdown()
asyncio.run(main())
"""


@pytest.mark.parametrize("mode", ["async", "thread"])
async def test_attempts_on_a_follower_process_checkpoint_and_resume(backend, tmp_path, mode):
    """The leader places every attempt on the other process (a follower):
    its checkpoints reach the store through the leader, and its retry sees
    them and runs only the stage that failed."""
    import json

    if backend.kind == "sqlite":
        make = f"cronoq.SqliteStore({backend.path!r}, lease_ttl=1.0, lease_renew=0.2, lock_poll=0.05)"
    else:
        make = f"cronoq.PostgresStore({backend.server.url!r}, schema={backend.schema!r}, lock_poll=0.05)"
    ran_on_the_leader: list[int] = []

    async def never_here(ctx, payload):
        ran_on_the_leader.append(ctx.attempt)
        raise RuntimeError("this attempt was meant for the follower")

    leader = cronoq.Scheduler([staged(never_here)], store=backend.store())
    await leader.start()
    log = tmp_path / "follower.log"
    child = None
    try:
        deadline = time.monotonic() + 20
        while not leader.leading:
            assert time.monotonic() < deadline, "the test's scheduler did not lead"
            await asyncio.sleep(0.01)
        cluster = leader._leadership.cluster
        place = cluster.leader.place

        def elsewhere(attempt, runner):   # the leader's own process takes no attempt
            cluster.member.serving = False
            try:
                return place(attempt, runner)
            finally:
                cluster.member.serving = True

        cluster.leader.place = elsewhere
        child = subprocess.Popen([sys.executable, "-c", FOLLOWER, json.dumps(STAGES), str(log), make, mode],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 env=child_env(), text=True)
        line = await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), 60)
        assert line.strip() == "started", child.stderr.read()
        while not any(m.id != cluster.identity and m.state == "serving" for m in cluster.leader.members.values()):
            assert time.monotonic() < deadline + 40, "the follower did not join"
            await asyncio.sleep(0.01)
        handle = await leader.submit(None, key="doc", stages=STAGES)
        assert await asyncio.wait_for(handle, 30) == STAGES
        info = await leader.info(handle.id)
        follower = next(m.id for m in cluster.leader.members.values() if m.id != cluster.identity)
        # a save for an attempt that is over (as a late or stale member would send) is refused
        with pytest.raises(cronoq.CheckpointError, match="attempt 2 of task .* is over"):
            await leader._leadership.serve("checkpoint", {"lease": 1, "member": follower, "task": handle.id,
                                                          "attempt": 2, "stage": "index"}, [b"null"])
    finally:
        if child is not None:
            child.stdin.close()
            try:
                child.wait(20)
            finally:
                if child.poll() is None:
                    child.kill()
                    child.wait()
                child.stdout.close()
                child.stderr.close()
        await leader.shutdown()
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert ran_on_the_leader == []
    assert lines == [
        {"attempt": 1, "resumed_from": None, "completed": []},
        {"attempt": 1, "stage": "chunk"}, {"attempt": 1, "stage": "embed"}, {"attempt": 1, "stage": "index"},
        {"attempt": 2, "resumed_from": "embed", "completed": ["chunk", "embed"]},
        {"attempt": 2, "stage": "index"}]
    assert stored(backend, handle.id) == [("chunk", 1), ("embed", 1), ("index", 2)]
    assert [(c.stage, c.attempt, c.data) for c in info.checkpoints] == [
        ("chunk", 1, {"stage": "chunk", "attempt": 1}), ("embed", 1, {"stage": "embed", "attempt": 1}),
        ("index", 2, {"stage": "index", "attempt": 2})]


async def test_a_newer_attempt_claimed_with_the_cancel_of_the_older_keeps_its_checkpoints():
    """One cycle of a member can bring the cancel of attempt 1 and the offer
    of attempt 2 of the same task: attempt 2 still reads what its offer carried."""
    import base64
    import json
    import types

    from cronoq.runtime.cluster import Cluster, MemberCheckpoints
    from cronoq.store.cluster import Claimed, Incoming
    from cronoq.store.codec import JsonCodec

    class Idle:
        def start(self, attempt):
            pass

        def abort(self, lease):
            return True

    codec = JsonCodec()
    cluster = Cluster(types.SimpleNamespace(identity="member"), codec, pools=["default"], request_timeout=1.0,
                      poll=0.1)
    cluster.member.runners["default"] = Idle()
    book = types.SimpleNamespace(of=lambda task_id, stages=None: [], loop=None, loop_thread=None)
    reach = MemberCheckpoints(cluster, book)
    carried = [["chunk", base64.b64encode(codec.encode({"n": 1})).decode(), 1, 1.0]]
    older = Claimed(7, 1, 42, "default", 1, json.dumps({"stages": STAGES}), codec.encode(None))
    cluster.member.start_claimed(Incoming(claimed=[older]))
    newer = Claimed(8, 1, 42, "default", 2, json.dumps({"stages": STAGES, "checkpoints": carried}),
                    codec.encode(None))
    cluster.member.start_claimed(Incoming(claimed=[newer], cancelled=[7]))
    assert [(c.stage, c.data, c.attempt) for c in reach.of(42, tuple(STAGES))] == [("chunk", {"n": 1}, 1)]
    cluster.member.release(8)
    assert reach.of(42) == []
