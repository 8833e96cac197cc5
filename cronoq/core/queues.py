"""The ready queues of one pool and the choice of the next task.

Per class there is a FIFO lane (a deque sorted by task id, which is
submission order) and a deadline heap ordered by latest start time; in a pool
with fair sharing, a heap ordered by start-time-fair-queuing tag replaces the
lane. Within a class every task ages at the same rate, so a lane's head is its
best task; choosing the next task compares at most eight heads and never
rescans the backlog.

Entries leave a queue in two ways: popped by ``pick`` (or by the shedder), or
lazily, when they end while queued (cancelled, shed): ``discard`` fixes the
counts at once and the stale entry is dropped when it reaches a head.
"""

from __future__ import annotations

import bisect
import heapq
from collections import deque
from typing import Generic, Iterator, TypeVar, cast

from .._mypyc import mypyc_attr
from .statuses import READY
from .types import PriorityConfig, Status, TaskSpec, UrgencyConfig

__all__ = ["Queued", "ReadyQueues"]


# (subclasses in Python: the tests' fake entries)
@mypyc_attr(allow_interpreted_subclasses=True)
class Queued:
    """What the queues read of a task: the base of the engine's Entry, which
    sets these in its constructor. Declared here so that this module needs
    nothing from the one that declares tasks; a base class rather than a
    Protocol so that compiled code reads them as native attributes (a
    Protocol's attributes are a generic lookup each)."""

    __slots__ = ("id", "cls", "submitted", "est", "lst", "tag", "status", "spec")

    id: int
    cls: int
    submitted: int
    est: int
    lst: int | None
    tag: float | None   # the fair-share start tag, written here
    status: Status
    spec: TaskSpec | None


E = TypeVar("E", bound=Queued)


def _ID(e: Queued) -> int:   # (bisect key)
    return e.id


# (subclasses in Python: the differential test's scoring queues)
@mypyc_attr(allow_interpreted_subclasses=True)
class ReadyQueues(Generic[E]):
    __slots__ = ("lanes", "deadlines", "fair", "count", "total", "base", "rate", "cap",
                 "u_peak", "u_window", "u_rate", "u_cap", "weights", "vtime", "finish")

    def __init__(self, priority: PriorityConfig, urgency: UrgencyConfig, fair: bool,
                 weights: dict[str, float]) -> None:
        self.lanes: list[deque[E]] = [deque(), deque(), deque(), deque()]
        self.deadlines: list[list[tuple[int, int, E]]] = [[], [], [], []]
        self.fair: list[list[tuple[float, int, E]]] | None = [[], [], [], []] if fair else None
        self.count = [0, 0, 0, 0]       # live entries per class
        self.total = 0
        # Scores in points; times in ns, so per-ns rates.
        self.base = priority.base
        self.rate = tuple(r / 1e9 for r in priority.aging_rate)
        self.cap = priority.age_cap
        self.u_peak = urgency.peak
        self.u_window = int(urgency.window * 1e9)
        self.u_rate = urgency.overdue_rate / 1e9
        self.u_cap = urgency.overdue_cap
        # (a task without a tenant is looked up as None, and weighs 1)
        self.weights = cast("dict[str | None, float]", weights)
        self.vtime = [0.0, 0.0, 0.0, 0.0]
        self.finish: list[dict[str | None, float]] = [{}, {}, {}, {}]

    # ------------------------------------------------------------ insertion

    def push(self, e: E) -> None:
        """A task becomes ready; a task seen before returns to its place."""
        c = e.cls
        count = self.count
        count[c] = count[c] + 1   # (not +=: compiled, that is a generic in-place add on a list item)
        self.total += 1
        if e.lst is not None:
            heapq.heappush(self.deadlines[c], (e.lst, e.id, e))
        elif self.fair is not None:
            if e.tag is None:
                e.tag = self._start_tag(c, e)
            heapq.heappush(self.fair[c], (e.tag, e.id, e))
        else:
            lane = self.lanes[c]
            if not lane or lane[-1].id < e.id:
                lane.append(e)
            elif lane[0].id > e.id:
                lane.appendleft(e)
            else:
                lane.insert(bisect.bisect_left(lane, e.id, key=_ID), e)

    def _start_tag(self, c: int, e: E) -> float:
        tenant = e.spec.tenant if e.spec is not None else None
        finish = self.finish[c]
        start: float = max(self.vtime[c], finish.get(tenant, 0.0))
        finish[tenant] = start + 1.0 / self.weights.get(tenant, 1.0)
        if len(finish) > 4096:
            # Tenants whose finish tag is behind the virtual time hold no credit.
            v = self.vtime[c]
            self.finish[c] = {t: f for t, f in finish.items() if f > v}
        return start

    def discard(self, e: E) -> None:
        """A queued task ended without being picked; its entry goes stale."""
        self.count[e.cls] -= 1
        self.total -= 1

    # ------------------------------------------------------------ choice

    def urgency(self, e: E, now: int) -> float:
        # (only a task with a deadline has urgency)
        slack = e.lst - now   # type: ignore[operator]
        horizon = e.est if e.est > self.u_window else self.u_window
        if slack >= horizon:
            return 0.0
        if slack >= 0:
            return float(self.u_peak * (1.0 - slack / horizon))
        overdue = -slack * self.u_rate
        return float(self.u_peak + (overdue if overdue < self.u_cap else self.u_cap))

    def score(self, e: E, now: int) -> float:
        c = e.cls
        age = (now - e.submitted) * self.rate[c]
        cap = self.cap[c]
        s: float = self.base[c] + (age if age < cap else cap)
        if e.lst is not None:
            s += self.urgency(e, now)
        return s

    def _head(self, c: int) -> tuple[E | None, E | None]:
        """The live head of class c's FIFO (or fair) queue and of its deadline heap."""
        if self.fair is None:
            lane = self.lanes[c]
            while lane and lane[0].status is not READY:
                lane.popleft()
            first = lane[0] if lane else None
        else:
            fair = self.fair[c]
            while fair and fair[0][2].status is not READY:
                heapq.heappop(fair)
            first = fair[0][2] if fair else None
        heap = self.deadlines[c]
        while heap and heap[0][2].status is not READY:
            heapq.heappop(heap)
        return first, (heap[0][2] if heap else None)

    def take(self, now: int) -> E | None:
        """Remove and return the task with the highest effective score, or None.

        Ties go to the more important class, then to the older task.
        """
        count = self.count
        total = self.total
        if not total:
            return None
        c = 0
        while not count[c]:
            c += 1
        if count[c] == total and not self.deadlines[c]:
            # One class holds all the work and none of it has a deadline: its
            # queue head is the best task, no score needed.
            count[c] = count[c] - 1   # (not -=, as in push)
            self.total = total - 1
            if self.fair is None:
                lane = self.lanes[c]
                e = lane.popleft()
                while e.status is not READY:
                    e = lane.popleft()
                return e
            heap = self.fair[c]
            e = heapq.heappop(heap)[2]
            while e.status is not READY:
                e = heapq.heappop(heap)[2]
            if e.tag > self.vtime[c]:   # type: ignore[operator]
                self.vtime[c] = e.tag   # type: ignore[assignment]
            return e
        best = self._best(now)
        if best is not None:
            self.pop(best)
        return best

    def _best(self, now: int) -> E | None:
        count = self.count
        best = None
        best_score = 0.0
        for c in (0, 1, 2, 3):
            if not count[c]:
                continue
            if best is not None and not self.deadlines[c] and best_score > self.base[c] + self.cap[c]:
                continue  # without urgency this class cannot catch up
            first, dl = self._head(c)
            for e in (first, dl):
                if e is None:
                    continue
                s = self.score(e, now)
                if best is None or s > best_score or (s == best_score and e.cls == best.cls
                                                      and e.id < best.id):
                    best = e
                    best_score = s
        return best

    def peek(self, now: int) -> E | None:
        """The task ``take`` would return, left in place."""
        if not self.total:
            return None
        return self._best(now)

    def pop(self, e: E) -> None:
        """Remove ``e``, a live queue head (as ``peek`` returns), from its queue."""
        c = e.cls
        self.count[c] -= 1
        self.total -= 1
        if e.lst is not None:
            heapq.heappop(self.deadlines[c])
        elif self.fair is not None:
            heapq.heappop(self.fair[c])
            if e.tag > self.vtime[c]:   # type: ignore[operator]
                self.vtime[c] = e.tag   # type: ignore[assignment]
        else:
            self.lanes[c].popleft()

    def live_entries(self) -> Iterator[E]:
        """Every live queued entry (for invariant checks and shedding)."""
        for c in range(4):
            for e in self.lanes[c]:
                if e.status is READY:
                    yield e
            for _, _, e in self.deadlines[c]:
                if e.status is READY:
                    yield e
            if self.fair is not None:
                for _, _, e in self.fair[c]:
                    if e.status is READY:
                        yield e
