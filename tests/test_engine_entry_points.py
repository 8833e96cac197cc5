"""Every call brings the engine to ``now``: timers due by then fire and what
they free or ready is dispatched, even when the call itself returns early or
raises. Otherwise a slot could stay idle with no wakeup armed."""

import pytest

from cronoq.core import PoolConfig, QueueFull, RetryPolicy, TaskSpec, UnknownPool, UnknownTask
from enginekit import S, aborts, dispatches, drain, make_core


def timed_out_slot():
    """One slot, held by a task that times out at 5 s; b waits behind it."""
    pool = PoolConfig("default", max=1, initial=1, autoscale=False, max_pending=1, overflow="reject")
    core = make_core(pool)
    a = core.submit(0, TaskSpec("a", timeout=5, retry=RetryPolicy.none()))[0]
    b = core.submit(0, TaskSpec("b"))[0]
    [d] = dispatches(drain(core))
    assert d.task_id == a
    core.check_invariants()
    return core, d, b


def assert_b_took_the_slot(core, b):
    core.check_invariants()
    acts = drain(core)
    assert len(aborts(acts)) == 1
    assert [d.task_id for d in dispatches(acts)] == [b]
    assert core.status(b) == "running"


def test_heartbeat_fires_due_timers_and_dispatches():
    core, d, b = timed_out_slot()
    assert core.heartbeat(5 * S, d.lease) is False     # its timeout came first
    assert_b_took_the_slot(core, b)


def test_stale_completion_at_the_timeout_dispatches_the_next_task():
    core, d, b = timed_out_slot()
    assert core.complete(5 * S, d.lease) is False
    assert_b_took_the_slot(core, b)
    assert core.snapshot(5 * S).totals["stale_completions"] == 1


def test_cancel_of_an_ended_or_unknown_task_still_dispatches():
    core, d, b = timed_out_slot()
    with pytest.raises(UnknownTask):
        core.cancel(5 * S, "nope")
    assert_b_took_the_slot(core, b)
    core, d, b = timed_out_slot()
    assert core.cancel(5 * S, d.task_id) is False      # it timed out and dead-lettered
    assert_b_took_the_slot(core, b)


def test_refused_submission_still_dispatches():
    core, d, b = timed_out_slot()
    with pytest.raises(UnknownPool):
        core.submit(5 * S, TaskSpec("c", pool="elsewhere"))
    assert_b_took_the_slot(core, b)
    core, d, b = timed_out_slot()
    with pytest.raises(UnknownPool):
        core.submit_batch(5 * S, [TaskSpec("c", pool="elsewhere")])
    assert_b_took_the_slot(core, b)


def test_bound_is_checked_after_due_timers_free_room():
    # At 5 s the timeout frees the slot and b starts: c fits in the bound.
    core, d, b = timed_out_slot()
    c = core.submit(5 * S, TaskSpec("c"))[0]
    assert_b_took_the_slot(core, b)
    assert core.status(c) == "ready"
    with pytest.raises(QueueFull):
        core.submit(5 * S, TaskSpec("d"))


def test_invalid_outcome_changes_nothing():
    core, d, b = timed_out_slot()
    with pytest.raises(ValueError, match="outcome"):
        core.complete(S, d.lease, "maybe")
    core.check_invariants()
    assert core.status(d.task_id) == "running"
    assert core.complete(S, d.lease, "success") is True
    core.check_invariants()
    assert [x.task_id for x in dispatches(drain(core))] == [b]


def test_retry_due_at_a_heartbeat_is_dispatched():
    core = make_core(PoolConfig("default", max=2, initial=2, autoscale=False))
    policy = RetryPolicy(max_attempts=2, initial_backoff=3, jitter=False)
    a = core.submit(0, TaskSpec("a", retry=policy))[0]
    core.submit(0, TaskSpec("other"))
    da, do = dispatches(drain(core))
    core.complete(S, da.lease, "retryable")
    core.check_invariants()
    assert core.heartbeat(4 * S, do.lease) is True
    core.check_invariants()
    [d] = dispatches(drain(core))
    assert (d.task_id, d.attempt) == (a, 2)
