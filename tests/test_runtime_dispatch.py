"""Event-driven dispatch: no polling, no idle timers, freed slots reused at
once; recurring schedules and fixed starts in virtual time."""

import asyncio
import datetime

import pytest

import cronoq


def fixed(name, executor, capacity=1, **kwargs):
    return cronoq.Pool(name, executor, min=capacity, max=max(capacity, 1), initial=capacity,
                       autoscale=False, **kwargs)


def utc(ts):
    return datetime.datetime.fromtimestamp(ts, tz=datetime.timezone.utc)


def count_timer_fires(clock: cronoq.VirtualClock) -> list[int]:
    """[how many timers armed on ``clock`` from now on have fired] (the
    driver's, and an executor's sleeps). Through the clock: the driver may
    be compiled, and then its methods cannot be replaced."""
    fires = [0]
    call_at = clock.call_at

    def counting_call_at(when_ns, callback):
        def counted():
            fires[0] += 1
            callback()
        return call_at(when_ns, counted)

    clock.call_at = counting_call_at
    return fires


# ---------------------------------------------------------------- idle


@pytest.mark.asyncio
async def test_idle_scheduler_arms_no_timer_with_a_virtual_clock():
    clock = cronoq.VirtualClock()

    async def run(ctx, payload):
        await clock.sleep(payload)
        return payload

    fires = count_timer_fires(clock)
    async with cronoq.Scheduler([fixed("default", run, capacity=2)], clock=clock) as sched:
        # freshly started: nothing to wait for
        assert sched._driver.timer is None and clock.pending == 0
        handles = [await sched.submit(d, timeout=60.0) for d in (1.0, 2.0, 3.0)]
        # a timeout is pending: the driver sleeps exactly until the first one is due
        assert sched._driver.timer is not None
        await clock.advance(6.0)
        assert [await h for h in handles] == [1.0, 2.0, 3.0]
        assert sched._driver.timer is None
        assert clock.pending == 0
        fired_while_busy = fires[0]
        # an hour of idleness: nothing fires
        await clock.advance(3600.0)
        assert fires[0] == fired_while_busy
        assert sched._driver.timer is None and clock.pending == 0


@pytest.mark.asyncio
async def test_idle_scheduler_arms_no_timer_with_the_system_clock():
    async def run(ctx, payload):
        if payload == "flaky" and ctx.attempt == 1:
            raise cronoq.Retryable("again", retry_after=0.01)
        return payload

    pool = fixed("default", run, capacity=2, retry=cronoq.RetryPolicy(initial_backoff=0.001, jitter=False))
    async with cronoq.Scheduler([pool]) as sched:
        assert sched._driver.timer is None
        handles = [await sched.submit(p, timeout=30.0) for p in ("a", "flaky", "b")]
        assert [await h for h in handles] == ["a", "flaky", "b"]
        assert sched._driver.timer is None
        assert sched._driver.timer_at is None


@pytest.mark.asyncio
async def test_autoscaled_pool_goes_quiet_once_idle():
    # An autoscaling pool evaluates on its interval while there is activity,
    # then stops arming timers.
    clock = cronoq.VirtualClock()

    async def run(ctx, payload):
        return payload

    auto = cronoq.Pool("auto", run, min=1, max=4, autoscale=cronoq.AutoscaleConfig(interval=1.0))
    fires = count_timer_fires(clock)
    async with cronoq.Scheduler([auto], clock=clock) as sched:
        assert await (await sched.submit(1)) == 1
        # never more often than the autoscaling interval
        assert clock.next_timer() - clock.now() == pytest.approx(1.0)
        await clock.advance(300.0)
        assert 1 <= fires[0] <= 300
        settled = fires[0]
        assert clock.pending == 0 and sched._driver.timer is None
        await clock.advance(3600.0)
        assert fires[0] == settled


@pytest.mark.asyncio
async def test_driver_sleeps_until_the_next_wakeup_not_on_a_tick():
    clock = cronoq.VirtualClock()
    ran = []

    async def run(ctx, payload):
        ran.append((payload, clock.now()))
        return payload

    async with cronoq.Scheduler([fixed("default", run)], clock=clock) as sched:
        t0 = clock.now()
        later = await sched.submit("later", start_in=3600.0)
        # the next wake-up is the engine's own deadline (a fixed start is
        # prepared up to max_hold = 300 s ahead of its time), not a polling tick
        first = clock.next_timer()
        assert t0 + 3600.0 - 300.0 <= first <= t0 + 3600.0
        assert clock.pending == 1
        await clock.advance(first - t0 - 0.001)
        assert ran == []
        sooner = await sched.submit("sooner", start_in=60.0)
        await clock.advance(3600.0)
        assert await sooner == "sooner" and await later == "later"
        assert sched._driver.timer is None and clock.pending == 0
    assert ran == [("sooner", first - 0.001 + 60.0), ("later", t0 + 3600.0)]


# ---------------------------------------------------------------- freed slots


@pytest.mark.asyncio
async def test_freed_slot_starts_the_next_task_at_once_in_virtual_time():
    clock = cronoq.VirtualClock()
    starts = []

    async def run(ctx, payload):
        starts.append((payload, clock.now()))
        await clock.sleep(1.0)
        return payload

    async with cronoq.Scheduler([fixed("default", run)], clock=clock) as sched:
        t0 = clock.now()
        handles = [await sched.submit(i) for i in range(4)]
        await clock.advance(4.0)
        assert [await h for h in handles] == [0, 1, 2, 3]
    # no time passes between one task's end and the next one's start
    assert starts == [(0, t0), (1, t0 + 1.0), (2, t0 + 2.0), (3, t0 + 3.0)]


@pytest.mark.asyncio
async def test_freed_slot_starts_the_next_task_in_the_same_loop_iteration():
    loop = asyncio.get_running_loop()
    log = []
    release = asyncio.Event()
    started = asyncio.Event()

    async def run(ctx, payload):
        log.append(f"start {payload}")
        if payload == 0:
            started.set()
            await release.wait()
            # anything scheduled now runs only in a later loop iteration
            loop.call_soon(log.append, "next iteration")
            log.append("end 0")
        return payload

    async with cronoq.Scheduler([fixed("default", run)]) as sched:
        first = await sched.submit(0)
        second = await sched.submit(1)
        await asyncio.wait_for(started.wait(), 5)
        release.set()
        assert await first == 0 and await second == 1
    assert log.index("end 0") < log.index("start 1") < log.index("next iteration")


@pytest.mark.asyncio
async def test_freed_slot_of_a_sync_executor_is_reused_without_polling():
    clock = cronoq.VirtualClock()
    starts = []

    def run(ctx, payload):
        starts.append((payload, clock.now()))
        return payload

    async with cronoq.Scheduler([fixed("default", run)], clock=clock) as sched:
        handles = [await sched.submit(i) for i in range(5)]
        # completions arrive from threads; no virtual time has to pass for them
        assert [await h for h in handles] == list(range(5))
        assert clock.pending == 0 and sched._driver.timer is None
    assert [t for _, t in starts] == [clock.now()] * 5


@pytest.mark.asyncio
async def test_capacity_increase_dispatches_immediately():
    clock = cronoq.VirtualClock()
    starts = []

    async def run(ctx, payload):
        starts.append((payload, clock.now()))
        await clock.sleep(10.0)
        return payload

    pool = cronoq.Pool("default", run, min=1, max=3, initial=1, autoscale=False)
    async with cronoq.Scheduler([pool], clock=clock) as sched:
        t0 = clock.now()
        handles = [await sched.submit(i) for i in range(3)]
        await clock.advance(1.0)
        await sched.set_capacity("default", 3)
        await clock.advance(0)
        assert starts == [(0, t0), (1, t0 + 1.0), (2, t0 + 1.0)]
        await clock.advance(20.0)
        assert [await h for h in handles] == [0, 1, 2]


# ---------------------------------------------------------------- recurring


@pytest.mark.asyncio
async def test_add_recurring_runs_every_minute_in_virtual_time():
    clock = cronoq.VirtualClock()     # starts 2026-01-01T00:00:00Z
    runs = []

    async def run(ctx, payload):
        runs.append((ctx.key, payload, clock.now(), ctx.kind, ctx.tags))
        return payload

    async with cronoq.Scheduler([fixed("default", run)], clock=clock) as sched:
        t0 = clock.now()
        await sched.add_recurring("tick", "* * * * *", {"job": "tick"}, key="tick", kind="cron",
                                  tags={"src": "cron"})
        await clock.advance(300.0)
        assert await sched.remove_recurring("tick") is True
        assert await sched.remove_recurring("tick") is False
        await clock.advance(600.0)
        snap = await sched.snapshot()
        assert sched._driver.timer is None and clock.pending == 0
    assert [r[2] for r in runs] == [t0 + 60.0 * i for i in range(1, 6)]
    assert [r[0] for r in runs] == [f"tick@2026-01-01T00:0{i}:00Z" for i in range(1, 6)]
    assert all(r[1] == {"job": "tick"} and r[3] == "cron" and r[4]["src"] == "cron" for r in runs)
    assert snap.totals["succeeded"] == 5


@pytest.mark.asyncio
async def test_recurring_occurrences_can_be_looked_up_by_key():
    clock = cronoq.VirtualClock()

    async def run(ctx, payload):
        return f"ran {ctx.key}"

    async with cronoq.Scheduler([fixed("default", run)], clock=clock) as sched:
        await sched.add_recurring("hourly", "0 * * * *", key="report")
        await clock.advance(3600.0 + 60.0)
        key = "report@2026-01-01T01:00:00Z"
        assert await (await sched.handle(key)) == f"ran {key}"
        assert (await sched.info(key)).status == "succeeded"
        with pytest.raises(cronoq.UnknownTask):
            await sched.info("report@2026-01-01T02:00:00Z")
        await clock.advance(3600.0)
        assert (await sched.info("report@2026-01-01T02:00:00Z")).status == "succeeded"


@pytest.mark.asyncio
async def test_recurring_schedules_over_a_simulated_day():
    clock = cronoq.VirtualClock()      # 2026-01-01 is a Thursday
    runs = []

    async def run(ctx, payload):
        runs.append((payload, clock.now()))
        await clock.sleep(60.0)        # each occurrence takes a minute
        return payload

    # capacity 4 allows two reservations at once (reservable_fraction 0.5):
    # the hourly and the half-hourly job coincide every full hour
    pools = [fixed("default", run, capacity=4)]
    async with cronoq.Scheduler(pools, clock=clock) as sched:
        t0 = clock.now()
        await sched.add_recurring("business-hours", "0 9-17 * * *", "hourly", key="bh")
        await sched.add_recurring("half-hourly", "*/30 * * * *", "half", key="hh")
        await sched.add_recurring("six-fields", "30 15 6 * * *", "seconds", key="sec")
        await clock.advance(86400.0 + 120.0)
        snap = await sched.snapshot()
        next_day = clock.next_timer()
    hourly = [t for p, t in runs if p == "hourly"]
    half = [t for p, t in runs if p == "half"]
    seconds = [t for p, t in runs if p == "seconds"]
    assert [utc(t).hour for t in hourly] == list(range(9, 18))
    assert all(utc(t).minute == 0 and utc(t).second == 0 for t in hourly)
    assert half == [t0 + 1800.0 * i for i in range(1, 49)]
    assert [utc(t).strftime("%H:%M:%S") for t in seconds] == ["06:15:30"]
    assert snap.totals["succeeded"] == 9 + 48 + 1
    assert snap.totals["missed"] == 0 and snap.totals["recurring_conflicts"] == 0
    # the schedules go on: the next wake-up is early on the next day
    assert next_day is not None and next_day <= t0 + 86400.0 + 1800.0
    assert sched.running is False


@pytest.mark.asyncio
async def test_recurring_in_a_time_zone():
    clock = cronoq.VirtualClock()
    runs = []

    async def run(ctx, payload):
        runs.append(clock.now())
        return payload

    async with cronoq.Scheduler([fixed("default", run)], clock=clock) as sched:
        await sched.add_recurring("berlin-9am", "0 9 * * *", tz="Europe/Berlin")
        await clock.advance(2 * 86400.0)
    # 09:00 in Berlin in winter is 08:00 UTC
    assert [utc(t).strftime("%d %H:%M") for t in runs] == ["01 08:00", "02 08:00"]


@pytest.mark.asyncio
async def test_add_recurring_replaces_a_schedule_of_the_same_name():
    clock = cronoq.VirtualClock()
    runs = []

    async def run(ctx, payload):
        runs.append((payload, clock.now()))
        return payload

    async with cronoq.Scheduler([fixed("default", run)], clock=clock) as sched:
        t0 = clock.now()
        await sched.add_recurring("job", "* * * * *", "v1")
        await clock.advance(60.0)
        await sched.add_recurring("job", "*/10 * * * *", "v2")
        await clock.advance(1200.0)
    assert runs == [("v1", t0 + 60.0), ("v2", t0 + 600.0), ("v2", t0 + 1200.0)]


@pytest.mark.asyncio
@pytest.mark.parametrize("cron", ["not a cron", "61 * * * *", "* * * *"])
async def test_invalid_cron_is_refused(cron):
    async with cronoq.Scheduler([fixed("default", lambda ctx, p: p)]) as sched:
        with pytest.raises((ValueError, cronoq.SchedulerError)):
            await sched.add_recurring("bad", cron)
        assert await sched.remove_recurring("bad") is False


@pytest.mark.asyncio
async def test_invalid_recurring_options_are_refused():
    async with cronoq.Scheduler([fixed("default", lambda ctx, p: p)]) as sched:
        with pytest.raises(ValueError):
            await sched.add_recurring("bad\x00name", "* * * * *")
        with pytest.raises(ValueError):
            await sched.add_recurring("bad", "* * * * *", overlap="sometimes")
        with pytest.raises(cronoq.InvalidTask):
            await sched.add_recurring("bad", "* * * * *", timeout=-1)
        with pytest.raises(cronoq.UnknownPool):
            await sched.add_recurring("bad", "* * * * *", pool="nope")


@pytest.mark.asyncio
async def test_fixed_start_and_deadline_in_virtual_time():
    clock = cronoq.VirtualClock()
    runs = []

    async def run(ctx, payload):
        runs.append((payload, clock.now()))
        return payload

    async with cronoq.Scheduler([fixed("default", run)], clock=clock) as sched:
        t0 = clock.now()
        at = await sched.submit("at", start_at=utc(t0 + 120))
        in_ = await sched.submit("in", start_in=30.0)
        await clock.advance(29.0)
        assert runs == []
        await clock.advance(100.0)
        assert await in_ == "in" and await at == "at"
    assert runs == [("in", t0 + 30.0), ("at", t0 + 120.0)]


@pytest.mark.asyncio
async def test_long_backoff_runs_in_virtual_time():
    clock = cronoq.VirtualClock()
    attempts = []

    async def run(ctx, payload):
        attempts.append(clock.now())
        if ctx.attempt < 4:
            raise cronoq.Retryable("later")
        return "done"

    policy = cronoq.RetryPolicy(max_attempts=4, initial_backoff=600.0, multiplier=3.0, max_backoff=3600.0,
                                jitter=False)
    async with cronoq.Scheduler([fixed("default", run, retry=policy)], clock=clock) as sched:
        t0 = clock.now()
        handle = await sched.submit()
        await clock.advance(3 * 3600.0)
        assert await handle == "done"
    assert attempts == [t0, t0 + 600.0, t0 + 600.0 + 1800.0, t0 + 600.0 + 1800.0 + 3600.0]
