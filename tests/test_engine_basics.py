from cronoq.core import (
    Priority, TaskSpec, UnknownPool, InvalidTask,
)
from enginekit import S, dispatches, drain, events, make_core


def test_single_task_runs_and_succeeds():
    core = make_core()
    task_id, duplicate = core.submit(0, TaskSpec("x"))
    assert duplicate is False
    [d] = dispatches(drain(core))
    assert (d.task_id, d.attempt, d.payload) == (task_id, 1, "x")
    assert core.complete(S, d.lease)
    [e] = events(drain(core))
    assert (e.id, e.status, e.attempt, e.at) == (task_id, "succeeded", 1, 1.0)
    assert core.status(task_id) == "succeeded"
    core.check_invariants()


def test_higher_class_dispatched_first_then_fifo_within_class():
    core = make_core()
    first = core.submit(0, TaskSpec("busy"))[0]
    low = core.submit(0, TaskSpec("low", priority="low"))[0]
    normal_a = core.submit(0, TaskSpec("a"))[0]
    normal_b = core.submit(0, TaskSpec("b"))[0]
    crit = core.submit(0, TaskSpec("c", priority=Priority.CRITICAL))[0]
    order = []
    lease = dispatches(drain(core))[0].lease
    t = 0
    for _ in range(4):
        t += S // 100
        core.complete(t, lease)
        [d] = dispatches(drain(core))
        order.append(d.task_id)
        lease = d.lease
    assert order == [crit, normal_a, normal_b, low]
    assert first < low
    core.check_invariants()


def test_unknown_pool_and_bad_options_change_nothing():
    core = make_core()
    try:
        core.submit(0, TaskSpec("x", pool="nope"))
    except UnknownPool as exc:
        assert "nope" in str(exc)
    else:
        raise AssertionError("UnknownPool expected")
    for bad in (dict(timeout=float("nan")), dict(deadline_in=-1), dict(duration_hint=float("inf")),
                dict(key="a\x00b"), dict(deadline_in=1, deadline_at=5)):
        try:
            TaskSpec("x", **bad)
        except InvalidTask as exc:
            assert isinstance(exc, ValueError)
        else:
            raise AssertionError(f"InvalidTask expected for {bad}")
    assert core.snapshot(0).totals["submitted"] == 0
    core.check_invariants()


def test_a_tasks_tenant_is_in_its_info_and_events_live_and_retained():
    core = make_core(emit_transitions=True)
    task_id, _ = core.submit(0, TaskSpec("x", tenant="acme"))
    plain, _ = core.submit(0, TaskSpec("y"))
    assert core.info(task_id).tenant == "acme" and core.info(plain).tenant is None
    actions = drain(core)
    d = next(d for d in dispatches(actions) if d.task_id == task_id)
    assert {e.tenant for e in events(actions) if e.id == task_id} == {"acme"}
    assert core.complete(S, d.lease)
    [ended] = [e for e in events(drain(core)) if e.id == task_id]
    assert (ended.status, ended.tenant) == ("succeeded", "acme")
    assert core.info(task_id).tenant == "acme"   # retained after it ended
    core.check_invariants()
