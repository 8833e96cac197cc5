"""Bad input is refused at the call with a ValueError (``InvalidTask`` for
task options) that names what is wrong: never an OverflowError or a
RecursionError from deep inside, never an error only at start(), and never
a value silently ignored."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest

import cronoq
import cronoq_compat
from cronoq.core import CoreConfig, UrgencyConfig
from cronoq.store import InMemoryStore, MemoryDatabase
from enginekit import S, dispatches, drain

MAX_SECONDS = 100 * 365 * 86_400   # cronoq.core.types.MAX_SECONDS: the longest duration (100 years)
HUGE = (1e300, 1e20, MAX_SECONDS + 1)


def fixed(name="default", executor=None, capacity=1, **kwargs):
    async def echo(ctx, payload):
        return payload
    return cronoq.Pool(name, executor or echo, min=capacity, max=max(capacity, 1), initial=capacity,
                       autoscale=False, **kwargs)


def nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


# ---------------------------------------------------------------- durations and times


@pytest.mark.parametrize("field", ["deadline_in", "duration_hint", "timeout", "start_in", "tolerance"])
@pytest.mark.parametrize("value", HUGE)
def test_huge_durations_are_invalid_tasks_naming_the_field(field, value):
    with pytest.raises(cronoq.InvalidTask, match=f"{field} must be at most {MAX_SECONDS} seconds"):
        cronoq.Task("x", **{field: value})


def test_the_longest_duration_is_accepted():
    from cronoq.core.types import MAX_SECONDS as limit
    assert limit == MAX_SECONDS
    task = cronoq.Task("x", timeout=MAX_SECONDS, start_in=float(MAX_SECONDS))
    assert task.timeout_ns == task.start_in_ns == MAX_SECONDS * S


@pytest.mark.parametrize("field", ["deadline_at", "start_at"])
@pytest.mark.parametrize("value", [1e300, -1e300, 253_402_300_800, -62_135_596_801])
def test_absolute_times_beyond_the_years_a_datetime_holds_are_invalid(field, value):
    with pytest.raises(cronoq.InvalidTask, match=f"{field} must be a Unix time within the years 1 to 9999"):
        cronoq.Task("x", **{field: value})


def test_the_extreme_datetimes_are_accepted_as_unix_times_too():
    latest = dt.datetime(9999, 12, 31, 23, 59, 59, tzinfo=dt.timezone.utc)
    assert cronoq.Task("x", deadline_at=latest).deadline_at_ns == \
        cronoq.Task("x", deadline_at=253_402_300_799).deadline_at_ns


@pytest.mark.parametrize("make, field", [
    (lambda v: cronoq.RetryPolicy(initial_backoff=v), "initial_backoff"),
    (lambda v: cronoq.RetryPolicy(max_backoff=v), "max_backoff"),
    (lambda v: fixed(lease_ttl=v), "lease_ttl"),
    (lambda v: fixed(await_timeout=v, unknown_dependency="await"), "await_timeout"),
    (lambda v: fixed(default_duration=v), "default_duration"),
    (lambda v: cronoq.AutoscaleConfig(interval=v), "interval"),
    (lambda v: cronoq.AutoscaleConfig(drain_time=v), "drain_time"),
    (lambda v: cronoq.AutoscaleConfig(slo={"high": v}), "slo"),
    (lambda v: cronoq.AutoscaleConfig(reservation_horizon=v), "reservation_horizon"),
    (lambda v: cronoq.AutoscaleConfig(stabilization_window=v), "stabilization_window"),
    (lambda v: cronoq.AutoscaleConfig(cooldown=v), "cooldown"),
    (lambda v: UrgencyConfig(window=v), "window"),
    (lambda v: CoreConfig(retention=v), "retention"),
    (lambda v: CoreConfig(max_hold=v), "max_hold"),
    (lambda v: CoreConfig(metrics_window=v), "metrics_window"),
])
def test_huge_configured_durations_raise_value_error_naming_the_field(make, field):
    with pytest.raises(ValueError, match=f"{field}.* must be at most {MAX_SECONDS} seconds"):
        make(1e300)


def test_a_token_bucket_too_slow_to_ever_refill_is_refused():
    with pytest.raises(ValueError, match="rate must be at least one token per"):
        cronoq.Resource.token_bucket("api", rate=1e-300, burst=1)


def test_a_float_multiplier_to_a_large_power_is_capped_at_max_backoff():
    policy = cronoq.RetryPolicy(max_attempts=5000, initial_backoff=1.0, multiplier=2.5, max_backoff=60.0)
    assert policy.backoff_ns(2000) == 60 * S


def test_timeout_zero_is_refused():
    with pytest.raises(cronoq.InvalidTask, match="timeout must be > 0"):
        cronoq.Task("x", timeout=0)
    with pytest.raises(cronoq.InvalidTask, match="timeout must be > 0"):
        cronoq.Task("x", timeout=0.0)
    assert cronoq.Task("x", timeout=1e-9).timeout_ns == 1


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), 1e300, "5", True])
def test_retryable_refuses_a_retry_after_it_cannot_honour(value):
    with pytest.raises(ValueError, match="retry_after"):
        cronoq.Retryable("later", retry_after=value)


def test_retryable_accepts_zero_and_negative_retry_after():
    assert cronoq.Retryable("now", retry_after=0).retry_after == 0
    assert cronoq.Retryable("late already", retry_after=-3.0).retry_after == -3.0


@pytest.mark.asyncio
async def test_an_executor_asking_for_an_absurd_retry_after_fails_its_attempt_not_its_worker():
    async def run(ctx, payload):
        if payload == "absurd":
            raise cronoq.Retryable("come back much later", retry_after=1e300)
        return payload

    async with cronoq.Scheduler([fixed(executor=run)]) as sched:
        bad = await sched.submit("absurd", retry=cronoq.RetryPolicy.none())
        with pytest.raises(cronoq.TaskFailed) as info:
            await asyncio.wait_for(bad, 10)
        assert info.value.status == "dead_lettered" and "retry_after" in info.value.message
        # the one worker of the pool is still there
        assert await asyncio.wait_for(await sched.submit("next"), 10) == "next"


def test_the_engine_survives_a_huge_retry_after():
    from enginekit import make_core
    core = make_core()
    core.submit(0, cronoq.Task("x", retry=cronoq.RetryPolicy(max_attempts=2)))
    [d] = dispatches(drain(core))
    core.complete(S, d.lease, "retryable", message="later", retry_after_ns=MAX_SECONDS * S)
    core.check_invariants()
    assert core.status(d.task_id) == "retrying"


# ---------------------------------------------------------------- nested payloads


@pytest.mark.asyncio
async def test_a_payload_too_deep_for_the_store_is_an_invalid_task():
    deep = nested(100_000)
    async with cronoq.Scheduler([fixed()], store=InMemoryStore()) as sched:
        with pytest.raises(cronoq.InvalidTask, match="payload is nested too deeply"):
            await sched.submit(deep)
        with pytest.raises(cronoq.InvalidTask, match="payload is nested too deeply") as info:
            await sched.submit_batch([cronoq.Task("fine"), cronoq.Task(deep)])
        assert info.value.index == 1
        with pytest.raises(cronoq.InvalidTask, match="payload"):
            await sched.add_recurring("deep", "* * * * *", deep)
        assert (await sched.snapshot()).totals["submitted"] == 0
        assert await (await sched.submit(nested(50))) == nested(50)


@pytest.mark.asyncio
async def test_without_a_store_nesting_does_not_matter():
    # Payloads are passed by reference in memory: nothing walks them.
    deep = nested(100_000)
    async with cronoq.Scheduler([fixed()]) as sched:
        assert await (await sched.submit(deep)) is deep


@pytest.mark.asyncio
async def test_an_output_too_deep_for_the_store_is_delivered_and_the_worker_lives_on():
    deep = nested(100_000)

    async def run(ctx, payload):
        return deep if payload == "deep" else payload

    database = MemoryDatabase()
    async with cronoq.Scheduler([fixed(executor=run)], store=InMemoryStore(database)) as sched:
        handle = await sched.submit("deep")
        assert await asyncio.wait_for(handle, 10) is deep
        assert await asyncio.wait_for(await sched.submit("next"), 10) == "next"
    assert handle.id not in database.outputs   # not stored (a warning says so)


# ---------------------------------------------------------------- the scheduler's options


def test_duplicate_resource_names_are_refused_at_construction():
    resources = [cronoq.Resource.semaphore("db", 1), cronoq.Resource.token_bucket("db", rate=1, burst=1)]
    for make in (cronoq.Scheduler, cronoq.BlockingScheduler):
        with pytest.raises(ValueError, match="duplicate resource name 'db'"):
            make([fixed()], resources)
        with pytest.raises(ValueError, match="resources must be cronoq.Resource objects"):
            make([fixed()], ["db"])


def test_a_store_that_is_not_a_store_is_refused_at_construction(tmp_path):
    path = str(tmp_path / "x.db")
    for make in (cronoq.Scheduler, cronoq.BlockingScheduler):
        with pytest.raises(ValueError, match=r"not a path: use store=cronoq.SqliteStore\("):
            make([fixed()], store=path)
        with pytest.raises(ValueError, match="object lacks retention_ns, commit_timeout, acquire_leadership, recover, commit"):
            make([fixed()], store=object())
    assert not (tmp_path / "x.db").exists()


@pytest.mark.parametrize("option", [dict(emit_transitions=True), dict(max_pending_total=10), dict(seed=7)])
def test_options_that_config_would_override_are_refused_beside_it(option):
    [name] = option
    for make in (cronoq.Scheduler, cronoq.BlockingScheduler):
        with pytest.raises(ValueError, match=f"{name} would be ignored beside config="):
            make([fixed()], config=CoreConfig(), **option)
    with pytest.raises(ValueError, match="config must be a cronoq.core.CoreConfig"):
        cronoq.Scheduler([fixed()], config={"seed": 7})


@pytest.mark.asyncio
async def test_config_settings_are_honoured():
    config = CoreConfig(emit_transitions=True, max_pending_total=1)
    async with cronoq.Scheduler([fixed(capacity=0, overflow="reject")], config=config) as sched:
        async with sched.events() as events:
            await sched.enqueue("a")
            with pytest.raises(cronoq.QueueFull):
                await sched.enqueue("b")
            event = await asyncio.wait_for(events.__anext__(), 5)
        assert event.status == "ready"   # a transition: emitted only with emit_transitions


# ---------------------------------------------------------------- capacity


@pytest.mark.asyncio
async def test_set_capacity_above_the_pool_max_is_refused_naming_it():
    pool = cronoq.Pool("default", lambda ctx, p: p, min=0, max=4, initial=1, autoscale=False)
    async with cronoq.Scheduler([pool]) as sched:
        with pytest.raises(ValueError, match="capacity 5 would give pool 'default' 5 workers, above its max"):
            await sched.set_capacity("default", 5)
        await sched.set_group_capacity("default", {"gpu": "a100"}, 3)
        # the max bounds all the pool's workers, labelled or not
        with pytest.raises(ValueError, match=r"3 in its other worker groups\), above its max of 4"):
            await sched.set_capacity("default", 2)
        with pytest.raises(ValueError, match="above its max of 4"):
            await sched.set_group_capacity("default", {"zone": "eu"}, 1)
        snap = (await sched.snapshot()).pool("default")
        assert snap.capacity == 4
        assert sorted((sorted(g.labels.items()), g.capacity) for g in snap.groups) == \
            [([], 1), ([("gpu", "a100")], 3)]
        await sched.set_group_capacity("default", {"gpu": "a100"}, 1)
        await sched.set_capacity("default", 3)
        assert (await sched.snapshot()).pool("default").capacity == 4


# ---------------------------------------------------------------- the legacy shim


def test_compat_task_dependencies_none_means_none():
    task = cronoq_compat.Task(id="a", duration=1.0, dependencies=None)
    assert task.dependencies == ()
    with pytest.raises(ValueError, match="dependencies must be a list of task ids"):
        cronoq_compat.Task(id="a", duration=1.0, dependencies=5)


@pytest.mark.parametrize("field", ["duration", "fixed_start", "deadline"])
def test_compat_task_huge_times_are_value_errors(field):
    with pytest.raises(ValueError, match=f"Task {field} must"):
        cronoq_compat.Task(id="a", **{"duration": 1.0, field: 1e300})


def test_compat_submit_with_a_huge_deadline_is_a_value_error_not_an_overflow():
    with cronoq_compat.ElasticPriorityScheduler(initial_workers=1, max_workers=1) as sched:
        task = cronoq_compat.Task(id="a", duration=0.0)
        object.__setattr__(task, "deadline", 1e300)   # past the Task's own check: the engine refuses too
        with pytest.raises(ValueError, match="deadline_at"):
            sched.submit(task)
