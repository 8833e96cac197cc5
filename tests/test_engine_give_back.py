"""Core.give_back: a dispatch the driver could not start uses no attempt."""

import pytest

from cronoq.core import COMPILED, Core, CoreConfig, PoolConfig, ResourceConfig, RetryPolicy, TaskSpec
from cronoq.core.persist import RestoredTask
from enginekit import S, dispatches, drain, events, make_core, raises_wrong_type


def one_slot(**kw):
    return PoolConfig("default", max=1, initial=1, autoscale=False, **kw)


def persisted(actions):
    return [a.mutation for a in actions if type(a).__name__ == "Persist"]


def test_a_given_back_attempt_is_not_counted_and_the_task_runs_again_at_once():
    core = make_core(one_slot(retry=RetryPolicy(max_attempts=1)))
    tid = core.submit(0, TaskSpec("x"))[0]
    [d] = dispatches(drain(core))
    assert d.attempt == 1
    assert core.give_back(1 * S, d.lease) is True
    core.check_invariants()
    [again] = dispatches(drain(core))
    assert (again.task_id, again.attempt) == (tid, 1)    # max_attempts=1 and it still runs
    assert core.complete(2 * S, again.lease)
    info = core.info(tid)
    assert (info.status, info.attempt) == ("succeeded", 1)
    totals = core.snapshot(2 * S).totals
    assert totals["failed"] == 0 and totals["retries"] == 0


def test_a_stale_lease_is_not_given_back():
    core = make_core(one_slot())
    core.submit(0, TaskSpec("x"))
    [d] = dispatches(drain(core))
    assert core.complete(1 * S, d.lease)
    assert core.give_back(1 * S, d.lease) is False
    core.check_invariants()


def test_give_back_with_a_delay_waits_and_keeps_the_attempt_count():
    core = make_core(one_slot())
    tid = core.submit(0, TaskSpec("x"))[0]
    other = core.submit(0, TaskSpec("y"))[0]
    [d] = dispatches(drain(core))
    assert d.task_id == tid
    assert core.give_back(0, d.lease, delay_ns=2 * S, message="no thread") is True
    core.check_invariants()
    [d2] = dispatches(drain(core))
    assert d2.task_id == other          # the freed slot serves the next task meanwhile
    assert core.info(tid).status == "retrying"
    assert core.info(tid).attempt == 0
    assert core.complete(1 * S, d2.lease)
    drain(core)
    core.advance(2 * S)
    core.check_invariants()
    [d3] = dispatches(drain(core))
    assert (d3.task_id, d3.attempt) == (tid, 1)


def test_give_back_while_stopped_leaves_the_task_queued():
    core = make_core(one_slot())
    tid = core.submit(0, TaskSpec("x"))[0]
    [d] = dispatches(drain(core))
    core.stop_dispatching()
    assert core.give_back(0, d.lease)
    core.check_invariants()
    assert dispatches(drain(core)) == []
    assert core.info(tid).status == "ready"
    assert core.info(tid).attempt == 0


def test_give_back_returns_semaphore_units_and_keeps_the_place_in_line():
    core = make_core(PoolConfig("default", max=2, initial=2, autoscale=False),
                     resources=[ResourceConfig("gpu", "semaphore", permits=1)])
    a = core.submit(0, TaskSpec("a", resources={"gpu": 1}))[0]
    core.submit(0, TaskSpec("b", resources={"gpu": 1}))
    [d] = dispatches(drain(core))
    assert d.task_id == a
    core.stop_dispatching()
    assert core.give_back(0, d.lease)
    core.check_invariants()                 # the unit is free again (checked by the invariants)
    assert core.resources["gpu"].available == 1


def test_give_back_is_persisted_so_that_recovery_does_not_count_it():
    config = dict(persist=True)
    core = make_core(one_slot(retry=RetryPolicy(max_attempts=1)), **config)
    tid = core.submit(0, TaskSpec("x"))[0]
    acts = drain(core)
    [d] = dispatches(acts)
    assert ("status", tid, "running", 1, 0, None) in persisted(acts)
    assert core.give_back(0, d.lease)
    acts = drain(core)
    rows = [m for m in persisted(acts) if m[0] == "status"]
    assert rows[0][:4] == ("status", tid, "ready", 0)
    # A restart from what was stored runs the task with its only attempt.
    spec = TaskSpec("x")
    fresh = Core(CoreConfig(persist=True), [one_slot(retry=RetryPolicy(max_attempts=1))], [])
    fresh.restore(1 * S, [RestoredTask(tid, "default", spec, 0, "ready", 0, None, None)])
    [d2] = dispatches(drain(fresh))
    assert d2.attempt == 1


def test_give_back_emits_ready_with_transitions():
    core = make_core(one_slot(), emit_transitions=True)
    tid = core.submit(0, TaskSpec("x"))[0]
    drain(core)
    [lease] = list(core.running)
    core.stop_dispatching()
    core.give_back(0, lease)
    assert [e.status for e in events(drain(core)) if e.id == tid] == ["ready"]


def test_give_back_validates_the_delay():
    core = make_core(one_slot())
    core.submit(0, TaskSpec("x"))
    [d] = dispatches(drain(core))
    # (Compiled, an int argument is converted at the call: True arrives as 1.)
    for bad in (-1,) if COMPILED else (-1, True):
        with pytest.raises(ValueError, match="delay_ns"):
            core.give_back(0, d.lease, delay_ns=bad)
    with raises_wrong_type("delay_ns"):
        core.give_back(0, d.lease, delay_ns=1.5)
    core.check_invariants()
