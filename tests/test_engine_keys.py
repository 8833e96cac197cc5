"""Keys: deduplication, lookups, retention and its bound."""

import pytest

from cronoq.core import PoolConfig, TaskSpec, UnknownPool, UnknownTask
from enginekit import S, dispatches, drain, events, make_core

HOUR = 3600 * S


def one_slot(**config):
    return make_core(PoolConfig("default", max=1, initial=1, autoscale=False), **config)


def run_to_end(core, now, outcome="success"):
    [d] = dispatches(drain(core))
    assert core.complete(now, d.lease, outcome)
    core.check_invariants()
    drain(core)
    return d


def test_duplicate_of_a_live_task_returns_the_same_id():
    core = one_slot()
    tid, dup = core.submit(0, TaskSpec("first", key="k"))
    assert dup is False
    again, dup = core.submit(S, TaskSpec("second", key="k", priority="high"))
    core.check_invariants()
    assert (again, dup) == (tid, True)
    snap = core.snapshot(S)
    assert snap.totals["submitted"] == 1
    assert snap.live_tasks == 1
    [d] = dispatches(drain(core))
    assert d.payload == "first"   # the duplicate changed nothing


def test_duplicate_of_a_queued_task_adds_no_work():
    core = one_slot()
    core.submit(0, TaskSpec("busy"))
    tid = core.submit(0, TaskSpec("x", key="k"))[0]
    for i in range(5):
        assert core.submit(i * S, TaskSpec("x", key="k")) == (tid, True)
        core.check_invariants()
    assert core.snapshot(5 * S).pool("default").pending == 1


def test_duplicate_of_a_retained_task_returns_the_same_id():
    core = one_slot()
    tid = core.submit(0, TaskSpec("x", key="k"))[0]
    run_to_end(core, S)
    assert core.status("k") == "succeeded"
    assert core.submit(10 * S, TaskSpec("x", key="k")) == (tid, True)
    core.check_invariants()
    assert dispatches(drain(core)) == []
    assert core.snapshot(10 * S).totals["submitted"] == 1


@pytest.mark.parametrize("outcome, status", [("permanent", "failed"), ("cancelled", "cancelled")])
def test_duplicate_of_a_task_that_ended_badly_is_still_a_duplicate(outcome, status):
    core = one_slot()
    tid = core.submit(0, TaskSpec("x", key="k"))[0]
    run_to_end(core, S, outcome)
    assert core.status(tid) == status
    assert core.submit(2 * S, TaskSpec("x", key="k")) == (tid, True)
    core.check_invariants()


def test_lookup_by_key_for_info_status_and_cancel():
    core = one_slot()
    core.submit(0, TaskSpec("busy"))
    tid = core.submit(0, TaskSpec("x", key="job-1", kind="report"))[0]
    core.check_invariants()
    info = core.info("job-1")
    assert (info.id, info.key, info.kind, info.status) == (tid, "job-1", "report", "ready")
    assert core.status("job-1") == "ready"
    assert core.cancel(S, "job-1") is True
    core.check_invariants()
    assert core.status("job-1") == "cancelled"
    assert core.status(tid) == "cancelled"
    assert core.cancel(2 * S, "job-1") is False


def test_unknown_key_and_id_raise_unknown_task():
    core = one_slot()
    with pytest.raises(UnknownTask):
        core.info("nope")
    with pytest.raises(UnknownTask):
        core.status(12345)
    with pytest.raises(UnknownTask):
        core.cancel(0, "nope")
    assert isinstance(UnknownTask("x"), LookupError)


def test_key_reserved_for_the_retention_window_then_released():
    core = one_slot()
    tid = core.submit(0, TaskSpec("x", key="k"))[0]
    run_to_end(core, 10 * S)   # ended at 10 s: reserved until 10 s + 1 h
    core.advance(10 * S + HOUR - 1)
    core.check_invariants()
    assert core.status("k") == "succeeded"
    assert core.submit(10 * S + HOUR - 1, TaskSpec("x", key="k")) == (tid, True)
    core.advance(10 * S + HOUR)
    core.check_invariants()
    with pytest.raises(UnknownTask):
        core.status("k")
    with pytest.raises(UnknownTask):
        core.status(tid)
    new, dup = core.submit(10 * S + HOUR, TaskSpec("y", key="k"))
    core.check_invariants()
    assert dup is False and new != tid
    [d] = dispatches(drain(core))
    assert d.payload == "y"
    assert core.status("k") == "running"


def test_key_released_when_the_submission_itself_crosses_the_window():
    # No advance in between: submit must expire the old reservation itself.
    core = one_slot()
    tid = core.submit(0, TaskSpec("x", key="k"))[0]
    run_to_end(core, S)
    new, dup = core.submit(S + HOUR + 1, TaskSpec("x", key="k"))
    core.check_invariants()
    assert (dup, new > tid) == (False, True)


def test_live_task_keeps_its_key_however_long_it_runs():
    core = one_slot()
    tid = core.submit(0, TaskSpec("x", key="k"))[0]
    drain(core)
    core.advance(5 * HOUR)
    core.check_invariants()
    assert core.submit(5 * HOUR, TaskSpec("x", key="k")) == (tid, True)


def test_custom_retention_window():
    core = one_slot(retention=60.0)
    tid = core.submit(0, TaskSpec("x", key="k"))[0]
    run_to_end(core, 0)
    assert core.submit(59 * S, TaskSpec("x", key="k")) == (tid, True)
    new, dup = core.submit(60 * S, TaskSpec("x", key="k"))
    core.check_invariants()
    assert dup is False and new != tid


def test_zero_retention_releases_the_key_at_once():
    core = one_slot(retention=0)
    tid = core.submit(0, TaskSpec("x", key="k"))[0]
    run_to_end(core, S)
    with pytest.raises(UnknownTask):
        core.status(tid)
    new, dup = core.submit(S, TaskSpec("x", key="k"))
    core.check_invariants()
    assert dup is False and new != tid


def test_retention_max_bounds_the_retained_statuses():
    core = make_core(PoolConfig("default", max=4, initial=4, autoscale=False), retention_max=2)
    ids = [core.submit(0, TaskSpec(i, key=f"k{i}"))[0] for i in range(3)]
    core.check_invariants()
    ds = dispatches(drain(core))
    for i, d in enumerate(ds):
        assert core.complete((i + 1) * S, d.lease)
        core.check_invariants()
    drain(core)
    assert len(core.retained) == 2
    # the oldest ended task is forgotten, its key released
    with pytest.raises(UnknownTask):
        core.status(ids[0])
    assert core.status("k1") == "succeeded" and core.status("k2") == "succeeded"
    new, dup = core.submit(4 * S, TaskSpec("again", key="k0"))
    assert dup is False and new not in ids
    assert core.submit(4 * S, TaskSpec("again", key="k2")) == (ids[2], True)
    core.check_invariants()


def test_duplicate_keys_inside_a_batch_name_the_first_task():
    core = one_slot()
    results = core.submit_batch(0, [TaskSpec("a", key="k"), TaskSpec("b"), TaskSpec("c", key="k")])
    core.check_invariants()
    (a, da), (b, db), (c, dc) = results
    assert (da, db, dc) == (False, False, True)
    assert c == a and b != a
    assert core.snapshot(0).totals["submitted"] == 2


def test_batch_with_an_existing_key_is_a_duplicate_for_that_entry():
    core = one_slot()
    tid = core.submit(0, TaskSpec("a", key="k"))[0]
    results = core.submit_batch(S, [TaskSpec("b"), TaskSpec("a2", key="k")])
    core.check_invariants()
    assert results[1] == (tid, True)
    assert results[0][1] is False


def test_terminal_event_carries_the_key():
    core = one_slot()
    tid = core.submit(0, TaskSpec("x", key="my-key"))[0]
    [d] = dispatches(drain(core))
    core.complete(S, d.lease)
    [e] = events(drain(core))
    assert (e.id, e.key) == (tid, "my-key")
    core.check_invariants()


def test_an_unknown_pool_is_refused_even_for_a_key_that_exists():
    # The plain-task fast path answered "duplicate" here while the planning
    # path raised UnknownPool (found by the differential test): both raise.
    core = make_core()
    core.submit(0, TaskSpec("first", key="k"))
    with pytest.raises(UnknownPool):
        core.submit(0, TaskSpec("again", key="k", pool="nope"))
    with pytest.raises(UnknownPool):
        core.submit(0, TaskSpec("again", key="k", pool="nope", tags={"planned": "yes"}))
    assert core.submit(0, TaskSpec("again", key="k"))[1] is True
