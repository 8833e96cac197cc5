"""cronoq's pytest plugin: schedulers on a virtual clock, for tests.

Installing cronoq registers this plugin (entry point ``pytest11``). It only
adds fixtures, and imports cronoq when a test asks for one of them:

- ``cronoq_clock``: a fresh ``cronoq.VirtualClock`` (override the fixture
  ``cronoq_clock_start`` to start elsewhere than 2026-01-01T00:00Z);
- ``cronoq_advance``: ``advance(seconds)`` moves that clock from the test's
  thread, firing what falls due on the loops of the schedulers that armed it
  (``BlockingScheduler`` and legacy code); in async tests use
  ``await cronoq_clock.advance(seconds)``;
- ``cronoq_scheduler``: a factory of ``cronoq.Scheduler`` on the clock
  (``async with cronoq_scheduler(pools) as sched``);
- ``cronoq_blocking``: a factory of started ``cronoq.BlockingScheduler``
  on the clock, shut down after the test;
- ``cronoq_legacy``: a factory of started legacy
  ``ElasticPriorityScheduler`` on the clock, stopped after the test.

Schedulers made by the factories default to ``shutdown_grace=0``: a test
that leaves attempts running in virtual time does not wait for them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import pytest

if TYPE_CHECKING:
    from cronoq import BlockingScheduler, Pool, Resource, Scheduler, VirtualClock
    from cronoq_compat import ElasticPriorityScheduler

DEFAULT_START = 1_767_225_600.0   # 2026-01-01T00:00:00Z, as VirtualClock()


@pytest.fixture
def cronoq_clock_start() -> float:
    """Where ``cronoq_clock`` starts, in Unix seconds."""
    return DEFAULT_START


@pytest.fixture
def cronoq_clock(cronoq_clock_start: float) -> VirtualClock:
    """A virtual clock: time moves only when the test advances it."""
    from cronoq import VirtualClock

    return VirtualClock(start=cronoq_clock_start)


@pytest.fixture
def cronoq_advance(cronoq_clock: VirtualClock) -> Callable[[float], None]:
    """``advance(seconds)`` for blocking and legacy schedulers on ``cronoq_clock``."""
    return cronoq_clock.advance_blocking


@pytest.fixture
def cronoq_scheduler(cronoq_clock: VirtualClock) -> Callable[..., Scheduler]:
    """``cronoq_scheduler(pools, resources=None, **options)``: a ``Scheduler``
    on ``cronoq_clock``, not started (use ``async with``)."""
    from cronoq import Scheduler

    def make(pools: Sequence[Pool], resources: Sequence[Resource] | None = None,
             **options: Any) -> Scheduler:
        options.setdefault("shutdown_grace", 0.0)
        return Scheduler(pools, resources, clock=cronoq_clock, **options)

    return make


@pytest.fixture
def cronoq_blocking(cronoq_clock: VirtualClock) -> Iterator[Callable[..., BlockingScheduler]]:
    """``cronoq_blocking(pools, resources=None, **options)``: a started
    ``BlockingScheduler`` on ``cronoq_clock``, shut down after the test."""
    from cronoq import BlockingScheduler

    made: list[BlockingScheduler] = []

    def make(pools: Sequence[Pool], resources: Sequence[Resource] | None = None,
             **options: Any) -> BlockingScheduler:
        options.setdefault("shutdown_grace", 0.0)
        sched = BlockingScheduler(pools, resources, clock=cronoq_clock, **options)
        sched.start()
        made.append(sched)
        return sched

    yield make
    for sched in reversed(made):
        sched.shutdown()


@pytest.fixture
def cronoq_legacy(cronoq_clock: VirtualClock) -> Iterator[Callable[..., ElasticPriorityScheduler]]:
    """``cronoq_legacy(initial_workers=1, max_workers=4, **options)``: a
    started legacy ``ElasticPriorityScheduler`` on ``cronoq_clock`` (its
    tasks sleep in virtual time), stopped after the test."""
    from cronoq_compat import ElasticPriorityScheduler

    made: list[ElasticPriorityScheduler] = []

    def make(initial_workers: int = 1, max_workers: int = 4, **options: Any) -> ElasticPriorityScheduler:
        options.setdefault("shutdown_grace", 0.0)
        sched = ElasticPriorityScheduler(initial_workers, max_workers, clock=cronoq_clock, **options)
        sched.start()
        made.append(sched)
        return sched

    yield make
    for sched in reversed(made):
        sched.stop()
