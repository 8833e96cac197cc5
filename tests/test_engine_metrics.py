"""Snapshots: pool state, window metrics, quality signals and totals."""

import pytest

from cronoq.core import PoolConfig, ResourceConfig, RetryPolicy, TaskSpec
from cronoq.core.snapshot import TOTAL_FIELDS
from enginekit import S, dispatches, drain, make_core


def pool(n=1, **kw):
    return PoolConfig("default", max=max(n, kw.pop("max", n)), initial=n, autoscale=False, **kw)


def test_fresh_snapshot():
    core = make_core(pool(3))
    snap = core.snapshot(0)
    core.check_invariants()
    assert snap.totals == dict.fromkeys(TOTAL_FIELDS, 0)
    assert (snap.live_tasks, snap.running, snap.pending) == (0, 0, 0)
    p = snap.pool("default")
    assert (p.name, p.capacity, p.busy, p.pending) == ("default", 3, 0, 0)
    assert p.pending_by_class == {"critical": 0, "high": 0, "normal": 0, "low": 0}
    assert (p.dispatched, p.succeeded, p.failed) == (0, 0, 0)
    # rates are 1.0 when nothing was measured
    assert (p.priority_adherence, p.fixed_start_hit_rate, p.schedule_efficiency) == (1.0, 1.0, 1.0)
    assert (p.wait_p50, p.wait_p90, p.wait_p99) == (0.0, 0.0, 0.0)
    with pytest.raises(KeyError):
        snap.pool("nope")


def test_state_fields_follow_the_work():
    core = make_core(pool(2, max=8))
    core.submit(0, TaskSpec("a"))
    core.submit(0, TaskSpec("b", priority="high"))
    core.submit(0, TaskSpec("c", priority="low"))
    core.submit(0, TaskSpec("d", priority="low", key="d"))
    core.submit(0, TaskSpec("e", after="d"))                       # blocked: pending too
    core.check_invariants()
    snap = core.snapshot(S)
    p = snap.pool("default")
    assert (p.capacity, p.busy, p.pending) == (2, 2, 3)
    assert p.pending_by_class == {"critical": 0, "high": 0, "normal": 1, "low": 2}
    assert (snap.live_tasks, snap.running, snap.pending) == (5, 2, 3)
    assert p.dispatched == 2
    core.set_capacity(2 * S, "default", 5)
    core.check_invariants()
    p = core.snapshot(2 * S).pool("default")
    assert (p.capacity, p.busy, p.pending) == (5, 4, 1)
    assert p.pending_by_class["normal"] == 1


def test_window_counts_and_old_events_drop_out():
    core = make_core(pool(4))
    for i in range(3):
        core.submit(S, TaskSpec(i, retry=RetryPolicy.none()))
    ds = dispatches(drain(core))
    core.complete(2 * S, ds[0].lease)
    core.complete(2 * S, ds[1].lease)
    core.complete(2 * S, ds[2].lease, "permanent")
    core.check_invariants()
    p = core.snapshot(30 * S).pool("default")
    assert (p.dispatched, p.succeeded, p.failed) == (3, 2, 1)
    p = core.snapshot(55 * S).pool("default")
    assert (p.dispatched, p.succeeded, p.failed) == (3, 2, 1)
    snap = core.snapshot(65 * S)
    p = snap.pool("default")
    assert (p.dispatched, p.succeeded, p.failed) == (0, 0, 0)
    # totals are since start and never drop out
    t = snap.totals
    assert (t["submitted"], t["dispatched"], t["succeeded"], t["failed"]) == (3, 3, 2, 1)
    core.check_invariants()


def test_window_slides_bucket_by_bucket():
    core = make_core(pool(1))
    # one short task every 10 s from 0 to 110 s
    for k in range(12):
        core.submit(k * 10 * S, TaskSpec(k))
        [d] = dispatches(drain(core))
        core.complete(k * 10 * S + 1, d.lease)
        drain(core)
        core.check_invariants()
    # at 119 s the window holds the runs of the last 60 s (buckets of 5 s)
    p = core.snapshot(119 * S).pool("default")
    assert p.dispatched == 6
    assert p.succeeded == 6
    assert core.snapshot(119 * S).totals["dispatched"] == 12


def test_custom_window():
    core = make_core(pool(1), metrics_window=10.0, metrics_buckets=2)
    core.submit(0, TaskSpec("x"))
    [d] = dispatches(drain(core))
    core.complete(S, d.lease)
    assert core.snapshot(9 * S).pool("default").succeeded == 1
    assert core.snapshot(10 * S).pool("default").succeeded == 0
    core.check_invariants()


# ------------------------------------------------------------------ adherence

def test_priority_adherence_counts_inversions():
    core = make_core(pool(1))
    core.submit(0, TaskSpec("busy", priority="critical"))
    [d] = dispatches(drain(core))
    core.submit(0, TaskSpec("low", priority="low"))
    core.submit(50 * S, TaskSpec("normal"))
    # the aged low task (110) beats the fresh normal one (100): an inversion
    core.complete(50 * S, d.lease)
    core.check_invariants()
    [d] = dispatches(drain(core))
    assert d.payload == "low"
    core.complete(51 * S, d.lease)
    [d] = dispatches(drain(core))
    core.complete(52 * S, d.lease)
    core.check_invariants()
    p = core.snapshot(52 * S).pool("default")
    assert p.dispatched == 3
    assert p.priority_adherence == pytest.approx(1 - 1 / 3)
    # the inversion leaves with the window
    assert core.snapshot(200 * S).pool("default").priority_adherence == 1.0


def test_no_inversion_when_classes_are_served_in_order():
    core = make_core(pool(1))
    core.submit(0, TaskSpec("busy"))
    lease = dispatches(drain(core))[0].lease
    for prio in ("low", "normal", "high", "critical", "low", "normal"):
        core.submit(0, TaskSpec(prio, priority=prio))
    t = 0
    while True:
        t += S // 10
        core.complete(t, lease)
        core.check_invariants()
        ds = dispatches(drain(core))
        if not ds:
            break
        lease = ds[0].lease
    p = core.snapshot(t).pool("default")
    assert p.dispatched == 7
    assert p.priority_adherence == 1.0


def test_deadline_overtake_is_an_inversion():
    core = make_core(pool(1))
    core.submit(0, TaskSpec("busy", priority="critical"))
    [d] = dispatches(drain(core))
    core.submit(0, TaskSpec("urgent-low", priority="low", deadline_in=10, duration_hint=1))
    core.submit(0, TaskSpec("high", priority="high"))
    core.complete(9 * S, d.lease)
    core.check_invariants()
    [d] = dispatches(drain(core))
    assert d.payload == "urgent-low"
    p = core.snapshot(9 * S).pool("default")
    assert p.priority_adherence == pytest.approx(0.5)


def test_tasks_parked_on_resources_do_not_count_as_inversions():
    core = make_core(pool(2), resources=[ResourceConfig.semaphore("gpu", 1)])
    core.submit(0, TaskSpec("h1", priority="high", resources={"gpu": 1}))
    core.submit(0, TaskSpec("h2", priority="high", resources={"gpu": 1}))   # parks
    core.submit(0, TaskSpec("n"))
    core.check_invariants()
    ds = dispatches(drain(core))
    assert [d.payload for d in ds] == ["h1", "n"]
    p = core.snapshot(S).pool("default")
    assert p.dispatched == 2
    assert p.priority_adherence == 1.0


# ------------------------------------------------------------------ utilization

def test_utilization_one_of_two_slots_busy_for_the_whole_window():
    core = make_core(pool(2))
    core.submit(0, TaskSpec("long"))
    drain(core)
    core.check_invariants()
    assert core.snapshot(120 * S).pool("default").utilization == pytest.approx(0.5)
    assert core.snapshot(600 * S).pool("default").utilization == pytest.approx(0.5)


def test_utilization_is_integrated_over_time():
    core = make_core(pool(2))
    core.submit(0, TaskSpec("a"))
    core.submit(0, TaskSpec("b"))
    ds = dispatches(drain(core))
    core.complete(15 * S, ds[0].lease)     # both busy 0-15 s, one busy 15-30 s
    core.complete(30 * S, ds[1].lease)
    core.check_invariants()
    # (2 * 15 + 1 * 15) / (2 * 60) over [0, 60 s)
    assert core.snapshot(30 * S).pool("default").utilization == pytest.approx(45 / 60, rel=1e-6)
    assert core.snapshot(60 * S - 1).pool("default").utilization == pytest.approx(45 / 120, rel=1e-6)


def test_utilization_follows_capacity_changes():
    core = make_core(pool(1, max=4))
    core.submit(0, TaskSpec("a"))
    drain(core)
    core.set_capacity(30 * S, "default", 3)     # 1/1 for 30 s, then 1/3 for 30 s
    core.check_invariants()
    assert core.snapshot(60 * S - 1).pool("default").utilization == pytest.approx(60 / 120, rel=1e-6)


def test_utilization_with_changes_inside_one_bucket():
    core = make_core(pool(2))
    core.submit(S, TaskSpec("a"))
    [d] = dispatches(drain(core))
    core.complete(3 * S, d.lease)      # busy 2 s of 2 slots x 4 s
    core.check_invariants()
    assert core.snapshot(4 * S).pool("default").utilization == pytest.approx(2 / 8, rel=1e-6)
    core.submit(4 * S, TaskSpec("b"))
    core.submit(4 * S, TaskSpec("c"))
    core.check_invariants()
    assert core.snapshot(5 * S - 1).pool("default").utilization == pytest.approx(4 / 10, rel=1e-6)


def test_utilization_all_slots_busy():
    core = make_core(pool(2))
    core.submit(0, TaskSpec("a"))
    core.submit(0, TaskSpec("b"))
    core.submit(0, TaskSpec("c"))
    drain(core)
    assert core.snapshot(300 * S).pool("default").utilization == pytest.approx(1.0)


# ------------------------------------------------------------------ efficiency

def test_schedule_efficiency_counts_time_lost_to_failures():
    core = make_core(pool(2))
    core.submit(0, TaskSpec("ok"))
    core.submit(0, TaskSpec("bad", retry=RetryPolicy.none()))
    ok, bad = dispatches(drain(core))
    core.complete(10 * S, bad.lease, "retryable")
    core.complete(30 * S, ok.lease)
    core.check_invariants()
    assert core.snapshot(30 * S).pool("default").schedule_efficiency == pytest.approx(30 / 40)


def test_schedule_efficiency_counts_timeouts_and_cancellations():
    core = make_core(pool(3))
    core.submit(0, TaskSpec("ok"))
    core.submit(0, TaskSpec("slow", timeout=10, retry=RetryPolicy.none()))
    victim = core.submit(0, TaskSpec("victim"))[0]
    ok, _, _ = dispatches(drain(core))
    core.advance(10 * S)                 # slow times out after 10 s
    core.cancel(20 * S, victim)          # victim ran 20 s
    core.complete(20 * S, ok.lease)      # ok ran 20 s
    core.check_invariants()
    assert core.snapshot(20 * S).pool("default").schedule_efficiency == pytest.approx(20 / 50)


# ------------------------------------------------------------------ waits

def test_wait_percentiles():
    n = 100
    core = make_core(PoolConfig("default", max=n, initial=0, autoscale=False))
    t = 200 * S
    for w in range(n, 0, -1):               # waits of 100, 99, ..., 1 s
        core.submit(t - w * S, TaskSpec(w))
    core.check_invariants()
    core.set_capacity(t, "default", n)
    core.check_invariants()
    assert len(dispatches(drain(core))) == n
    p = core.snapshot(t).pool("default")
    assert p.wait_p50 == pytest.approx(50, rel=0.1)
    assert p.wait_p90 == pytest.approx(90, rel=0.1)
    assert p.wait_p99 == pytest.approx(99, rel=0.1)


def test_wait_percentiles_by_class():
    # Critical tasks wait 10 s and low ones 40 s: each class has its own percentiles, the pool's cover both.
    core = make_core(PoolConfig("default", max=8, initial=0, autoscale=False))
    t = 100 * S
    for i in range(4):
        core.submit(t - 40 * S, TaskSpec(("l", i), priority="low"))
    for i in range(4):
        core.submit(t - 10 * S, TaskSpec(("c", i), priority="critical"))
    core.set_capacity(t, "default", 8)
    core.check_invariants()
    assert len(dispatches(drain(core))) == 8
    p = core.snapshot(t).pool("default")
    critical, high, normal, low = p.wait_p50_s_by_class
    assert critical == pytest.approx(10, rel=0.1) and low == pytest.approx(40, rel=0.1)
    assert (high, normal) == (0.0, 0.0)
    assert p.wait_p99_s_by_class[0] == pytest.approx(10, rel=0.1)
    assert p.wait_p99_s_by_class[3] == pytest.approx(40, rel=0.1)
    assert p.wait_p99 == pytest.approx(40, rel=0.1)
    assert p.as_dict()["wait_p50_s_by_class"] == p.wait_p50_s_by_class
    # A fresh pool reports zeros for every class.
    assert make_core(pool(1)).snapshot(0).pool("default").wait_p99_s_by_class == [0.0] * 4


def test_wait_is_measured_from_readiness_not_submission():
    core = make_core(pool(2))
    core.submit(0, TaskSpec("p", key="p"))
    core.submit(0, TaskSpec("c", after="p"))
    [d] = dispatches(drain(core))
    core.complete(20 * S, d.lease)
    core.check_invariants()
    assert len(dispatches(drain(core))) == 1
    p = core.snapshot(20 * S).pool("default")
    assert p.wait_p99 == 0.0


def test_short_waits():
    core = make_core(pool(1))
    core.submit(0, TaskSpec("busy"))
    [d] = dispatches(drain(core))
    core.submit(0, TaskSpec("x"))
    core.complete(S // 20, d.lease)       # x waited 50 ms
    drain(core)
    p = core.snapshot(S).pool("default")
    assert p.wait_p99 == pytest.approx(0.05, rel=0.1)
    core.check_invariants()


# ------------------------------------------------------------------ totals

def test_totals_since_start():
    core = make_core(pool(2, lease_ttl=5), retention=10)
    policy = RetryPolicy(max_attempts=2, initial_backoff=1, jitter=False)
    a = core.submit(0, TaskSpec("a", retry=policy, timeout=2))[0]
    b = core.submit(0, TaskSpec("b", retry=policy))[0]
    c = core.submit(0, TaskSpec("c", retry=policy))[0]
    drain(core)
    core.advance(2 * S)            # a times out; c takes its slot
    core.check_invariants()
    t = core.snapshot(2 * S).totals
    assert (t["timeouts"], t["retries"], t["lease_expiries"], t["dispatched"]) == (1, 1, 0, 3)
    core.advance(5 * S)            # b's lease expires; a's retry takes the slot
    core.check_invariants()
    t = core.snapshot(5 * S).totals
    assert (t["timeouts"], t["retries"], t["lease_expiries"], t["dispatched"]) == (1, 2, 1, 4)
    core.heartbeat(5 * S, core.tasks[c].lease)
    core.advance(7 * S)            # a times out again: dead-lettered; b runs again
    core.check_invariants()
    t = core.snapshot(7 * S).totals
    assert (t["timeouts"], t["dead_lettered"], t["dispatched"]) == (2, 1, 5)
    assert core.status(a) == "dead_lettered"
    assert core.status(b) == "running"
    for lease in list(core.running):
        core.complete(8 * S, lease)
    core.check_invariants()
    assert core.complete(8 * S, 10 ** 9) is False
    t = core.snapshot(8 * S).totals
    expected = dict.fromkeys(TOTAL_FIELDS, 0) | {
        "submitted": 3, "dispatched": 5, "succeeded": 2, "dead_lettered": 1, "retries": 2,
        "timeouts": 2, "lease_expiries": 1, "stale_completions": 1}
    assert t == expected
    # totals outlive both the metrics window and the retention of the tasks
    core.advance(10_000 * S)
    snap = core.snapshot(10_000 * S)
    assert snap.totals == expected
    assert snap.pool("default").dispatched == 0
    core.check_invariants()


def test_the_snapshot_says_how_long_its_window_is():
    assert make_core().snapshot(0).window == 60.0
    assert make_core(metrics_window=30.0).snapshot(0).window == 30.0
