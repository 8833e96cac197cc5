"""Shared limits: semaphores and token buckets, with their parked waiters.

A task takes all the units it asks for at once or none. A task that cannot
is parked on the first resource that is short, off the dispatch queues, in
FIFO order (a task that was parked before keeps its earlier place). Waiters
are re-offered when units return (semaphore) or when enough tokens have
accumulated (token bucket: the engine arms one timer for that moment).
"""

from __future__ import annotations

import bisect
from collections import deque
from typing import Generic, Protocol, TypeVar

from .statuses import READY
from .types import ResourceConfig, Status

__all__ = ["Parked", "ResourceState"]


class Parking(Protocol):
    """What a resource reads of a parked task's extra state."""

    @property
    def park_seq(self) -> int | None: ...
    @property
    def parked_on(self) -> object: ...


class Parked(Protocol):
    """What a resource reads of a task (the engine's P): declared here so
    that this module needs nothing from the one that declares tasks."""

    @property
    def status(self) -> Status: ...
    @property
    def x(self) -> Parking | None: ...


P = TypeVar("P", bound=Parked)


def _PARK(e: Parked) -> int:   # (bisect key: the order of first parking)
    return e.x.park_seq   # type: ignore[union-attr,return-value]


class ResourceState(Generic[P]):
    __slots__ = ("name", "semaphore", "capacity", "available", "tokens", "rate", "last",
                 "waiters", "refill_at")

    def __init__(self, config: ResourceConfig, now: int) -> None:
        self.name = config.name
        self.semaphore = config.kind == "semaphore"
        self.capacity = config.capacity
        self.available: int = config.permits or 0   # (a bucket has tokens instead)
        self.tokens = float(config.burst or 0)   # a bucket starts full
        self.rate = (config.rate or 0.0) / 1e9    # tokens per ns
        self.last = now
        self.waiters: deque[P] = deque()
        self.refill_at: int | None = None          # time of the armed refill timer

    def level(self, now: int) -> float:
        """Units available now (refilling a bucket first)."""
        if self.semaphore:
            return self.available
        if now > self.last:
            tokens = self.tokens + (now - self.last) * self.rate
            self.tokens = tokens if tokens < self.capacity else float(self.capacity)
            self.last = now
        return self.tokens

    def take(self, units: int) -> None:
        if self.semaphore:
            self.available -= units
        else:
            self.tokens -= units

    def give(self, units: int) -> None:
        if self.semaphore:
            self.available += units

    def ready_in(self, units: float, now: int) -> int:
        """Nanoseconds until a bucket holds ``units`` tokens."""
        missing = units - self.level(now)
        if missing <= 0:
            return 0
        return max(1, int(missing / self.rate) + 1)

    def park(self, e: P) -> None:
        waiters = self.waiters
        seq = _PARK(e)
        if not waiters or _PARK(waiters[-1]) < seq:
            waiters.append(e)
        elif _PARK(waiters[0]) > seq:
            waiters.appendleft(e)
        else:
            waiters.insert(bisect.bisect_left(waiters, seq, key=_PARK), e)

    def head(self) -> P | None:
        """The first waiter still parked here, dropping stale ones."""
        waiters = self.waiters
        while waiters:
            e = waiters[0]
            x = e.x
            if e.status is READY and x is not None and x.parked_on is self:
                return e
            waiters.popleft()
        return None
