"""One heap of timers for everything time-driven in the engine.

Entries are not removed when they stop mattering (a retry that was
cancelled, a timeout of an attempt that already ended): each carries a token
that its handler checks against the current state, and stale entries are
dropped when they reach the top. That keeps arming and disarming O(log n) and
O(1). So that stale entries (and the tasks they reference) do not pile up
until their time comes, the engine compacts the heap once they may be the
majority (``compact``, amortised O(1) per ended timer).
"""

from __future__ import annotations

import heapq
from typing import Any, Callable, Final

__all__ = ["TimerHeap", "Timer"]

Timer = tuple[int, int, int, Any, Any]   # (when, sequence, kind, obj, token)

# Timer kinds, handled by Core._fire.
RETRY: Final = 1           # backoff elapsed: obj is the entry, token its attempt number
TIMEOUT: Final = 2         # attempt timeout: obj is the entry, token the lease
LEASE: Final = 3           # lease TTL check: obj is the entry, token the lease
AWAIT: Final = 4           # unknown-key await timeout: obj is the entry
HOLD: Final = 5            # fixed start: re-evaluate the hold lead
START: Final = 6           # fixed start: the start time
MISS: Final = 7            # fixed start: start + tolerance
REFILL: Final = 8          # token bucket: enough tokens for the head waiter
AUTOSCALE: Final = 9       # autoscaler evaluation of a pool
RECUR: Final = 10          # recurring schedule: create the next occurrence


class TimerHeap:
    __slots__ = ("_heap", "_seq")

    def __init__(self) -> None:
        self._heap: list[Timer] = []
        self._seq = 0

    def push(self, when: int, kind: int, obj: object, token: object = None) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (when, self._seq, kind, obj, token))

    def next_time(self) -> int | None:
        heap = self._heap
        return heap[0][0] if heap else None

    def pop_due(self, now: int) -> Timer | None:
        """Pop the earliest timer if it is due, else return None."""
        heap = self._heap
        if heap and heap[0][0] <= now:
            return heapq.heappop(heap)
        return None

    def compact(self, gone: Callable[[int, Any, Any], bool]) -> None:
        """Drop every entry for which ``gone(kind, obj, token)`` is true. The
        list is changed in place: the engine keeps a reference to it."""
        heap = self._heap
        heap[:] = [t for t in heap if not gone(t[2], t[3], t[4])]
        heapq.heapify(heap)

    def __len__(self) -> int:
        return len(self._heap)

    def entries(self) -> list[Timer]:
        return self._heap
