"""Bad input: a clear error naming the field, and nothing changes."""

import datetime as dt
import pickle

import pytest

from cronoq.core import (
    AdmissionError, Core, CoreConfig, CronoqError, Dep, InvalidTask, PoolConfig, PriorityConfig,
    RetryPolicy, TaskSpec, UnknownPool, UrgencyConfig,
)
from enginekit import S, dispatches, drain, make_core, raises_wrong_type

NAN, INF = float("nan"), float("inf")


def state(core):
    snap = core.snapshot(core.now)
    return (snap.totals, snap.live_tasks, snap.pending, snap.running, dict(core.keys),
            [(p.name, p.pending, p.busy) for p in snap.pools])


def busy_core():
    core = make_core(PoolConfig("default", max=2, initial=1, autoscale=False))
    core.submit(0, TaskSpec("running", key="running"))
    core.submit(0, TaskSpec("queued", key="queued"))
    drain(core)
    core.check_invariants()
    return core


@pytest.mark.parametrize("field", ["deadline_in", "duration_hint", "timeout", "start_in", "tolerance"])
@pytest.mark.parametrize("value", [NAN, INF, -INF, -1, -0.001, "5", True])
def test_bad_durations_name_the_field(field, value):
    with pytest.raises(InvalidTask, match=field) as info:
        TaskSpec("x", **{field: value})
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, AdmissionError)


@pytest.mark.parametrize("field", ["deadline_at", "start_at"])
@pytest.mark.parametrize("value", [NAN, INF, "tomorrow"])
def test_bad_absolute_times_name_the_field(field, value):
    with pytest.raises(InvalidTask, match=field):
        TaskSpec("x", **{field: value})


def test_absolute_times_accept_datetimes():
    aware = dt.datetime(2030, 1, 1, 12, 0, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    naive = dt.datetime(2030, 1, 1, 10, 0)
    a = TaskSpec("x", deadline_at=aware)
    b = TaskSpec("x", deadline_at=naive)
    c = TaskSpec("x", deadline_at=naive.replace(tzinfo=dt.timezone.utc).timestamp())
    assert a.deadline_at_ns == b.deadline_at_ns == c.deadline_at_ns


@pytest.mark.parametrize("relative, absolute", [("deadline_in", "deadline_at"), ("start_in", "start_at")])
def test_both_relative_and_absolute_time_are_rejected(relative, absolute):
    with pytest.raises(InvalidTask, match=f"{relative}.*{absolute}"):
        TaskSpec("x", **{relative: 5, absolute: 100})


@pytest.mark.parametrize("field", ["key", "kind", "pool", "tenant"])
def test_nul_in_names(field):
    with pytest.raises(InvalidTask, match=field):
        TaskSpec("x", **{field: "a\x00b"})


def test_nul_in_tags_and_labels():
    with pytest.raises(InvalidTask, match="tags"):
        TaskSpec("x", tags={"a\x00": "v"})
    with pytest.raises(InvalidTask, match="tags"):
        TaskSpec("x", tags={"a": "v\x00"})
    with pytest.raises(InvalidTask, match="labels"):
        TaskSpec("x", labels={"gpu": "a\x00"})
    with pytest.raises(InvalidTask, match="Dep"):
        Dep("a\x00")
    with pytest.raises(InvalidTask, match="after|Dep"):
        TaskSpec("x", after="p\x00")


@pytest.mark.parametrize("field", ["key", "kind", "pool"])
def test_empty_or_non_string_names(field):
    with pytest.raises(InvalidTask, match=field):
        TaskSpec("x", **{field: ""})
    with pytest.raises(InvalidTask, match=field):
        TaskSpec("x", **{field: 5})


def test_nul_in_pool_and_resource_configuration():
    with pytest.raises(ValueError, match="pool name"):
        PoolConfig("a\x00")
    from cronoq.core import ResourceConfig
    with pytest.raises(ValueError, match="resource name"):
        ResourceConfig.semaphore("g\x00", 1)


def test_bad_priorities_and_options():
    with pytest.raises(InvalidTask, match="priority"):
        TaskSpec("x", priority="urgent")
    with pytest.raises(InvalidTask, match="priority"):
        TaskSpec("x", priority=7)
    with pytest.raises(InvalidTask, match="on_miss"):
        TaskSpec("x", on_miss="later")
    with pytest.raises(InvalidTask, match="retry"):
        TaskSpec("x", retry={"max_attempts": 3})
    with pytest.raises(InvalidTask, match="resources"):
        TaskSpec("x", resources={"gpu": 0})
    with pytest.raises(InvalidTask, match="Dep on"):
        Dep("a", on="maybe")
    with pytest.raises(InvalidTask, match="Dep ref"):
        Dep(0)
    with pytest.raises(InvalidTask, match="Dep ref"):
        Dep(True)
    with pytest.raises(InvalidTask, match="deps"):
        TaskSpec("x", deps=["a"])


@pytest.mark.parametrize("kwargs, field", [
    (dict(max_attempts=0), "max_attempts"),
    (dict(max_attempts=-3), "max_attempts"),
    (dict(max_attempts=1.5), "max_attempts"),
    (dict(initial_backoff=NAN), "initial_backoff"),
    (dict(max_backoff=-1), "max_backoff"),
    (dict(multiplier=INF), "multiplier"),
    (dict(jitter="yes"), "jitter"),
])
def test_bad_retry_policy(kwargs, field):
    with pytest.raises(InvalidTask, match=field):
        RetryPolicy(**kwargs)


@pytest.mark.parametrize("kwargs, field", [
    (dict(min=-1), "min"),
    (dict(max=0), "max"),
    (dict(min=5, max=2), "min"),
    (dict(initial=20, max=10), "initial"),
    (dict(lease_ttl=0), "lease_ttl"),
    (dict(lease_ttl=NAN), "lease_ttl"),
    (dict(max_pending=-1), "max_pending"),
    (dict(max_pending={"urgent": 3}), "max_pending"),
    (dict(overflow="drop"), "overflow"),
    (dict(unknown_dependency="ignore"), "unknown_dependency"),
    (dict(await_timeout=-5), "await_timeout"),
    (dict(default_duration=INF), "default_duration"),
    (dict(reservable_fraction=1.5), "reservable_fraction"),
])
def test_bad_pool_configuration(kwargs, field):
    with pytest.raises(ValueError, match=field):
        PoolConfig("p", **kwargs)


@pytest.mark.parametrize("kwargs, field", [
    (dict(retention=-1), "retention"),
    (dict(retention_max=-1), "retention_max"),
    (dict(metrics_window=0), "metrics_window"),
    (dict(metrics_buckets=0), "metrics_buckets"),
    (dict(max_pending_total=-1), "max_pending_total"),
    (dict(max_hold=NAN), "max_hold"),
])
def test_bad_core_configuration(kwargs, field):
    with pytest.raises(ValueError, match=field):
        CoreConfig(**kwargs)


def test_bad_priority_and_urgency_configuration():
    with pytest.raises(ValueError, match="base"):
        PriorityConfig(base=(1, 2, 3))
    with pytest.raises(ValueError, match="aging_rate"):
        PriorityConfig(aging_rate=(1, 1, 1, NAN))
    with pytest.raises(ValueError, match="window"):
        UrgencyConfig(window=0)
    with pytest.raises(ValueError, match="peak"):
        UrgencyConfig(peak=-1)


def test_core_configuration_errors():
    with pytest.raises(ValueError, match="at least one pool"):
        Core(CoreConfig(), [])
    with pytest.raises(ValueError, match="duplicate pool"):
        make_core(PoolConfig("a"), PoolConfig("a"))


def test_unknown_pool_changes_nothing():
    core = busy_core()
    before = state(core)
    with pytest.raises(UnknownPool, match="nowhere"):
        core.submit(S, TaskSpec("x", pool="nowhere"))
    with pytest.raises(UnknownPool, match="nowhere"):
        core.submit(S, TaskSpec("x", pool="nowhere", key="k", deadline_in=5))
    with pytest.raises(UnknownPool, match="nowhere"):
        core.submit_batch(S, [TaskSpec("a"), TaskSpec("b", pool="nowhere")])
    core.check_invariants()
    assert state(core) == before


def test_submitting_something_else_than_a_task_changes_nothing():
    core = busy_core()
    before = state(core)
    with pytest.raises(InvalidTask):
        core.submit(S, "payload")
    with pytest.raises(InvalidTask) as info:
        core.submit_batch(S, [TaskSpec("a"), {"payload": 1}])
    assert info.value.index == 1
    core.check_invariants()
    assert state(core) == before


def test_bad_engine_call_arguments():
    core = busy_core()
    before = state(core)
    with pytest.raises(ValueError, match="capacity"):
        core.set_capacity(S, "default", -1)
    with raises_wrong_type("capacity"):
        core.set_capacity(S, "default", 1.5)
    with pytest.raises(ValueError, match="nowhere"):
        core.set_capacity(S, "nowhere", 1)
    with pytest.raises(TypeError):
        core.cancel(S, 1.5)
    core.check_invariants()
    assert state(core)[1:] == before[1:]


def test_errors_are_picklable_and_cronoq_errors():
    for exc in (InvalidTask("timeout must be finite"), UnknownPool("no pool", 3)):
        again = pickle.loads(pickle.dumps(exc))
        assert type(again) is type(exc)
        assert str(again) == str(exc)
        assert isinstance(again, CronoqError)


def test_valid_edge_values_are_accepted():
    spec = TaskSpec("x", deadline_in=0, duration_hint=0, timeout=0.5, tolerance=0, start_in=0)
    assert spec.deadline_in_ns == 0 and spec.timeout_ns == S // 2
    assert RetryPolicy(max_attempts=1, initial_backoff=0, max_backoff=0).backoff_ns(2) == 0
    core = make_core()
    core.submit(0, TaskSpec("x", deadline_in=0, duration_hint=0))
    core.check_invariants()
    assert len(dispatches(drain(core))) == 1
