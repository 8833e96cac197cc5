"""A clean handover of a store's lead between two schedulers of one process
(two store objects on one database are two members of its cluster): the
calls a follower makes while the leader stops are carried out once, by the
leader that admits them, and never refused for the stop.

Every test runs against a SQLite file and a PostgreSQL schema."""

from __future__ import annotations

import asyncio

import pytest

import cronoq
from storekit import Work, backend, eventually, pool  # noqa: F401  (backend is a fixture)

pytestmark = pytest.mark.asyncio


def count_cycles(sched: cronoq.Scheduler) -> list[int]:
    """Counts the store cycles of ``sched``'s cluster that its leader ran
    (``[n]``, updated from the cluster's worker thread)."""
    transport = sched._leadership.cluster.transport
    cycle = transport.cycle
    counted = [0]

    def counting(out, want):
        try:
            return cycle(out, want)
        finally:
            if want.lead:
                counted[0] += 1

    transport.cycle = counting
    return counted


def inbox(backend) -> list[tuple]:
    return backend.sql(f"SELECT seq, answer FROM {backend.table('cronoq_inbox')} ORDER BY seq")


async def started_follower(backend, **store_options) -> tuple[cronoq.Scheduler, Work]:
    work = Work()
    follower = cronoq.Scheduler([pool(work, capacity=1)], store=backend.store(**store_options))
    await follower.start()
    assert not follower.leading
    return follower, work


async def test_a_call_that_reaches_a_stopping_leader_waits_for_the_next_leader(backend):
    """The leader drains a running attempt (shutdown's grace) when a
    follower's submit reaches its inbox: it leaves the call to the next
    leader instead of answering "the scheduler is stopping"."""
    work = Work()
    leader = cronoq.Scheduler([pool(work, capacity=1)], store=backend.store())
    await leader.start()
    assert leader.leading
    running = await leader.submit({"op": "block", "name": "running"})
    await asyncio.wait_for(work.running.wait(), 10)   # on the leader: the only member yet
    follower, follower_work = await started_follower(backend, request_timeout=60)
    cycles = count_cycles(leader)
    stopping = asyncio.create_task(leader.shutdown(grace=60))
    late = None
    try:
        await eventually(lambda: leader._life.state == "stopping", what="the leader to stop")
        late = asyncio.create_task(follower.submit({"name": "late"}, key="late"))
        await eventually(lambda: inbox(backend), what="the call in the inbox")
        seen = cycles[0]
        # The stopping leader had every chance to read the call and write an
        # answer: three more store cycles (two of them begun after the row was there).
        await eventually(lambda: late.done() or any(answer for _, answer in inbox(backend))
                         or cycles[0] >= seen + 3, timeout=20, what="the leader's cycles")
        assert not any(answer for _, answer in inbox(backend)), inbox(backend)
        work.release.set()   # the drain ends: the leader leaves, the follower takes the lead
        await asyncio.wait_for(stopping, 30)
        handle = await asyncio.wait_for(late, 30)
        assert follower.leading and not handle.duplicate
        assert await asyncio.wait_for(handle, 10) == {"done": "late"}
        assert follower_work.started == [("late", 1)]
        assert await asyncio.wait_for(running, 10) == {"done": "running"}
        assert [row[1:3] for row in backend.rows()] == [(None, "succeeded"), ("late", "succeeded")]
    finally:
        work.release.set()
        await stopping
        if late is not None:
            late.cancel()
            await asyncio.gather(late, return_exceptions=True)
        await follower.shutdown()


async def test_a_call_the_stopping_leader_admitted_is_answered_by_it_and_not_admitted_again(backend):
    """The reverse race: the leader admitted and committed a follower's
    keyless submit, and stops while the answer is still queued behind a
    store cycle in progress. It writes the answer before it gives up the
    lead, so the next leader does not carry the call out a second time."""
    leader = cronoq.Scheduler([pool(Work(), capacity=0)], store=backend.store())
    await leader.start()
    assert leader.leading
    cluster = leader._leadership.cluster
    follower, _ = await started_follower(backend, request_timeout=60)
    admitted: list[int] = []
    answer_held = asyncio.Event()
    let_answer = asyncio.Event()
    serve = cluster.leader.serve

    async def serve_then_hold(kind, body, payloads):
        value = await serve(kind, body, payloads)   # admitted and committed
        if kind == "submit":
            admitted.append(value[0][0])
            answer_held.set()
            await let_answer.wait()
        return value

    cluster.leader.serve = serve_then_hold
    cycle_now = cluster._cycle_now
    cycle_loop_held = asyncio.Event()

    async def hold_the_cycle_loop():
        # The cluster's own loop is stuck in a slow store cycle from now on;
        # shutdown's own cycles are not held.
        if answer_held.is_set() and asyncio.current_task() is cluster._task:
            cycle_loop_held.set()
            await asyncio.Event().wait()
        return await cycle_now()

    cluster._cycle_now = hold_the_cycle_loop
    submitted = asyncio.create_task(follower.submit({"name": "once"}))
    stopping = None
    try:
        await asyncio.wait_for(answer_held.wait(), 20)
        cluster.wake()
        await asyncio.wait_for(cycle_loop_held.wait(), 20)
        stopping = asyncio.create_task(leader.shutdown())
        await eventually(lambda: leader._life.state != "running", what="the leader to stop")
        let_answer.set()
        await asyncio.wait_for(stopping, 30)
        handle = await asyncio.wait_for(submitted, 30)
        assert handle.id == admitted[0] and not handle.duplicate
        assert [row[0] for row in backend.rows()] == admitted
    finally:
        let_answer.set()
        if stopping is not None:
            await stopping
        await leader.shutdown()
        await follower.shutdown()


async def test_an_attempt_on_a_follower_checkpoints_through_the_leader_during_its_grace(backend):
    """The stopping leader still saves the checkpoints of the attempts it
    drains: they are part of its grace, not new work."""
    go = asyncio.Event()
    started = asyncio.Event()

    async def on_the_follower(ctx, payload):
        started.set()
        await go.wait()
        await ctx.checkpoint("only", {"saved": True})
        return "done"

    async def never_here(ctx, payload):
        raise AssertionError("this attempt was meant for the follower")

    leader = cronoq.Scheduler([pool(never_here, capacity=1)], store=backend.store())
    await leader.start()
    assert leader.leading
    follower = cronoq.Scheduler([pool(on_the_follower, capacity=1)], store=backend.store(request_timeout=60))
    await follower.start()
    cluster = leader._leadership.cluster
    place = cluster.leader.place

    def elsewhere(attempt, runner):   # the leader's own process takes no attempt
        cluster.member.serving = False
        try:
            return place(attempt, runner)
        finally:
            cluster.member.serving = True

    cluster.leader.place = elsewhere
    stopping = None
    try:
        await eventually(lambda: any(m.id != cluster.identity and m.state == "serving"
                                     for m in cluster.leader.members.values()), timeout=20, what="the follower")
        handle = await leader.submit(None, stages=["only"])
        await asyncio.wait_for(started.wait(), 20)
        stopping = asyncio.create_task(leader.shutdown(grace=60))
        await eventually(lambda: leader._life.state == "stopping", what="the leader to stop")
        go.set()
        # "done" comes after ctx.checkpoint returned: the save was made, not refused or timed out.
        assert await asyncio.wait_for(handle, 30) == "done"
        await asyncio.wait_for(stopping, 30)
        assert [row[2:4] for row in backend.rows()] == [("succeeded", 1)]
    finally:
        go.set()
        if stopping is not None:
            await stopping
        await leader.shutdown()
        await follower.shutdown()
