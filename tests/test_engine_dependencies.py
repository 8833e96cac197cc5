"""Dependencies: edges, skip propagation, late dependents, unknown parents,
cycles and atomic batches."""

import pytest

from cronoq.core import (
    AdmissionError, Cycle, Dep, InvalidTask, PoolConfig, QueueFull, RetryPolicy, TaskSpec,
    UnknownDependency, UnknownPool,
)
from enginekit import S, dispatches, drain, events, make_core


def wide(**pool):
    pool.setdefault("max", 8)
    pool.setdefault("initial", 8)
    return make_core(PoolConfig("default", autoscale=False, **pool))


def lease_of(core, task_id):
    for lease, e in core.running.items():
        if e.id == task_id:
            return lease
    raise AssertionError(f"task {task_id} is not running")


def finish(core, now, task_id, outcome="success"):
    assert core.complete(now, lease_of(core, task_id), outcome)
    core.check_invariants()
    return drain(core)


def state(core):
    """Live task count and submitted total: what an error must leave unchanged."""
    snap = core.snapshot(core.now)
    return (snap.live_tasks, snap.totals["submitted"], snap.pending, dict(core.keys),
            {k: list(v) for k, v in core.awaiting.items()})


# ------------------------------------------------------------------ edges

def test_after_key_waits_for_success():
    core = wide()
    p = core.submit(0, TaskSpec("p", key="p"))[0]
    c = core.submit(0, TaskSpec("c", after="p"))[0]
    core.check_invariants()
    assert core.status(c) == "blocked"
    assert [d.task_id for d in dispatches(drain(core))] == [p]
    acts = finish(core, S, p)
    assert [d.task_id for d in dispatches(acts)] == [c]


def test_after_id_and_list_of_refs():
    core = wide()
    a = core.submit(0, TaskSpec("a"))[0]
    b = core.submit(0, TaskSpec("b", key="b"))[0]
    c = core.submit(0, TaskSpec("c", after=[a, "b"]))[0]
    drain(core)
    finish(core, S, a)
    assert core.status(c) == "blocked"
    acts = finish(core, 2 * S, b)
    assert [d.task_id for d in dispatches(acts)] == [c]


@pytest.mark.parametrize("outcome, on, expected", [
    ("success", "success", "ready"),
    ("permanent", "success", "skipped"),
    ("success", "failure", "skipped"),
    ("permanent", "failure", "ready"),
    ("success", "complete", "ready"),
    ("permanent", "complete", "ready"),
    ("cancelled", "complete", "ready"),
    ("cancelled", "failure", "skipped"),
    ("cancelled", "success", "skipped"),
])
def test_edge_conditions(outcome, on, expected):
    core = make_core(PoolConfig("default", max=1, initial=1, autoscale=False))
    p = core.submit(0, TaskSpec("p", key="p"))[0]
    blocker = core.submit(0, TaskSpec("blocker"))[0]   # keeps the child from running at once
    c = core.submit(0, TaskSpec("c", deps=[Dep("p", on=on)]))[0]
    drain(core)
    finish(core, S, p, outcome)
    assert core.status(blocker) == "running"
    assert core.status(c) == expected


def test_failure_edge_is_satisfied_by_dead_letter():
    core = wide()
    p = core.submit(0, TaskSpec("p", retry=RetryPolicy.none()))[0]
    c = core.submit(0, TaskSpec("c", deps=Dep(p, on="failure")))[0]
    drain(core)
    acts = finish(core, S, p, "retryable")
    assert core.status(p) == "dead_lettered"
    assert [d.task_id for d in dispatches(acts)] == [c]


def test_skip_propagates_down_the_chain_but_on_complete_children_run():
    core = wide()
    a = core.submit(0, TaskSpec("a", key="a"))[0]
    b = core.submit(0, TaskSpec("b", key="b", after="a"))[0]
    c = core.submit(0, TaskSpec("c", key="c", after="b"))[0]
    d_ = core.submit(0, TaskSpec("d", deps=[Dep("c", on="failure")]))[0]
    e = core.submit(0, TaskSpec("e", deps=[Dep("b", on="complete")]))[0]
    f = core.submit(0, TaskSpec("f", deps=[Dep("c", on="complete")]))[0]
    drain(core)
    acts = finish(core, S, a, "permanent")
    assert {ev.id: ev.status for ev in events(acts)} == {
        a: "failed", b: "skipped", c: "skipped", d_: "skipped"}
    assert sorted(d.task_id for d in dispatches(acts)) == [e, f]
    assert "b" in core.info(c).message
    totals = core.snapshot(S).totals
    assert (totals["skipped"], totals["failed"]) == (3, 1)


def test_child_waits_for_all_parents():
    core = wide()
    ps = [core.submit(0, TaskSpec(i))[0] for i in range(3)]
    c = core.submit(0, TaskSpec("c", after=ps))[0]
    drain(core)
    for i, p in enumerate(ps[:-1]):
        finish(core, (i + 1) * S, p)
        assert core.status(c) == "blocked"
        assert core.tasks[c].unmet == len(ps) - i - 1
    acts = finish(core, 10 * S, ps[-1])
    assert [d.task_id for d in dispatches(acts)] == [c]


def test_one_failed_parent_skips_the_child_at_once():
    core = wide()
    a = core.submit(0, TaskSpec("a"))[0]
    b = core.submit(0, TaskSpec("b"))[0]
    c = core.submit(0, TaskSpec("c", after=[a, b]))[0]
    drain(core)
    finish(core, S, a, "permanent")
    assert core.status(c) == "skipped"
    acts = finish(core, 2 * S, b)
    assert events(acts)[0].id == b
    assert core.status(c) == "skipped"


def test_dependencies_across_pools():
    core = make_core(PoolConfig("a", max=1, initial=1, autoscale=False),
                     PoolConfig("b", max=1, initial=1, autoscale=False))
    p = core.submit(0, TaskSpec("p", pool="a", key="p"))[0]
    ok = core.submit(0, TaskSpec("ok", pool="b", deps=[Dep("p", on="complete")]))[0]
    skipped = core.submit(0, TaskSpec("skipped", pool="b", after=p))[0]
    core.check_invariants()
    assert [d.task_id for d in dispatches(drain(core))] == [p]
    acts = finish(core, S, p, "permanent")
    assert [(d.task_id, d.pool) for d in dispatches(acts)] == [(ok, "b")]
    assert core.status(skipped) == "skipped"


# ------------------------------------------------------------------ late dependents

@pytest.mark.parametrize("outcome, on, expected", [
    ("success", "success", "running"),
    ("permanent", "success", "skipped"),
    ("permanent", "failure", "running"),
    ("success", "failure", "skipped"),
    ("permanent", "complete", "running"),
])
def test_late_dependent_is_resolved_from_the_retained_status(outcome, on, expected):
    core = wide()
    p = core.submit(0, TaskSpec("p", key="p"))[0]
    drain(core)
    finish(core, S, p, outcome)
    by_key = core.submit(2 * S, TaskSpec("c1", deps=[Dep("p", on=on)]))[0]
    by_id = core.submit(2 * S, TaskSpec("c2", deps=[Dep(p, on=on)]))[0]
    core.check_invariants()
    assert core.status(by_key) == expected
    assert core.status(by_id) == expected
    acts = drain(core)
    if expected == "skipped":
        assert sorted(ev.id for ev in events(acts)) == [by_key, by_id]
        assert all(ev.status == "skipped" for ev in events(acts))
        assert dispatches(acts) == []


def test_late_dependent_of_a_shed_or_cancelled_parent():
    core = wide()
    p = core.submit(0, TaskSpec("p", key="p"))[0]
    core.cancel(0, p)
    drain(core)
    c = core.submit(S, TaskSpec("c", after="p"))[0]
    k = core.submit(S, TaskSpec("k", deps=[Dep("p", on="complete")]))[0]
    core.check_invariants()
    assert core.status(c) == "skipped"
    assert core.status(k) == "running"


def test_late_dependent_after_retention_is_rejected():
    core = make_core(PoolConfig("default", max=2, initial=2, autoscale=False), retention=10.0)
    p = core.submit(0, TaskSpec("p", key="p"))[0]
    drain(core)
    finish(core, S, p)
    with pytest.raises(UnknownDependency):
        core.submit(20 * S, TaskSpec("c", after="p"))
    with pytest.raises(UnknownDependency):
        core.submit(20 * S, TaskSpec("c", after=p))
    core.check_invariants()


# ------------------------------------------------------------------ unknown parents

def test_unknown_key_is_rejected_by_default():
    core = wide()
    before = state(core)
    with pytest.raises(UnknownDependency, match="nope"):
        core.submit(0, TaskSpec("c", after="nope"))
    core.check_invariants()
    assert state(core) == before
    assert core.awaiting == {}


def test_unknown_id_is_always_rejected_even_when_awaiting_keys():
    core = wide(unknown_dependency="await")
    before = state(core)
    with pytest.raises(UnknownDependency, match="999"):
        core.submit(0, TaskSpec("c", after=999))
    core.check_invariants()
    assert state(core) == before


def test_await_unknown_key_until_it_is_submitted():
    core = wide(unknown_dependency="await")
    c = core.submit(0, TaskSpec("c", key="c", after="later"))[0]
    core.check_invariants()
    assert core.status(c) == "blocked"
    assert list(core.awaiting) == ["later"]
    assert dispatches(drain(core)) == []
    p = core.submit(10 * S, TaskSpec("p", key="later"))[0]
    core.check_invariants()
    assert core.awaiting == {}
    assert [d.task_id for d in dispatches(drain(core))] == [p]
    acts = finish(core, 11 * S, p)
    assert [d.task_id for d in dispatches(acts)] == [c]


def test_awaited_key_that_fails_skips_the_child():
    core = wide(unknown_dependency="await")
    c = core.submit(0, TaskSpec("c", after="later"))[0]
    p = core.submit(S, TaskSpec("p", key="later"))[0]
    drain(core)
    finish(core, 2 * S, p, "permanent")
    assert core.status(c) == "skipped"


def test_await_timeout_skips_the_child_and_cleans_up():
    core = wide(unknown_dependency="await", await_timeout=30)
    c = core.submit(0, TaskSpec("c", after="ghost"))[0]
    gc = core.submit(0, TaskSpec("gc", deps=[Dep(c, on="complete")]))[0]
    g2 = core.submit(0, TaskSpec("g2", after=c))[0]
    core.check_invariants()
    assert core.next_wakeup() == 30 * S
    core.advance(30 * S - 1)
    core.check_invariants()
    assert core.status(c) == "blocked"
    core.advance(30 * S)
    core.check_invariants()
    assert core.status(c) == "skipped"
    assert "ghost" in core.info(c).message
    assert core.status(g2) == "skipped"
    assert core.status(gc) == "running"
    assert core.awaiting == {}
    # the key may appear later: nothing waits for it any more
    core.submit(40 * S, TaskSpec("ghost", key="ghost"))
    core.check_invariants()
    assert core.awaiting == {}


def test_await_timeout_is_disarmed_when_the_key_appears():
    core = wide(unknown_dependency="await", await_timeout=30)
    c = core.submit(0, TaskSpec("c", after="k"))[0]
    p = core.submit(10 * S, TaskSpec("p", key="k"))[0]
    core.advance(100 * S)
    core.check_invariants()
    assert core.status(c) == "blocked"
    drain(core)
    finish(core, 101 * S, p)
    assert core.status(c) == "running"


def test_cancelled_awaiting_child_is_removed_from_the_awaiting_table():
    core = wide(unknown_dependency="await")
    a = core.submit(0, TaskSpec("a", after="k"))[0]
    b = core.submit(0, TaskSpec("b", after="k"))[0]
    assert len(core.awaiting["k"]) == 2
    core.cancel(S, a)
    core.check_invariants()
    assert [child.id for child, _ in core.awaiting["k"]] == [b]
    core.cancel(S, b)
    core.check_invariants()
    assert core.awaiting == {}


def test_await_policy_is_per_pool():
    core = make_core(PoolConfig("strict", autoscale=False),
                     PoolConfig("lenient", autoscale=False, unknown_dependency="await"))
    with pytest.raises(UnknownDependency):
        core.submit(0, TaskSpec("x", pool="strict", after="k"))
    tid = core.submit(0, TaskSpec("x", pool="lenient", after="k"))[0]
    core.check_invariants()
    assert core.status(tid) == "blocked"


def test_child_awaiting_two_keys_times_out_naming_the_missing_one():
    core = wide(unknown_dependency="await", await_timeout=5)
    c = core.submit(0, TaskSpec("c", after=["k1", "k2"]))[0]
    core.submit(S, TaskSpec("p1", key="k1"))
    core.check_invariants()
    assert list(core.awaiting) == ["k2"]
    core.advance(5 * S)
    core.check_invariants()
    assert core.status(c) == "skipped"
    assert "k2" in core.info(c).message
    assert core.awaiting == {}


# ------------------------------------------------------------------ cycles

def test_task_depending_on_its_own_key_is_a_cycle():
    core = wide(unknown_dependency="await")
    before = state(core)
    with pytest.raises(Cycle):
        core.submit(0, TaskSpec("x", key="self", after="self"))
    core.check_invariants()
    assert state(core) == before


def test_cycle_within_a_batch_is_rejected():
    core = wide()
    before = state(core)
    with pytest.raises(Cycle) as info:
        core.submit_batch(0, [
            TaskSpec("ok", key="ok"),
            TaskSpec("a", key="a", after="c"),
            TaskSpec("b", key="b", after="a"),
            TaskSpec("c", key="c", after="b"),
        ])
    assert info.value.index in (1, 2, 3)
    assert f"task {info.value.index}" in str(info.value)
    core.check_invariants()
    assert state(core) == before
    assert dispatches(drain(core)) == []


def test_cycle_through_an_awaited_key_is_rejected():
    core = wide(unknown_dependency="await")
    core.submit(0, TaskSpec("a", key="a", after="b"))      # awaits b
    core.submit(0, TaskSpec("m", key="m", after="a"))      # blocked on a
    before = state(core)
    with pytest.raises(Cycle):
        core.submit(S, TaskSpec("b", key="b", after="m"))   # b -> m -> a -> b
    core.check_invariants()
    assert state(core) == before
    # a b without the back edge is fine
    b = core.submit(S, TaskSpec("b", key="b"))[0]
    core.check_invariants()
    assert core.awaiting == {}
    assert core.status(b) == "running"


def test_cycle_through_an_awaited_key_within_a_batch():
    core = wide(unknown_dependency="await")
    core.submit(0, TaskSpec("a", key="a", after="b"))
    before = state(core)
    with pytest.raises(Cycle) as info:
        core.submit_batch(S, [TaskSpec("x"), TaskSpec("m", key="m", after="a"),
                              TaskSpec("b", key="b", after="m")])
    assert info.value.index == 2
    core.check_invariants()
    assert state(core) == before


# ------------------------------------------------------------------ batches

def test_batch_keys_may_be_referenced_in_any_order():
    core = wide()
    results = core.submit_batch(0, [
        TaskSpec("c", key="c", after=["a", "b"]),
        TaskSpec("b", key="b", after="a"),
        TaskSpec("a", key="a"),
    ])
    core.check_invariants()
    c, b, a = (r[0] for r in results)
    assert all(r[1] is False for r in results)
    assert [d.task_id for d in dispatches(drain(core))] == [a]
    assert (core.status(b), core.status(c)) == ("blocked", "blocked")
    acts = finish(core, S, a)
    assert [d.task_id for d in dispatches(acts)] == [b]
    acts = finish(core, 2 * S, b)
    assert [d.task_id for d in dispatches(acts)] == [c]


@pytest.mark.parametrize("bad, error", [
    (TaskSpec("bad", after="missing"), UnknownDependency),
    (TaskSpec("bad", after=424242), UnknownDependency),
    (TaskSpec("bad", pool="nope"), UnknownPool),
    ("not a task", InvalidTask),
    (TaskSpec("bad", key="self", after="self"), Cycle),
])
def test_batch_is_atomic_and_names_the_offending_index(bad, error):
    core = wide()
    core.submit(0, TaskSpec("existing", key="existing"))
    drain(core)
    before = state(core)
    batch = [TaskSpec("a", key="a"), TaskSpec("b", after="a"), bad, TaskSpec("d", after="existing")]
    with pytest.raises(error) as info:
        core.submit_batch(S, batch)
    assert isinstance(info.value, AdmissionError)
    assert info.value.index == 2
    assert "task 2" in str(info.value)
    core.check_invariants()
    assert state(core) == before
    assert dispatches(drain(core)) == []
    with pytest.raises(Exception):
        core.status("a")


def test_batch_over_a_bound_is_rejected_whole():
    core = wide(max_pending=3, overflow="reject", max=1, initial=0)
    core.submit(0, TaskSpec("x"))
    before = state(core)
    with pytest.raises(QueueFull) as info:
        core.submit_batch(0, [TaskSpec(i) for i in range(3)])
    assert info.value.index == 2
    core.check_invariants()
    assert state(core) == before


def test_batch_child_of_a_retained_failure_is_skipped_with_its_dependents():
    core = wide()
    p = core.submit(0, TaskSpec("p", key="p"))[0]
    drain(core)
    finish(core, S, p, "permanent")
    results = core.submit_batch(2 * S, [
        TaskSpec("a", key="a", after="p"),
        TaskSpec("b", key="b", after="a"),
        TaskSpec("c", deps=[Dep("a", on="complete")]),
    ])
    core.check_invariants()
    a, b, c = (r[0] for r in results)
    assert (core.status(a), core.status(b), core.status(c)) == ("skipped", "skipped", "running")


def test_empty_batch():
    core = wide()
    assert core.submit_batch(0, []) == []
    core.check_invariants()
