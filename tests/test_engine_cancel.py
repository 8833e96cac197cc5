"""Cancellation of tasks in every state, and its effect on dependents."""

import pytest

from cronoq.core import Dep, PoolConfig, RetryPolicy, TaskSpec, UnknownTask
from enginekit import S, aborts, dispatches, drain, events, make_core


def one_slot(**config):
    return make_core(PoolConfig("default", max=1, initial=1, autoscale=False), **config)


def test_cancel_a_ready_task():
    core = one_slot()
    busy = core.submit(0, TaskSpec("busy"))[0]
    tid = core.submit(0, TaskSpec("x"))[0]
    nxt = core.submit(0, TaskSpec("next"))[0]
    [d] = dispatches(drain(core))
    assert core.cancel(S, tid) is True
    core.check_invariants()
    [e] = events(drain(core))
    assert (e.id, e.status, e.attempt, e.at) == (tid, "cancelled", 0, 1.0)
    snap = core.snapshot(S)
    assert snap.pool("default").pending == 1
    assert snap.totals["cancelled"] == 1
    core.complete(2 * S, d.lease)
    core.check_invariants()
    [d] = dispatches(drain(core))
    assert d.task_id == nxt      # the cancelled task never runs
    assert busy < tid


def test_cancel_a_blocked_task():
    core = one_slot()
    p = core.submit(0, TaskSpec("p", key="p"))[0]
    c = core.submit(0, TaskSpec("c", after="p"))[0]
    [d] = dispatches(drain(core))
    assert core.cancel(S, c) is True
    core.check_invariants()
    assert core.status(c) == "cancelled"
    assert [(e.id, e.status) for e in events(drain(core))] == [(c, "cancelled")]
    core.complete(2 * S, d.lease)
    core.check_invariants()
    acts = drain(core)
    assert dispatches(acts) == []
    assert [e.id for e in events(acts)] == [p]


def test_cancel_a_retrying_task_disarms_its_retry():
    core = one_slot()
    tid = core.submit(0, TaskSpec("x", retry=RetryPolicy(max_attempts=3, initial_backoff=5,
                                                         jitter=False)))[0]
    [d] = dispatches(drain(core))
    core.complete(S, d.lease, "retryable")
    core.check_invariants()
    assert core.status(tid) == "retrying"
    assert core.snapshot(S).pool("default").pending == 1
    assert core.cancel(2 * S, tid) is True
    core.check_invariants()
    assert core.snapshot(2 * S).pool("default").pending == 0
    [e] = events(drain(core))
    assert (e.status, e.attempt) == ("cancelled", 1)
    core.advance(10 * S)
    core.check_invariants()
    assert dispatches(drain(core)) == []
    assert core.status(tid) == "cancelled"


def test_cancel_a_running_task_aborts_it_and_frees_the_slot_at_once():
    core = one_slot()
    tid = core.submit(0, TaskSpec("x", timeout=100))[0]
    nxt = core.submit(0, TaskSpec("next"))[0]
    [d] = dispatches(drain(core))
    assert core.cancel(S, tid) is True
    core.check_invariants()
    acts = drain(core)
    [a] = aborts(acts)
    assert (a.lease, a.task_id) == (d.lease, tid)
    [dn] = dispatches(acts)
    assert dn.task_id == nxt     # the freed slot was reused in the same call
    assert [(e.id, e.status, e.attempt) for e in events(acts)] == [(tid, "cancelled", 1)]
    # the executor's late report is stale, and the timeout is disarmed
    assert core.complete(2 * S, d.lease) is False
    core.advance(200 * S)
    core.check_invariants()
    assert aborts(drain(core)) == []
    totals = core.snapshot(200 * S).totals
    assert (totals["cancelled"], totals["stale_completions"], totals["timeouts"]) == (1, 1, 0)
    assert core.status(tid) == "cancelled"


def test_cancel_by_key():
    core = one_slot()
    core.submit(0, TaskSpec("busy"))
    tid = core.submit(0, TaskSpec("x", key="the-key"))[0]
    assert core.cancel(0, "the-key") is True
    core.check_invariants()
    assert core.status(tid) == "cancelled"


def test_cancel_an_ended_task_returns_false():
    core = one_slot()
    tid = core.submit(0, TaskSpec("x", key="k"))[0]
    [d] = dispatches(drain(core))
    core.complete(S, d.lease)
    drain(core)
    assert core.cancel(2 * S, tid) is False
    assert core.cancel(2 * S, "k") is False
    core.check_invariants()
    assert core.status(tid) == "succeeded"
    assert events(drain(core)) == []
    assert core.snapshot(2 * S).totals["cancelled"] == 0


def test_cancel_twice():
    core = one_slot()
    core.submit(0, TaskSpec("busy"))
    tid = core.submit(0, TaskSpec("x"))[0]
    assert core.cancel(0, tid) is True
    assert core.cancel(0, tid) is False
    core.check_invariants()
    assert core.snapshot(0).totals["cancelled"] == 1


def test_cancel_unknown_ref_raises():
    core = one_slot()
    with pytest.raises(UnknownTask):
        core.cancel(0, 4242)
    with pytest.raises(UnknownTask):
        core.cancel(0, "no-such-key")
    core.check_invariants()


def test_cancel_skips_success_and_failure_children_and_runs_complete_children():
    core = make_core(PoolConfig("default", max=8, initial=8, autoscale=False))
    p = core.submit(0, TaskSpec("p", key="p"))[0]
    on_success = core.submit(0, TaskSpec("s", after="p"))[0]
    on_failure = core.submit(0, TaskSpec("f", deps=[Dep("p", on="failure")]))[0]
    on_complete = core.submit(0, TaskSpec("c", deps=[Dep(p, on="complete")]))[0]
    grandchild = core.submit(0, TaskSpec("g", after=on_success))[0]
    drain(core)
    assert core.cancel(S, "p") is True
    core.check_invariants()
    acts = drain(core)
    assert {e.id: e.status for e in events(acts)} == {
        p: "cancelled", on_success: "skipped", on_failure: "skipped", grandchild: "skipped"}
    assert [d.task_id for d in dispatches(acts)] == [on_complete]
    assert len(aborts(acts)) == 1


def test_cancel_a_blocked_child_leaves_its_parent_alone():
    core = make_core(PoolConfig("default", max=2, initial=2, autoscale=False))
    p = core.submit(0, TaskSpec("p"))[0]
    c = core.submit(0, TaskSpec("c", after=p))[0]
    sibling = core.submit(0, TaskSpec("s", after=p))[0]
    [d] = dispatches(drain(core))
    core.cancel(S, c)
    core.check_invariants()
    assert core.status(p) == "running"
    core.complete(2 * S, d.lease)
    core.check_invariants()
    acts = drain(core)
    assert [x.task_id for x in dispatches(acts)] == [sibling]
    assert core.status(c) == "cancelled"
