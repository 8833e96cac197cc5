"""Core.reservations: the fixed starts not started yet, as the timeline draws them."""

from cronoq.core import PoolConfig, TaskSpec
from enginekit import S, dispatches, drain, make_core, run_to


def two_pools():
    return make_core(PoolConfig("default", min=1, max=2, initial=2, autoscale=False),
                     PoolConfig("other", min=1, max=2, initial=2, autoscale=False))


def test_lists_the_fixed_starts_within_the_horizon_by_start_time():
    core = two_pools()
    late = core.submit(0, TaskSpec("late", start_at=200, tolerance=5))[0]
    soon = core.submit(0, TaskSpec("soon", kind="report", key="k-soon", start_at=50, tolerance=2, deadline_at=80))[0]
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
