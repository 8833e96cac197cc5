"""cronoq under freezegun, the way users' test suites freeze and move time.

Scheduling time (fixed starts, deadlines, cron, retry backoff) follows the
frozen clock and moves when the test moves it; protective time (legacy task
sleeps, shutdown grace, waits with a timeout) stays real, so nothing hangs.
Waits here are event-driven with generous real-time limits that only matter
when a test fails.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from freezegun import freeze_time

import cronoq
from cronoq_compat import ElasticPriorityScheduler, Task

FROZEN = "2026-01-01 09:00:00"
FROZEN_TS = 1_767_258_000.0
LIMIT = 10.0          # real seconds: only reached when something hangs

pytestmark = pytest.mark.timeout(60)


def wait_until(predicate, limit: float = LIMIT) -> None:
    """Poll ``predicate`` in real time (time.sleep is never frozen)."""
    end = _real_now() + limit
    while not predicate():
        if _real_now() > end:
            raise AssertionError("the condition did not come true in real time")
        time.sleep(0.002)


def _real_now() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


@pytest.fixture(params=[False, True], ids=["frozen", "ticking"])
def tick(request):
    return request.param


# ---------------------------------------------------------------- legacy code


def test_legacy_task_completes_and_stop_returns_under_frozen_time(tick):
    with freeze_time(FROZEN, tick=tick):
        sched = ElasticPriorityScheduler(max_workers=2)
        sched.start()
        sched.submit(Task(id="a", duration=0.01))
        wait_until(lambda: sched.completed_count == 1)
        sched.submit(Task(id="long", duration=3600.0))     # "runs" one real hour
        sched.stop(wait=True, timeout=0.2)                 # the timeout is real time
        assert sched.completed_count == 1


def test_legacy_fixed_start_follows_the_frozen_clock(tick):
    with freeze_time(FROZEN, tick=tick) as frozen:
        sched = ElasticPriorityScheduler(max_workers=2)
        sched.start()
        try:
            sched.submit(Task(id="later", duration=0.0, fixed_start=time.time() + 3600))
            sched.submit(Task(id="now", duration=0.0))
            wait_until(lambda: sched.completed_count == 1)
            assert sched.native.info("later").status == "scheduled"
            frozen.tick(3600)
            wait_until(lambda: sched.completed_count == 2)
            assert sched.get_metrics().fixed_start_hit_rate == 1.0
        finally:
            sched.stop()


def test_legacy_deadlines_are_judged_on_the_frozen_clock():
    with freeze_time(FROZEN) as frozen:
        sched = ElasticPriorityScheduler(initial_workers=1, max_workers=1, min_workers=1)
        sched.start()
        try:
            sched.submit(Task(id="met", duration=0.0, deadline=time.time() + 60))
            wait_until(lambda: sched.completed_count == 1)
            sched.submit(Task(id="missed", duration=0.0, deadline=time.time() + 60,
                              fixed_start=time.time() + 120))
            frozen.tick(121)
            wait_until(lambda: sched.completed_count == 2)
            assert sched.get_metrics().deadline_hit_rate == 0.5
        finally:
            sched.stop()


# ---------------------------------------------------------------- BlockingScheduler


def test_blocking_sync_and_async_handlers_that_wait(tick):
    def sync_work(ctx, x):
        time.sleep(0.05)
        return x

    async def async_work(ctx, x):
        await asyncio.sleep(0.05)
        return x

    pools = [cronoq.Pool("sync", sync_work), cronoq.Pool("async", async_work)]
    with freeze_time(FROZEN, tick=tick):
        with cronoq.BlockingScheduler(pools) as sched:
            assert sched.submit(1, pool="sync").result(timeout=LIMIT) == 1
            assert sched.submit(2, pool="async").result(timeout=LIMIT) == 2


def test_blocking_cron_fires_when_frozen_time_passes_the_minute(tick):
    fired = threading.Event()
    keys = []

    def job(ctx, payload):
        keys.append(ctx.key)
        fired.set()

    with freeze_time(FROZEN, tick=tick) as frozen:
        with cronoq.BlockingScheduler([cronoq.Pool("default", job)]) as sched:
            sched.add_recurring("minutely", "0 * * * * *", None, key="m")
            assert not fired.wait(0.1)
            frozen.tick(60)
            assert fired.wait(LIMIT)
            assert keys[0] == "m@2026-01-01T09:01:00Z"
            fired.clear()
            frozen.move_to("2026-01-01 09:05:00")     # the missed ones run late, once
            assert fired.wait(LIMIT)


def test_blocking_retry_backoff_follows_the_frozen_clock():
    attempts = []
    retried = threading.Event()

    def flaky(ctx, x):
        attempts.append(time.time())
        if ctx.attempt == 1:
            raise cronoq.Retryable("later", retry_after=30)
        retried.set()
        return x

    with freeze_time(FROZEN) as frozen:
        with cronoq.BlockingScheduler([cronoq.Pool("default", flaky)]) as sched:
            handle = sched.submit("x")
            assert not retried.wait(0.2)         # 30 frozen seconds have not passed
            frozen.tick(30)
            assert handle.result(timeout=LIMIT) == "x"
            assert sched.info(handle.id).attempt == 2


def test_blocking_shutdown_grace_is_real_time():
    release = threading.Event()

    def stuck(ctx, x):
        release.wait(LIMIT)

    with freeze_time(FROZEN):
        sched = cronoq.BlockingScheduler([cronoq.Pool("default", stuck)], shutdown_grace=0.1)
        sched.start()
        handle = sched.submit(None)
        wait_until(lambda: sched.info(handle.id).status == "running")
        sched.shutdown()                         # the grace passes although time is frozen
        release.set()
        with pytest.raises(cronoq.TaskFailed) as failed:
            handle.result(timeout=LIMIT)
        assert failed.value.status == "shutdown"


def test_blocking_handle_result_timeout_is_real_time():
    release = threading.Event()

    def stuck(ctx, x):
        release.wait(LIMIT)

    with freeze_time(FROZEN):
        with cronoq.BlockingScheduler([cronoq.Pool("default", stuck)], shutdown_grace=0) as sched:
            handle = sched.submit(None)
            with pytest.raises(TimeoutError):
                handle.result(timeout=0.05)
            release.set()


# ---------------------------------------------------------------- the asyncio Scheduler


@pytest.mark.parametrize("real_asyncio", [True, False], ids=["real_asyncio", "frozen_loop"])
def test_native_fixed_start_and_deadline_follow_the_frozen_clock(real_asyncio):
    seen = []

    async def work(ctx, x):
        seen.append((x, time.time(), ctx.deadline))
        return x

    async def main(frozen) -> None:
        async with cronoq.Scheduler([cronoq.Pool("default", work)]) as sched:
            later = await sched.submit("later", start_in=600, deadline_in=900)
            now = await sched.submit("now")
            assert await now == "now"
            assert (await sched.info(later.id)).status == "scheduled"
            frozen.tick(600)
            assert await asyncio.wait_for(later, LIMIT) == "later"

    with freeze_time(FROZEN, real_asyncio=real_asyncio) as frozen:
        asyncio.run(main(frozen))
    assert seen == [("now", FROZEN_TS, None), ("later", FROZEN_TS + 600, FROZEN_TS + 900)]


def test_native_retry_backoff_under_a_ticking_clock():
    async def flaky(ctx, x):
        if ctx.attempt == 1:
            raise cronoq.Retryable("again", retry_after=0.05)
        return x

    async def main() -> None:
        async with cronoq.Scheduler([cronoq.Pool("default", flaky)]) as sched:
            handle = await sched.submit(7)
            assert await asyncio.wait_for(handle, LIMIT) == 7

    with freeze_time(FROZEN, tick=True):
        asyncio.run(main())


def test_native_shutdown_grace_is_real_time_on_a_frozen_loop():
    release = threading.Event()

    def stuck(ctx, x):
        release.wait(LIMIT)

    async def main() -> None:
        sched = cronoq.Scheduler([cronoq.Pool("default", stuck)], shutdown_grace=0.1)
        await sched.start()
        handle = await sched.submit(None)
        while (await sched.info(handle.id)).status != "running":
            await asyncio.sleep(0)
        await sched.shutdown()
        release.set()
        with pytest.raises(cronoq.TaskFailed):
            await handle

    with freeze_time(FROZEN):
        asyncio.run(main())


# ---------------------------------------------------------------- stores


RIVAL = """
import asyncio, sys
import cronoq

async def main():
    rival = cronoq.SqliteStore(sys.argv[1], lease_ttl=1.5, lease_renew=0.1, lock_poll=0.05)
    try:
        await asyncio.wait_for(rival.acquire_leadership(), 4.5)   # three lease lengths
        print("took the lease")
    except asyncio.TimeoutError:
        print("the leader kept it")
    await rival.close()

asyncio.run(main())
"""


@pytest.mark.parametrize("frozen_at", ["2026-01-01 09:00:00", "2031-01-01 09:00:00"], ids=["past", "future"])
def test_a_frozen_clock_never_delays_the_lease_renewal(tmp_path, frozen_at):
    # The leader runs under freeze_time, its loop's clock frozen too (no
    # real_asyncio); a rival process, on real time, tries to take the lease.
    import subprocess
    import sys

    path = tmp_path / "lease.db"

    async def main() -> None:
        store = cronoq.SqliteStore(path, lease_ttl=1.5, lease_renew=0.1)
        async with cronoq.Scheduler([cronoq.Pool("default", lambda ctx, x: x)], store=store) as sched:
            rival = await asyncio.get_running_loop().run_in_executor(None, lambda: subprocess.run(
                [sys.executable, "-c", RIVAL, str(path)], capture_output=True, text=True, timeout=60))
            assert rival.stdout.strip() == "the leader kept it", rival.stdout + rival.stderr
            handle = await sched.submit(21)
            assert await asyncio.wait_for(handle, LIMIT) == 21    # still leading, still committing
        await store.close()

    with freeze_time(frozen_at):
        asyncio.run(main())
