"""The pytest plugin's fixtures (cronoq_pytest), used as a user's tests would:
native, blocking and legacy schedulers on one virtual clock."""

from __future__ import annotations

import pytest

import cronoq
from cronoq_compat import Task


@pytest.mark.asyncio
async def test_native_scheduler_on_the_virtual_clock(cronoq_scheduler, cronoq_clock):
    attempts = []

    async def flaky(ctx, x):
        attempts.append(cronoq_clock.now())
        if ctx.attempt == 1:
            raise cronoq.Retryable("once", retry_after=30)
        return x + 1

    async with cronoq_scheduler([cronoq.Pool("default", flaky)]) as sched:
        handle = await sched.submit(41, start_in=3600)
        await cronoq_clock.advance(3600)
        assert attempts == [cronoq_clock.now()]
        await cronoq_clock.advance(29)
        assert len(attempts) == 1
        await cronoq_clock.advance(1)
        assert await handle == 42
    assert [t - attempts[0] for t in attempts] == [0.0, 30.0]


def test_blocking_scheduler_and_advance(cronoq_blocking, cronoq_advance, cronoq_clock):
    sched = cronoq_blocking([cronoq.Pool("default", lambda ctx, x: (x, cronoq_clock.now()))])
    start = cronoq_clock.now()
    handle = sched.submit("tick", start_in=90)
    cronoq_advance(60)
    assert not handle.done()
    cronoq_advance(30)
    assert handle.result(timeout=10) == ("tick", start + 90)


def test_blocking_cron_runs_on_the_virtual_clock(cronoq_blocking, cronoq_advance):
    runs = []

    async def job(ctx, x):          # on the scheduler's loop: done within the advance
        runs.append(ctx.key)

    sched = cronoq_blocking([cronoq.Pool("default", job)])
    sched.add_recurring("hourly", "0 * * * *", None, key="hourly")
    cronoq_advance(3 * 3600)
    sched.snapshot()      # a round trip: every callback of the advance has run
    assert runs[:3] == ["hourly@2026-01-01T01:00:00Z", "hourly@2026-01-01T02:00:00Z",
                        "hourly@2026-01-01T03:00:00Z"]


def test_legacy_tasks_sleep_in_virtual_time(cronoq_legacy, cronoq_advance):
    legacy = cronoq_legacy(initial_workers=2, max_workers=2)
    legacy.submit(Task(id="long", duration=600.0))
    legacy.submit(Task(id="short", duration=5.0))
    cronoq_advance(10)
    legacy.native.snapshot()      # a round trip: the completions are counted
    assert legacy.completed_count == 1
    cronoq_advance(600)
    legacy.native.snapshot()      # a round trip: the completions are counted
    assert legacy.completed_count == 2


def test_advance_blocking_refuses_a_running_loop(cronoq_clock):
    import asyncio

    async def wrong() -> None:
        cronoq_clock.advance_blocking(1)

    with pytest.raises(RuntimeError, match="await clock.advance"):
        asyncio.run(wrong())


class TestAnotherStart:
    @pytest.fixture
    def cronoq_clock_start(self):
        return 1_800_000_000.0

    def test_the_start_can_be_overridden(self, cronoq_clock):
        assert cronoq_clock.now() == 1_800_000_000.0
