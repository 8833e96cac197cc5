"""Deadlines and urgency: estimates, latest start time, the curve and ordering."""

import pytest

from cronoq.core import PoolConfig, TaskSpec, UrgencyConfig
from enginekit import S, dispatches, drain, make_core, free_slot_at, occupy


def one_slot(default_duration=1.0, **config):
    pool = PoolConfig("default", max=1, initial=1, autoscale=False, default_duration=default_duration)
    return make_core(pool, **config)


def entry(core, task_id):
    return core.tasks[task_id]


def urgency(core, task_id, now):
    return core.pools["default"].queues.urgency(core.tasks[task_id], now)


def score(core, task_id, now):
    return core.pools["default"].queues.score(core.tasks[task_id], now)


def run_kind(core, now, kind, duration):
    """Run one task of ``kind`` for ``duration`` ns on a free slot."""
    core.submit(now, TaskSpec("learn", kind=kind, priority="critical"))
    core.check_invariants()
    [d] = dispatches(drain(core))
    assert core.complete(now + duration, d.lease)
    core.check_invariants()
    drain(core)
    return now + duration


# ------------------------------------------------------------------ estimates

def test_latest_start_time_uses_the_duration_hint():
    core = one_slot()
    occupy(core)
    tid = core.submit(10 * S, TaskSpec("t", deadline_in=100, duration_hint=7))[0]
    core.check_invariants()
    e = entry(core, tid)
    assert e.deadline == 110 * S
    assert e.est == 7 * S
    assert e.lst == 103 * S


def test_deadline_at_absolute_time():
    core = one_slot()
    occupy(core)
    tid = core.submit(10 * S, TaskSpec("t", deadline_at=500, duration_hint=2.5))[0]
    e = entry(core, tid)
    assert (e.deadline, e.est, e.lst) == (500 * S, 2_500_000_000, 497_500_000_000)


def test_estimate_falls_back_to_the_pool_default_duration():
    core = one_slot(default_duration=3.0)
    occupy(core)
    tid = core.submit(0, TaskSpec("t", deadline_in=60))[0]
    e = entry(core, tid)
    assert e.est == 3 * S
    assert e.lst == 57 * S


def test_estimate_default_duration_is_one_second():
    core = make_core()
    core.submit(0, TaskSpec("busy"))
    tid = core.submit(0, TaskSpec("t", deadline_in=60, priority="low"))[0]
    e = core.tasks[tid]
    assert e.est == S


def test_estimate_uses_the_learned_median_of_the_kind_then_of_the_pool():
    core = one_slot(default_duration=1.0)
    t = 0
    for _ in range(5):
        t = run_kind(core, t, "slow", 20 * S)
    for _ in range(3):
        t = run_kind(core, t, "fast", 2 * S)
    lease = occupy(core, t)
    slow = core.submit(t, TaskSpec("s", kind="slow", deadline_in=100))[0]
    fast = core.submit(t, TaskSpec("f", kind="fast", deadline_in=100))[0]
    other = core.submit(t, TaskSpec("o", kind="other", deadline_in=100))[0]
    hinted = core.submit(t, TaskSpec("h", kind="slow", deadline_in=100, duration_hint=4))[0]
    core.check_invariants()
    # log-linear histogram: within ~10 %
    assert entry(core, slow).est == pytest.approx(20 * S, rel=0.1)
    assert entry(core, fast).est == pytest.approx(2 * S, rel=0.1)
    # unknown kind: the pool's median (5 runs of 20 s, 3 of 2 s -> 20 s)
    assert entry(core, other).est == pytest.approx(20 * S, rel=0.1)
    assert entry(core, other).est != S
    # the hint wins over anything learned
    assert entry(core, hinted).est == 4 * S
    for tid in (slow, fast, other, hinted):
        assert entry(core, tid).lst == entry(core, tid).deadline - entry(core, tid).est
    # the learned estimates order the deadline queue: LST = D - d
    d = free_slot_at(core, t + S, lease)
    assert d.task_id == slow


def test_learned_kind_median_only_counts_the_same_pool():
    a = PoolConfig("a", max=1, initial=1, autoscale=False, default_duration=1.0)
    b = PoolConfig("b", max=1, initial=1, autoscale=False, default_duration=9.0)
    core = make_core(a, b)
    core.submit(0, TaskSpec("x", pool="a", kind="k"))
    [d] = dispatches(drain(core))
    core.complete(30 * S, d.lease)
    drain(core)
    core.submit(30 * S, TaskSpec("busy", pool="b"))
    drain(core)
    tb = core.submit(30 * S, TaskSpec("y", pool="b", kind="k", deadline_in=100))[0]
    core.check_invariants()
    assert core.pools["a"].runs.kind_median("k") is not None
    assert core.tasks[tb].est == 9 * S


# ------------------------------------------------------------------ the curve

def test_urgency_curve_with_a_long_estimate():
    # d = 10 s, so H = 10 s; LST = 110 - 10 = 100 s
    core = one_slot()
    occupy(core)
    tid = core.submit(10 * S, TaskSpec("t", deadline_at=110, duration_hint=10))[0]
    assert entry(core, tid).lst == 100 * S
    assert urgency(core, tid, 10 * S) == 0
    assert urgency(core, tid, 90 * S) == 0            # slack == H
    assert urgency(core, tid, 90 * S + 1) > 0          # just inside the horizon
    assert urgency(core, tid, 95 * S) == pytest.approx(2500)
    assert urgency(core, tid, 98 * S) == pytest.approx(4000)
    assert urgency(core, tid, 100 * S) == pytest.approx(5000)  # at the LST
    assert urgency(core, tid, 101 * S) == pytest.approx(5100)  # +100/s overdue
    assert urgency(core, tid, 110 * S) == pytest.approx(6000)
    assert urgency(core, tid, 130 * S) == pytest.approx(8000)  # +3000 cap
    assert urgency(core, tid, 1000 * S) == pytest.approx(8000)


def test_urgency_horizon_is_at_least_five_seconds():
    # d = 1 s < 5 s, so H = 5 s; LST = 50 - 1 = 49 s
    core = one_slot()
    occupy(core)
    tid = core.submit(0, TaskSpec("t", deadline_in=50, duration_hint=1))[0]
    assert urgency(core, tid, 44 * S) == 0
    assert urgency(core, tid, 46 * S) == pytest.approx(2000)
    assert urgency(core, tid, 49 * S) == pytest.approx(5000)


def test_urgency_curve_is_monotonic():
    core = one_slot()
    occupy(core)
    tid = core.submit(0, TaskSpec("t", deadline_in=30, duration_hint=8))[0]
    previous = -1.0
    for t in range(0, 120 * S, S // 4):
        u = urgency(core, tid, t)
        assert u >= previous
        assert 0 <= u <= 8000
        previous = u
    assert previous == 8000


def test_urgency_adds_to_base_and_aging():
    core = one_slot()
    occupy(core)
    tid = core.submit(0, TaskSpec("t", priority="low", deadline_in=21, duration_hint=1))[0]
    # at 20 s: LST reached -> 10 + 40 aging + 5000 urgency
    assert score(core, tid, 20 * S) == pytest.approx(5050)


def test_custom_urgency_config():
    cfg = UrgencyConfig(peak=1000, window=10, overdue_rate=10, overdue_cap=50)
    core = one_slot(urgency=cfg)
    occupy(core)
    tid = core.submit(0, TaskSpec("t", deadline_in=100, duration_hint=2))[0]   # LST 98, H 10
    assert urgency(core, tid, 88 * S) == 0
    assert urgency(core, tid, 93 * S) == pytest.approx(500)
    assert urgency(core, tid, 98 * S) == pytest.approx(1000)
    assert urgency(core, tid, 100 * S) == pytest.approx(1020)
    assert urgency(core, tid, 200 * S) == pytest.approx(1050)


# ------------------------------------------------------------------ ordering

def test_earliest_latest_start_first_within_a_class():
    core = one_slot()
    lease = occupy(core)
    far = core.submit(0, TaskSpec("far", deadline_in=1000, duration_hint=1))[0]
    near = core.submit(S, TaskSpec("near", deadline_in=500, duration_hint=1))[0]
    nearest = core.submit(2 * S, TaskSpec("nearest", deadline_in=600, duration_hint=200))[0]
    core.check_invariants()
    # none is urgent yet; the deadline queue still orders them by LST:
    # nearest (402) < near (500) < far (999)
    order = []
    t = 3 * S
    for _ in range(3):
        d = free_slot_at(core, t, lease)
        order.append(d.task_id)
        lease = d.lease
        t += S
    assert order == [nearest, near, far]


def test_deadline_task_competes_with_the_fifo_lane_by_score():
    core = one_slot()
    lease = occupy(core)
    plain = core.submit(0, TaskSpec("plain"))[0]
    dl = core.submit(S, TaskSpec("dl", deadline_in=100, duration_hint=1))[0]
    # not urgent yet: the older plain task has the higher score
    d = free_slot_at(core, 2 * S, lease)
    assert d.task_id == plain
    later = core.submit(3 * S, TaskSpec("later"))[0]
    # near its LST (slack 2 s of 5 s): 100 + aging + 3000 beats any normal task
    d = free_slot_at(core, 98 * S, d.lease)
    assert d.task_id == dl
    assert free_slot_at(core, 99 * S, d.lease).task_id == later


def test_low_task_near_its_deadline_overtakes_fresh_high_work():
    core = one_slot()
    lease = occupy(core)
    low = core.submit(0, TaskSpec("low", priority="low", deadline_in=30, duration_hint=5))[0]
    t = 24 * S  # slack 1 s of H 5 s: urgency 4000
    high = core.submit(t, TaskSpec("high", priority="high"))[0]
    assert score(core, low, t) > score(core, high, t)
    d = free_slot_at(core, t, lease)
    assert d.task_id == low
    assert free_slot_at(core, t + 1, d.lease).task_id == high


def test_low_task_far_from_its_deadline_does_not_overtake_high_work():
    core = one_slot()
    lease = occupy(core)
    low = core.submit(0, TaskSpec("low", priority="low", deadline_in=300, duration_hint=5))[0]
    t = 24 * S
    high = core.submit(t, TaskSpec("high", priority="high"))[0]
    d = free_slot_at(core, t, lease)
    assert d.task_id == high
    assert free_slot_at(core, t + 1, d.lease).task_id == low


def test_overdue_low_task_never_overtakes_fresh_critical_work():
    core = one_slot()
    lease = occupy(core)
    low = core.submit(0, TaskSpec("low", priority="low", deadline_in=10, duration_hint=1))[0]
    t = 2_000 * S  # far overdue and fully aged: 10 + 800 + 8000
    crit = core.submit(t, TaskSpec("crit", priority="critical"))[0]
    high = core.submit(t, TaskSpec("high", priority="high"))[0]
    assert score(core, low, t) == pytest.approx(8810)
    order = []
    for i in range(3):
        d = free_slot_at(core, t + i, lease)
        order.append(d.task_id)
        lease = d.lease
    assert order == [crit, low, high]


def test_more_overdue_task_ranks_higher():
    core = one_slot()
    lease = occupy(core)
    a = core.submit(0, TaskSpec("a", priority="low", deadline_in=20, duration_hint=1))[0]
    b = core.submit(0, TaskSpec("b", priority="normal", deadline_in=10, duration_hint=1))[0]
    # b (normal) is overdue by 11 s at 20 s, a (low) is at its LST
    t = 20 * S
    assert score(core, b, t) > score(core, a, t)
    d = free_slot_at(core, t, lease)
    assert d.task_id == b
    assert free_slot_at(core, t + 1, d.lease).task_id == a


def test_deadline_does_not_cancel_the_task():
    core = one_slot()
    lease = occupy(core)
    tid = core.submit(0, TaskSpec("t", deadline_in=1, duration_hint=1))[0]
    core.advance(3600 * S)
    core.check_invariants()
    assert core.status(tid) == "ready"
    d = free_slot_at(core, 3600 * S, lease)
    assert d.task_id == tid
    assert d.deadline == 1.0
