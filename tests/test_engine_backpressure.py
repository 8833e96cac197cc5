"""Backpressure: pending bounds, overflow policies and shedding."""

import pytest

from cronoq.core import (
    Dep, PoolConfig, QueueFull, RetryPolicy, TaskSpec, UnknownDependency, UnknownPool,
)
from cronoq.core import actions as act
from enginekit import S, dispatches, drain, events, make_core


def bounded(max_pending, overflow="reject", initial=0, **config):
    """A pool with no free slot (unless ``initial``), so submissions stay pending."""
    pool = PoolConfig("default", max=4, initial=initial, autoscale=False, max_pending=max_pending,
                      overflow=overflow)
    return make_core(pool, **config)


def fill(core, *priorities, now=0):
    ids = []
    for i, prio in enumerate(priorities):
        ids.append(core.submit(now, TaskSpec(f"{prio}{i}", priority=prio))[0])
        core.check_invariants()
    return ids


def pending(core, now=0):
    return core.snapshot(now).pool("default").pending


def unchanged(core):
    snap = core.snapshot(core.now)
    return snap.live_tasks, snap.totals, snap.pending


# ------------------------------------------------------------------ bounds

def test_library_default_overflow_is_wait_and_unbounded():
    core = make_core(PoolConfig("default", initial=0, autoscale=False))
    assert core.overflow_policy("default") == "wait"
    assert core.overflow_policy(None) == "wait"
    for i in range(500):
        core.submit(0, TaskSpec(i, priority=("low", "normal", "high", "critical")[i % 4]))
    core.check_invariants()
    assert pending(core) == 500


def test_overflow_policy_lookup():
    core = make_core(PoolConfig("a", overflow="reject"), PoolConfig("b", overflow="shed_oldest"))
    assert core.overflow_policy("a") == "reject"
    assert core.overflow_policy("b") == "shed_oldest"
    with pytest.raises(UnknownPool):
        core.overflow_policy("c")


@pytest.mark.parametrize("overflow", ["reject", "wait"])
def test_pool_bound_raises_queue_full(overflow):
    core = bounded(3, overflow)
    fill(core, "low", "normal", "high")
    before = unchanged(core)
    with pytest.raises(QueueFull, match="3"):
        core.submit(0, TaskSpec("x", priority="critical"))
    with pytest.raises(QueueFull):
        core.submit(0, TaskSpec("x", key="keyed", deadline_in=10))
    core.check_invariants()
    assert unchanged(core) == before
    assert core.snapshot(0).totals["shed"] == 0


def test_running_tasks_do_not_count_as_pending():
    core = bounded(2, initial=1)
    a, b, c = fill(core, "normal", "normal", "normal")   # a runs
    assert pending(core) == 2
    with pytest.raises(QueueFull):
        core.submit(0, TaskSpec("d"))
    [d] = dispatches(drain(core))
    core.complete(S, d.lease)        # b starts: room for one more
    core.check_invariants()
    assert pending(core, S) == 1
    assert (core.status(a), core.status(b), core.status(c)) == ("succeeded", "running", "ready")
    core.submit(S, TaskSpec("d"))
    core.check_invariants()


def test_blocked_and_retrying_tasks_count_as_pending():
    core = bounded(2, initial=1)
    a = core.submit(0, TaskSpec("a", key="a", retry=RetryPolicy(max_attempts=2, initial_backoff=10,
                                                                jitter=False)))[0]
    core.submit(0, TaskSpec("b", after="a"))               # blocked
    [d] = dispatches(drain(core))
    core.complete(S, d.lease, "retryable")                  # a waits for its retry
    core.check_invariants()
    assert core.status(a) == "retrying"
    assert pending(core, S) == 2
    with pytest.raises(QueueFull):
        core.submit(S, TaskSpec("c"))


def test_duplicate_submission_is_answered_even_when_full():
    core = bounded(1)
    tid = core.submit(0, TaskSpec("x", key="k"))[0]
    assert core.submit(0, TaskSpec("x", key="k")) == (tid, True)
    core.check_invariants()


def test_per_class_bounds():
    core = bounded({"low": 1, "high": 2})
    fill(core, "low", "high", "high", "normal", "normal", "normal", "critical")
    with pytest.raises(QueueFull, match="low"):
        core.submit(0, TaskSpec("l", priority="low"))
    with pytest.raises(QueueFull, match="high"):
        core.submit(0, TaskSpec("h", priority="high"))
    fill(core, "normal", "critical")
    core.check_invariants()
    assert core.snapshot(0).pool("default").pending_by_class == {
        "critical": 2, "high": 2, "normal": 4, "low": 1}


@pytest.mark.parametrize("overflow", ["shed_lowest", "shed_oldest"])
def test_class_bound_is_never_relieved_by_shedding(overflow):
    core = bounded({"normal": 1}, overflow)
    fill(core, "low", "low", "normal")
    before = unchanged(core)
    with pytest.raises(QueueFull):
        core.submit(0, TaskSpec("n"))
    core.check_invariants()
    assert unchanged(core) == before


def test_scheduler_wide_bound():
    a = PoolConfig("a", initial=0, autoscale=False)
    b = PoolConfig("b", initial=0, autoscale=False)
    core = make_core(a, b, max_pending_total=3)
    core.submit(0, TaskSpec(1, pool="a"))
    core.submit(0, TaskSpec(2, pool="b"))
    core.submit(0, TaskSpec(3, pool="b", key="k"))
    before = unchanged(core)
    with pytest.raises(QueueFull, match="3"):
        core.submit(0, TaskSpec(4, pool="a"))
    with pytest.raises(QueueFull):
        core.submit(0, TaskSpec(4, pool="b", priority="critical", key="k2"))
    core.check_invariants()
    assert unchanged(core) == before


def test_bounds_free_up_when_tasks_start():
    core = bounded(1)
    core.submit(0, TaskSpec("a"))
    with pytest.raises(QueueFull):
        core.submit(0, TaskSpec("b"))
    core.set_capacity(S, "default", 1)
    core.check_invariants()
    assert len(dispatches(drain(core))) == 1
    core.submit(S, TaskSpec("b"))
    core.check_invariants()


def test_batch_over_the_bound_is_rejected_never_shed():
    core = bounded(3, "shed_lowest")
    fill(core, "low", "low")
    before = unchanged(core)
    with pytest.raises(QueueFull) as info:
        core.submit_batch(0, [TaskSpec("a", priority="critical"), TaskSpec("b", priority="critical")])
    assert info.value.index == 1
    core.check_invariants()
    assert unchanged(core) == before
    assert core.snapshot(0).totals["shed"] == 0
    core.submit_batch(0, [TaskSpec("a", priority="critical")])
    core.check_invariants()


# ------------------------------------------------------------------ shed_lowest

def test_shed_lowest_evicts_the_newest_task_of_the_lowest_class():
    core = bounded(4, "shed_lowest")
    n1, l1, n2, l2 = fill(core, "normal", "low", "normal", "low")
    high = core.submit(S, TaskSpec("h", priority="high"))[0]
    core.check_invariants()
    assert core.status(l2) == "shed"
    assert core.status(l1) == "ready"
    [e] = events(drain(core))
    assert (e.id, e.status, e.at) == (l2, "shed", 1.0)
    assert e.message
    normal = core.submit(S, TaskSpec("n"))[0]
    assert core.status(l1) == "shed"
    # no low task left: normal work does not shed normal work
    with pytest.raises(QueueFull):
        core.submit(S, TaskSpec("n"))
    core.check_invariants()
    # high work sheds the newest normal task
    core.submit(S, TaskSpec("h2", priority="high"))
    assert core.status(normal) == "shed"
    assert (core.status(n1), core.status(n2), core.status(high)) == ("ready", "ready", "ready")
    totals = core.snapshot(S).totals
    assert (totals["shed"], totals["submitted"]) == (3, 7)
    core.check_invariants()


def test_shed_lowest_never_sheds_the_same_or_a_higher_class():
    core = bounded(2, "shed_lowest")
    fill(core, "high", "normal")
    before = unchanged(core)
    with pytest.raises(QueueFull):
        core.submit(0, TaskSpec("n", priority="normal"))
    with pytest.raises(QueueFull):
        core.submit(0, TaskSpec("l", priority="low"))
    core.check_invariants()
    assert unchanged(core) == before


# ------------------------------------------------------------------ shed_oldest

def test_shed_oldest_evicts_the_oldest_task_of_the_lowest_class():
    core = bounded(3, "shed_oldest")
    h1, l1, l2 = fill(core, "high", "low", "low")
    n = core.submit(S, TaskSpec("n"))[0]
    core.check_invariants()
    assert core.status(l1) == "shed" and core.status(l2) == "ready"
    # same class counts: the oldest low task makes room for a low one
    l3 = core.submit(2 * S, TaskSpec("l3", priority="low"))[0]
    assert core.status(l2) == "shed"
    core.submit(3 * S, TaskSpec("l4", priority="low"))
    assert core.status(l3) == "shed"
    core.check_invariants()
    # with no low task, normal is the lowest class present
    core.submit(3 * S, TaskSpec("crit", priority="critical"))
    core.check_invariants()
    assert core.status(h1) == "ready" and core.status(n) == "ready"


def test_shed_oldest_picks_the_lowest_class_not_the_oldest_task():
    core = bounded(2, "shed_oldest")
    h, n = fill(core, "high", "normal")
    core.submit(0, TaskSpec("h2", priority="high"))
    core.check_invariants()
    assert core.status(n) == "shed"
    assert core.status(h) == "ready"


def test_shed_oldest_never_sheds_a_higher_class():
    core = bounded(2, "shed_oldest")
    fill(core, "high", "normal")
    before = unchanged(core)
    with pytest.raises(QueueFull):
        core.submit(0, TaskSpec("l", priority="low"))
    core.check_invariants()
    assert unchanged(core) == before


# ------------------------------------------------------------------ victims

@pytest.mark.parametrize("overflow", ["shed_lowest", "shed_oldest"])
def test_running_tasks_are_never_shed(overflow):
    core = bounded(1, overflow, initial=1)
    running = core.submit(0, TaskSpec("r", priority="low"))[0]
    queued = core.submit(0, TaskSpec("q", priority="low"))[0]
    drain(core)
    high = core.submit(0, TaskSpec("h", priority="high"))[0]
    assert core.status(queued) == "shed"
    core.check_invariants()
    # the only low task left is running: a low submission finds nothing to shed
    before = unchanged(core)
    with pytest.raises(QueueFull):
        core.submit(0, TaskSpec("l", priority="low"))
    core.check_invariants()
    assert unchanged(core) == before
    assert core.status(running) == "running"
    assert core.status(high) == "ready"


@pytest.mark.parametrize("overflow", ["shed_lowest", "shed_oldest"])
def test_fixed_start_tasks_are_never_shed(overflow):
    core = bounded(2, overflow)
    fixed = core.submit(0, TaskSpec("f", priority="low", start_in=100))[0]
    ready = core.submit(0, TaskSpec("r", priority="low"))[0]
    core.submit(0, TaskSpec("h", priority="high"))
    core.check_invariants()
    assert core.status(ready) == "shed"       # not the fixed-start one, though it is older
    assert core.status(fixed) == "scheduled"
    core2 = bounded(1, overflow)
    fixed = core2.submit(0, TaskSpec("f", priority="low", start_in=100))[0]
    before = unchanged(core2)
    with pytest.raises(QueueFull):
        core2.submit(0, TaskSpec("c", priority="critical"))
    core2.check_invariants()
    assert unchanged(core2) == before
    assert core2.status(fixed) == "scheduled"
    # also when its start time has come and it waits for a slot
    core2.advance(100 * S)
    core2.check_invariants()
    assert core2.status(fixed) == "ready"
    with pytest.raises(QueueFull):
        core2.submit(100 * S, TaskSpec("c", priority="critical"))
    core2.check_invariants()
    assert core2.status(fixed) == "ready"


@pytest.mark.parametrize("overflow", ["shed_lowest", "shed_oldest"])
def test_inadmissible_submission_never_sheds(overflow):
    core = bounded(1, overflow)
    low = core.submit(0, TaskSpec("l", priority="low"))[0]
    with pytest.raises(UnknownDependency):
        core.submit(0, TaskSpec("h", priority="high", after="missing"))
    with pytest.raises(UnknownPool):
        core.submit(0, TaskSpec("h", priority="high", pool="missing"))
    core.check_invariants()
    assert core.status(low) == "ready"
    assert core.snapshot(0).totals["shed"] == 0


def test_shed_task_resolves_its_dependents():
    core = bounded(3, "shed_lowest")
    low = core.submit(0, TaskSpec("l", priority="low", key="low"))[0]
    after_success = core.submit(0, TaskSpec("s", after="low"))[0]
    after_complete = core.submit(0, TaskSpec("c", deps=[Dep("low", on="complete")]))[0]
    core.submit(S, TaskSpec("h", priority="high"))
    core.check_invariants()
    assert core.status(low) == "shed"
    assert core.status(after_success) == "skipped"
    assert core.status(after_complete) == "ready"
    # the skipped child left the pending count; the on-complete child is ready
    assert pending(core, S) == 2


def test_shed_task_cannot_run_or_be_cancelled():
    core = bounded(1, "shed_lowest")
    low = core.submit(0, TaskSpec("l", priority="low"))[0]
    high = core.submit(0, TaskSpec("h", priority="high"))[0]
    assert core.cancel(0, low) is False
    core.set_capacity(S, "default", 4)
    core.check_invariants()
    assert [d.task_id for d in dispatches(drain(core))] == [high]
    assert core.status(low) == "shed"


def test_shedding_on_the_scheduler_wide_bound():
    pool = PoolConfig("default", initial=0, autoscale=False, overflow="shed_lowest")
    core = make_core(pool, max_pending_total=2)
    low, normal = fill(core, "low", "normal")
    core.submit(0, TaskSpec("h", priority="high"))
    core.check_invariants()
    assert core.status(low) == "shed"
    assert core.status(normal) == "ready"
    assert core.snapshot(0).pending == 2


def test_many_shed_rounds_keep_the_counts_right():
    core = bounded(10, "shed_lowest", initial=1)
    survivors = []
    for i in range(200):
        prio = ("low", "normal", "high", "critical")[i % 4]
        try:
            tid = core.submit(i, TaskSpec(i, priority=prio))[0]
            survivors.append(tid)
        except QueueFull:
            pass
        core.check_invariants()
        if i % 7 == 0:
            for d in dispatches(drain(core)):
                core.complete(i, d.lease)
                core.check_invariants()
    snap = core.snapshot(200)
    assert snap.pool("default").pending <= 10
    assert snap.totals["shed"] > 0
    by_class = snap.pool("default").pending_by_class
    assert by_class["low"] == 0


def test_shedding_the_parent_of_the_incoming_task_resolves_its_edge():
    # The only victim is the new task's own parent: the edge is resolved from
    # the shed status at once, instead of leaving the child blocked forever.
    core = bounded(1, "shed_lowest")
    parent = core.submit(0, TaskSpec("l", priority="low", key="l"))[0]
    child = core.submit(0, TaskSpec("h", priority="high", after="l"))[0]
    core.check_invariants()
    assert core.status(parent) == "shed"
    assert core.status(child) == "skipped"
    assert "shed" in core.info(child).message
    assert pending(core) == 0
    core.submit(0, TaskSpec("l2", priority="low", key="l2"))
    on_complete = core.submit(0, TaskSpec("h2", priority="high",
                                          deps=[Dep("l2", on="complete")]))[0]
    core.check_invariants()
    assert core.status("l2") == "shed"
    assert core.status(on_complete) == "ready"
    core.set_capacity(S, "default", 1)
    core.check_invariants()
    assert [d.task_id for d in dispatches(drain(core))] == [on_complete]


@pytest.mark.parametrize("bound", [0, {"normal": 0}, "total"])
@pytest.mark.parametrize("plain", [True, False], ids=["plain", "with-options"])
def test_a_bound_of_zero_refuses_for_good_on_every_path(bound, plain):
    # A task the bound can never admit says so (QueueFull.never), whether it
    # takes the plain fast path or the planning path: a driver with the
    # "wait" policy would otherwise wait for room that never comes.
    if bound == "total":
        core = make_core(PoolConfig("default", max=4, initial=0, autoscale=False), max_pending_total=0)
    else:
        core = bounded(bound, "wait")
    spec = TaskSpec("t") if plain else TaskSpec("t", tenant="a")
    assert spec.plain is plain
    with pytest.raises(QueueFull) as refused:
        core.submit(0, spec)
    assert refused.value.never is True
    assert "the submission alone exceeds it" in str(refused.value)
    core.check_invariants()
    assert pending(core) == 0


@pytest.mark.parametrize("plain", [True, False], ids=["plain", "with-options"])
def test_a_batch_is_persisted_whole_before_any_of_it_is_announced_ready(plain):
    # A batch of plain tasks is admitted without planning; it must still give
    # the actions a planned batch gives: every submission persisted, then the
    # tasks queued (ready events, dispatch), so a driver that holds events
    # until their mutations are durable sees the same order either way.
    core = make_core(PoolConfig("default", max=4, initial=0, autoscale=False),
                     persist=True, emit_transitions=True)
    specs = [TaskSpec(f"t{i}") if plain else TaskSpec(f"t{i}", tenant="a") for i in range(3)]
    ids = [task_id for task_id, _ in core.submit_batch(0, specs)]
    kinds = []
    for raw in core.actions:
        if raw[0] == act.PERSIST:
            kinds.append(("persist", raw[1][0], raw[1][1]))
        elif raw[0] == act.EVENT:
            kinds.append(("event", raw[4], raw[1]))
    assert kinds == ([("persist", "submit", i) for i in ids] + [("event", "ready", i) for i in ids])
    core.check_invariants()
