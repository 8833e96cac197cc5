"""Drive the engine under virtual time.

A ``Simulator`` plays the driver's part without a clock or an event loop: it
runs every dispatched attempt for a duration chosen by a model function,
reports its outcome when that virtual time comes, and jumps straight to the
next completion or engine timer. Hours of schedule take milliseconds, and the
same seed gives the same run. Tests and the demo use it.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Callable

from .core import (
    NS, PERMANENT, RETRYABLE, SUCCESS, Core, Dispatch, StatusEvent,
)
from .core import actions as act

__all__ = ["Simulator", "Run", "Record"]


@dataclass
class Run:
    """What a simulated attempt does: run ``seconds``, then end with ``outcome``."""

    seconds: float
    outcome: str = SUCCESS
    message: str | None = None
    retry_after: float | None = None


@dataclass
class Record:
    """The history of one task in a simulation."""

    task_id: int
    pool: str = ""
    dispatches: list[float] = field(default_factory=list)   # virtual seconds
    attempts: list[int] = field(default_factory=list)
    status: str | None = None
    ended: float | None = None
    message: str | None = None


class Simulator:
    """Runs ``core`` with attempts modelled by ``model(dispatch) -> Run``."""

    def __init__(self, core: Core, model: Callable[[Dispatch], Run], *, start: int | None = None,
                 check: bool = False) -> None:
        self.core = core
        self.model = model
        self.now = core.now if start is None else start
        self.check = check
        self.records: dict[int, Record] = {}
        self.events: list[StatusEvent] = []
        self.scales: list[tuple[float, str, int]] = []
        self.aborts = 0
        self._running: list[tuple] = []     # heap (end, seq, lease)
        self._outcomes: dict[int, Run] = {}
        self._seq = 0
        self.steps = 0

    def record(self, task_id: int) -> Record:
        rec = self.records.get(task_id)
        if rec is None:
            rec = self.records[task_id] = Record(task_id)
        return rec

    def pump(self) -> None:
        """Act on every action the engine queued."""
        core = self.core
        while core.actions:
            raw = core.actions.popleft()
            kind = raw[0]
            if kind == act.DISPATCH:
                dispatch = Dispatch(raw[1], raw[2], raw[3])
                rec = self.record(dispatch.task_id)
                rec.pool = dispatch.pool
                rec.dispatches.append(self.now / NS)
                rec.attempts.append(dispatch.attempt)
                run = self.model(dispatch)
                self._seq += 1
                end = self.now + max(0, int(run.seconds * NS))
                heapq.heappush(self._running, (end, self._seq, dispatch.lease))
                self._outcomes[dispatch.lease] = run
            elif kind == act.ABORT:
                self.aborts += 1
                self._outcomes.pop(raw[1], None)
            elif kind == act.EVENT:
                event = act.event_from(raw)
                self.events.append(event)
                if event.status in ("succeeded", "failed", "dead_lettered", "cancelled", "skipped",
                                    "missed", "shed"):
                    rec = self.record(event.id)
                    rec.status = event.status
                    rec.ended = event.at
                    rec.message = event.message
            elif kind == act.SCALE:
                self.scales.append((self.now / NS, raw[1], raw[2]))

    def step(self, until: int | None = None) -> bool:
        """Move to the next completion or timer (not past ``until``); False when idle."""
        self.pump()
        running = self._running
        while running and running[0][2] not in self._outcomes:
            heapq.heappop(running)   # aborted attempts report nothing
        wake = self.core.next_wakeup()
        nxt = running[0][0] if running else None
        if wake is not None and (nxt is None or wake < nxt):
            nxt = wake
        if nxt is None or (until is not None and nxt > until):
            if until is not None and until > self.now:
                self.now = until
                self.core.advance(until)
                self.pump()
            return False
        self.now = max(self.now, nxt)
        if running and running[0][0] <= self.now:
            _, _, lease = heapq.heappop(running)
            run = self._outcomes.pop(lease)
            retry_after = None if run.retry_after is None else int(run.retry_after * NS)
            self.core.complete(self.now, lease, run.outcome, None, run.message, retry_after)
        else:
            self.core.advance(self.now)
        self.steps += 1
        if self.check:
            self.core.check_invariants()
        self.pump()
        return True

    def run(self, until: float | None = None, max_steps: int = 10_000_000) -> None:
        """Run until idle, or until ``until`` (virtual Unix seconds)."""
        limit = None if until is None else int(until * NS)
        for _ in range(max_steps):
            if not self.step(limit):
                return
        raise RuntimeError(f"simulation did not settle within {max_steps} steps")

    def submit(self, spec, at: float | None = None):
        """Submit a task at virtual time ``at`` (seconds; default now)."""
        if at is not None:
            self.advance_to(int(at * NS))
        result = self.core.submit(self.now, spec)
        self.pump()
        return result

    def advance_to(self, t: int) -> None:
        """Run everything due before ``t`` (ns), then stand at ``t``."""
        while self.step(t):
            pass
        if t > self.now:
            self.now = t
            self.core.advance(t)
            self.pump()


# Outcome names re-exported for models.
SUCCESS = SUCCESS
RETRYABLE = RETRYABLE
PERMANENT = PERMANENT
