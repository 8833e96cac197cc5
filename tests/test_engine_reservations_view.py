"""Core.reservations: the fixed starts not started yet, as the timeline draws
them; and Scheduler.reservations, on the leader and through it."""

import json

import pytest

import cronoq
from cronoq.core import PoolConfig, TaskSpec
from cronoq.core.snapshot import Reservation
from cronoq.runtime import operations as ops
from cronoq.runtime.durability import EncodedPayloads
from cronoq.store.codec import JsonCodec
from enginekit import S, dispatches, drain, make_core, run_to
from storekit import Work, pool, sqlite_backend  # noqa: F401  (sqlite_backend is a fixture)


def two_pools():
    return make_core(PoolConfig("default", min=1, max=2, initial=2, autoscale=False),
                     PoolConfig("other", min=1, max=2, initial=2, autoscale=False))


def test_lists_the_fixed_starts_within_the_horizon_by_start_time():
    core = two_pools()
    late = core.submit(0, TaskSpec("late", start_at=200, tolerance=5))[0]
    soon = core.submit(0, TaskSpec("soon", kind="report", key="k-soon", start_at=50, tolerance=2,
                                   deadline_at=80))[0]
    far = core.submit(0, TaskSpec("far", start_at=5000))[0]
    elsewhere = core.submit(0, TaskSpec("x", pool="other", start_at=60))[0]
    core.submit(0, TaskSpec("plain"))
    drain(core)
    got = core.reservations(0, 300 * S)
    assert [r.id for r in got] == [soon, elsewhere, late]
    first = got[0]
    assert (first.pool, first.key, first.kind, first.start, first.tolerance, first.held, first.deadline) == (
        "default", "k-soon", "report", 50 * S, 2 * S, False, 80 * S)
    assert far not in [r.id for r in core.reservations(0, 1000 * S)]
    assert [r.id for r in core.reservations(0, 6000 * S)][-1] == far
    assert [r.id for r in core.reservations(0, 300 * S, ["other"])] == [elsewhere]
    assert core.reservations(0, 300 * S, ["missing"]) == []


def test_a_held_slot_is_flagged_and_listed_past_the_horizon_and_a_started_task_leaves():
    core = make_core(PoolConfig("default", min=1, max=2, initial=2, autoscale=False))
    tid = core.submit(0, TaskSpec("job", start_at=1000, tolerance=5))[0]
    run_to(core, 995 * S)
    [r] = core.reservations(995 * S, 1 * S)        # its start is past the horizon, but it holds a slot
    assert (r.id, r.held) == (tid, True)
    out = run_to(core, 1000 * S)
    assert [a.task_id for _, a in out if type(a).__name__ == "Dispatch"] == [tid]
    assert core.reservations(1000 * S, 300 * S) == []


def test_a_cancelled_fixed_start_leaves_the_list():
    core = make_core(PoolConfig("default", min=1, max=2, initial=2, autoscale=False))
    tid = core.submit(0, TaskSpec("job", start_at=100))[0]
    assert dispatches(drain(core)) == []
    assert [r.id for r in core.reservations(0, 300 * S)] == [tid]
    core.cancel(0, tid)
    drain(core)
    assert core.reservations(0, 300 * S) == []


# ---------------------------------------------------------------- through the runtime


def test_the_leader_operation_carries_its_arguments_and_answer_as_json():
    payloads = EncodedPayloads(JsonCodec())
    body, data = ops.RESERVATIONS.encode_args(ops.ReservationsArgs(60 * S, ["a", "b"]), payloads)
    body = json.loads(json.dumps({**body, "v": 1}))
    decoded = ops.find("reservations", body).decode_args(body, data, payloads)
    assert decoded == ops.ReservationsArgs(60 * S, ["a", "b"])
    answer = [Reservation(3, "a", "k", "nightly", 5 * S, S, True, None)]
    back = ops.RESERVATIONS.decode_answer(json.loads(json.dumps(ops.RESERVATIONS.encode_answer(answer))))
    assert back == answer


@pytest.mark.asyncio
async def test_a_follower_lists_the_reservations_through_the_leader(sqlite_backend):
    leader = cronoq.Scheduler([pool(Work(), capacity=1)], store=sqlite_backend.store())
    await leader.start()
    follower = cronoq.Scheduler([pool(Work(), capacity=1)], store=sqlite_backend.store())
    await follower.start()
    try:
        assert leader.leading and not follower.leading
        handle = await follower.submit({"name": "later"}, key="later", start_in=120)
        [seen] = await follower.reservations(300)
        assert (seen.id, seen.key, seen.held) == (handle.id, "later", False)
        assert await leader.reservations(300) == [seen]
        assert await follower.reservations(60) == []
    finally:
        await follower.shutdown()
        await leader.shutdown()
