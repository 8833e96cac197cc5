"""Priorities and aging: scores, tie-breaks, overtaking, FIFO and retries."""

import pytest

from cronoq.core import PoolConfig, Priority, PriorityConfig, RetryPolicy, TaskSpec
from enginekit import S, dispatches, drain, make_core, free_slot_at, occupy


def one_slot(**config):
    return make_core(PoolConfig("default", max=1, initial=1, autoscale=False), **config)


def entry_score(core, task_id, now):
    q = core.pools["default"].queues
    return q.score(core.tasks[task_id], now)


@pytest.mark.parametrize("priority, base", [("critical", 10000), ("high", 1000),
                                            ("normal", 100), ("low", 10)])
def test_base_score_per_class_and_aging_two_points_per_second(priority, base):
    core = one_slot()
    occupy(core)
    tid = core.submit(0, TaskSpec("t", priority=priority))[0]
    core.check_invariants()
    assert entry_score(core, tid, 0) == pytest.approx(base)
    assert entry_score(core, tid, 10 * S) == pytest.approx(base + 20)
    assert entry_score(core, tid, 250 * S) == pytest.approx(base + 500)
    # capped at 800 points (reached after 400 s)
    assert entry_score(core, tid, 400 * S) == pytest.approx(base + 800)
    assert entry_score(core, tid, 10_000 * S) == pytest.approx(base + 800)


def test_aging_is_measured_from_submission():
    core = one_slot()
    occupy(core)
    early = core.submit(0, TaskSpec("early", priority="low"))[0]
    late = core.submit(30 * S, TaskSpec("late", priority="low"))[0]
    core.check_invariants()
    assert entry_score(core, early, 40 * S) == pytest.approx(10 + 80)
    assert entry_score(core, late, 40 * S) == pytest.approx(10 + 20)


def test_custom_priority_config_is_used():
    cfg = PriorityConfig(base=(4000, 300, 20, 1), aging_rate=(0, 1, 3, 5), age_cap=(0, 10, 30, 50))
    core = one_slot(priority=cfg)
    occupy(core)
    low = core.submit(0, TaskSpec("l", priority="low"))[0]
    normal = core.submit(0, TaskSpec("n"))[0]
    core.check_invariants()
    assert entry_score(core, low, 4 * S) == pytest.approx(1 + 20)
    assert entry_score(core, low, 100 * S) == pytest.approx(1 + 50)
    assert entry_score(core, normal, 5 * S) == pytest.approx(20 + 15)


def test_classes_dispatch_in_order_of_score_and_fifo_within_a_class():
    core = one_slot()
    lease = occupy(core)
    ids = {}
    for name, prio in [("n1", "normal"), ("l1", "low"), ("h1", "high"), ("n2", "normal"),
                       ("c1", "critical"), ("h2", "high"), ("l2", "low"), ("n3", "normal")]:
        ids[core.submit(0, TaskSpec(name, priority=prio))[0]] = name
        core.check_invariants()
    order = []
    t = 0
    while True:
        t += S // 1000
        assert core.complete(t, lease)
        core.check_invariants()
        ds = dispatches(drain(core))
        if not ds:
            break
        [d] = ds
        order.append(ids[d.task_id])
        lease = d.lease
    assert order == ["c1", "h1", "h2", "n1", "n2", "n3", "l1", "l2"]


def test_fifo_within_a_class_over_many_tasks():
    core = one_slot()
    lease = occupy(core)
    ids = [core.submit(i, TaskSpec(i, priority="normal"))[0] for i in range(50)]
    core.check_invariants()
    seen = []
    t = 100
    for _ in ids:
        t += 1
        d = free_slot_at(core, t, lease)
        seen.append(d.task_id)
        lease = d.lease
    assert seen == ids


def test_equal_scores_tie_goes_to_the_more_important_class():
    # After exactly 45 s a low task scores 10 + 90 = 100, like fresh normal work:
    # the tie goes to the class (normal).
    core = one_slot()
    lease = occupy(core)
    low = core.submit(0, TaskSpec("low", priority="low"))[0]
    normal = core.submit(45 * S, TaskSpec("normal"))[0]
    core.check_invariants()
    assert entry_score(core, low, 45 * S) == entry_score(core, normal, 45 * S) == 100
    d = free_slot_at(core, 45 * S, lease)
    assert d.task_id == normal


def test_equal_scores_in_one_class_tie_by_submission_order():
    # Zero aging: every normal task scores exactly 100; the oldest goes first.
    cfg = PriorityConfig(aging_rate=(0, 0, 0, 0))
    core = one_slot(priority=cfg)
    lease = occupy(core)
    a = core.submit(0, TaskSpec("a"))[0]
    b = core.submit(5 * S, TaskSpec("b"))[0]
    core.check_invariants()
    assert entry_score(core, a, 9 * S) == entry_score(core, b, 9 * S)
    d = free_slot_at(core, 9 * S, lease)
    assert d.task_id == a


def test_equal_scores_across_classes_with_custom_bases_tie_by_class():
    # A high task and a normal task with the same score: high wins, even though
    # the normal one was submitted first.
    cfg = PriorityConfig(base=(10000, 1000, 1000, 10), aging_rate=(0, 0, 0, 0))
    core = one_slot(priority=cfg)
    lease = occupy(core)
    normal = core.submit(0, TaskSpec("n"))[0]
    high = core.submit(S, TaskSpec("h", priority="high"))[0]
    core.check_invariants()
    assert entry_score(core, normal, 2 * S) == entry_score(core, high, 2 * S)
    assert free_slot_at(core, 2 * S, lease).task_id == high


def test_low_task_overtakes_fresh_normal_work_after_about_45_seconds():
    core = one_slot()
    lease = occupy(core)
    low = core.submit(0, TaskSpec("low", priority="low"))[0]
    # At 44 s the low task has 98 points: fresh normal work (100) still wins.
    n1 = core.submit(44 * S, TaskSpec("n1"))[0]
    d = free_slot_at(core, 44 * S, lease)
    assert d.task_id == n1
    # At 46 s it has 102 points and beats a fresh normal task.
    n2 = core.submit(46 * S, TaskSpec("n2"))[0]
    d = free_slot_at(core, 46 * S, d.lease)
    assert d.task_id == low
    d = free_slot_at(core, 47 * S, d.lease)
    assert d.task_id == n2


def test_fully_aged_low_task_never_beats_fresh_high_work():
    core = one_slot()
    lease = occupy(core)
    low = core.submit(0, TaskSpec("low", priority="low"))[0]
    t = 10_000 * S
    high = core.submit(t, TaskSpec("high", priority="high"))[0]
    core.check_invariants()
    assert entry_score(core, low, t) == pytest.approx(810)
    d = free_slot_at(core, t, lease)
    assert d.task_id == high
    assert free_slot_at(core, t + 1, d.lease).task_id == low


def test_fully_aged_normal_task_never_beats_fresh_high_work_nor_high_fresh_critical():
    core = one_slot()
    lease = occupy(core)
    normal = core.submit(0, TaskSpec("normal"))[0]
    high = core.submit(0, TaskSpec("high", priority=Priority.HIGH))[0]
    t = 5_000 * S
    crit = core.submit(t, TaskSpec("crit", priority=Priority.CRITICAL))[0]
    high2 = core.submit(t, TaskSpec("high2", priority=Priority.HIGH))[0]
    order = []
    for i in range(4):
        d = free_slot_at(core, t + i, lease)
        order.append(d.task_id)
        lease = d.lease
    assert order == [crit, high, high2, normal]


def test_retried_task_keeps_its_place_before_later_tasks_of_its_class():
    retry = RetryPolicy(max_attempts=3, initial_backoff=1.0, jitter=False)
    core = one_slot()
    a = core.submit(0, TaskSpec("a", retry=retry))[0]
    [da] = dispatches(drain(core))
    b = core.submit(S // 10, TaskSpec("b"))[0]
    c = core.submit(S // 10, TaskSpec("c"))[0]
    core.check_invariants()
    # a fails: b takes the slot, a waits 1 s for its retry
    assert core.complete(S // 2, da.lease, "retryable")
    core.check_invariants()
    [db] = dispatches(drain(core))
    assert db.task_id == b
    core.advance(2 * S)
    core.check_invariants()
    assert core.status(a) == "ready"
    # when b ends, the retried a goes before c, which was submitted after it
    d = free_slot_at(core, 3 * S, db.lease)
    assert (d.task_id, d.attempt) == (a, 2)
    d = free_slot_at(core, 4 * S, d.lease)
    assert d.task_id == c


def test_retried_task_keeps_its_age():
    retry = RetryPolicy(max_attempts=2, initial_backoff=1.0, jitter=False)
    core = one_slot()
    lease = occupy(core)
    low = core.submit(0, TaskSpec("low", priority="low", retry=retry))[0]
    # low waits 60 s then runs (nothing else queued) and fails
    d = free_slot_at(core, 60 * S, lease)
    assert d.task_id == low
    assert core.complete(61 * S, d.lease, "retryable")
    core.check_invariants()
    lease = occupy(core, 61 * S)  # keep the slot busy while low's backoff elapses
    core.advance(62 * S)
    core.check_invariants()
    # its age still counts from submission: 10 + 2 * 70 = 150 > fresh normal (100)
    assert entry_score(core, low, 70 * S) == pytest.approx(150)
    normal = core.submit(70 * S, TaskSpec("n"))[0]
    d = free_slot_at(core, 70 * S, lease)
    assert (d.task_id, d.attempt) == (low, 2)
    assert free_slot_at(core, 71 * S, d.lease).task_id == normal


def test_task_released_by_dependencies_keeps_its_place():
    core = one_slot()
    parent = core.submit(0, TaskSpec("p", key="p"))[0]
    [dp] = dispatches(drain(core))
    child = core.submit(1, TaskSpec("child", after="p"))[0]
    later = core.submit(2, TaskSpec("later"))[0]
    core.check_invariants()
    assert core.status(child) == "blocked"
    d = free_slot_at(core, S, dp.lease)
    assert d.task_id == child
    assert free_slot_at(core, 2 * S, d.lease).task_id == later
    assert parent < child < later
