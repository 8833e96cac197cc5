"""Core.dependents: the reverse lookup of live dependency edges."""

import pytest

from cronoq.core import Dep, PoolConfig, TaskSpec, UnknownTask
from enginekit import S, drain, make_core


def wide(**pool):
    return make_core(PoolConfig("default", autoscale=False, max=8, initial=8, **pool))


def lease_of(core, task_id):
    return next(lease for lease, e in core.running.items() if e.id == task_id)


def test_children_by_id_and_key_with_their_conditions():
    core = wide()
    a = core.submit(0, TaskSpec("a", key="a"))[0]
    b = core.submit(0, TaskSpec("b", after=a))[0]
    c = core.submit(0, TaskSpec("c", deps=[Dep("a", on="failure")]))[0]
    d = core.submit(0, TaskSpec("d", after=c))[0]
    core.check_invariants()
    assert core.dependents(a) == [(b, "success"), (c, "failure")]
    assert core.dependents("a") == core.dependents(a)
    assert core.dependents(c) == [(d, "success")]
    assert core.dependents(b) == []
    assert core.dependents(d) == []


def test_batch_edges_and_late_key_dependents_are_found():
    core = wide(unknown_dependency="await")
    waiting = core.submit(0, TaskSpec("w", after="later"))[0]
    x, y = (task_id for task_id, _ in core.submit_batch(0, [TaskSpec("x", key="later"), TaskSpec("y", after="later")]))
    core.check_invariants()
    assert sorted(core.dependents(x)) == sorted([(waiting, "success"), (y, "success")])


def test_an_ended_task_has_none_and_an_unknown_one_raises():
    core = wide()
    a = core.submit(0, TaskSpec("a"))[0]
    b = core.submit(0, TaskSpec("b", after=a))[0]
    drain(core)
    assert core.complete(S, lease_of(core, a))
    drain(core)
    assert core.status(a) == "succeeded"
    assert core.dependents(a) == []      # its edges were resolved: b runs
    assert core.status(b) == "running"
    with pytest.raises(UnknownTask):
        core.dependents(10 ** 9)
    with pytest.raises(UnknownTask):
        core.dependents("no-such-key")


def test_a_dependent_cancelled_first_stays_listed():
    core = wide()
    a = core.submit(0, TaskSpec("a", start_in=60))[0]
    b = core.submit(0, TaskSpec("b", after=a))[0]
    assert core.cancel(S, b)
    assert core.dependents(a) == [(b, "success")]
