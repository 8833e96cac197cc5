"""The reservation calendar of a pool: the capacity booked by fixed starts.

A fixed-start task books [start - tolerance, start + estimated duration +
tolerance) when it is admitted. At no instant may more than ``limit``
bookings overlap. Intervals are half-open, so back-to-back bookings do not
collide.
"""

from __future__ import annotations

import bisect
from typing import Container, Sequence

__all__ = ["Calendar"]


class Calendar:
    __slots__ = ("_items", "_by_id")

    def __init__(self) -> None:
        self._items: list[tuple[int, int, int]] = []   # (lo, hi, task id), sorted
        self._by_id: dict[int, tuple[int, int, int]] = {}

    def __len__(self) -> int:
        return len(self._items)

    def peak(self, lo: int, hi: int, extra: Sequence[tuple[int, int]] = (),
             exclude: Container[int] = ()) -> int:
        """The most bookings overlapping at one instant of [lo, hi), counting
        ``extra`` intervals too and leaving out the task ids in ``exclude``."""
        points = []
        items = self._items
        end = bisect.bisect_left(items, (hi,))
        for a, b, task_id in items[:end]:
            if b > lo and task_id not in exclude:
                points.append((max(a, lo), 1))
                points.append((b, -1))
        for a, b in extra:
            if a < hi and b > lo:
                points.append((max(a, lo), 1))
                points.append((b, -1))
        points.sort()  # at equal times, ends (-1) come before starts
        best = level = 0
        for _, step in points:
            level += step
            if level > best:
                best = level
        return best

    def fits(self, lo: int, hi: int, limit: int, extra: Sequence[tuple[int, int]] = ()) -> bool:
        return self.peak(lo, hi, extra) + 1 <= limit

    def next_start_after(self, now: int) -> int | None:
        """The earliest booking that begins after ``now``."""
        index = bisect.bisect_right(self._items, (now, float("inf")))
        return self._items[index][0] if index < len(self._items) else None

    def booked_before(self, hi: int) -> list[tuple[int, int, int]]:
        """The bookings that begin before ``hi``, earliest first."""
        items = self._items
        return items[:bisect.bisect_left(items, (hi,))]

    def add(self, lo: int, hi: int, task_id: int) -> None:
        item = (lo, hi, task_id)
        bisect.insort(self._items, item)
        self._by_id[task_id] = item

    def remove(self, task_id: int) -> None:
        item = self._by_id.pop(task_id, None)
        if item is not None:
            index = bisect.bisect_left(self._items, item)
            if index < len(self._items) and self._items[index] == item:
                del self._items[index]

    def __contains__(self, task_id: int) -> bool:
        return task_id in self._by_id
