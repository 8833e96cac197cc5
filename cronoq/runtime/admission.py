"""Admission and backpressure: the submit hooks, the admission listeners,
the one place the engine admits a task, and the lines of submitters waiting
for queue room (a full queue under the "wait" overflow policy).

Waiters queue per (pool, class) line, in arrival order: a submitter keeps
its place across retries, and one line's full bound does not hold up
another's. Each engine step wakes the first of every line (the driver's
pump calls ``wake_room`` while a line waits).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Any, Callable, Hashable, Sequence, TypeVar

from ..core.engine import Core
from ..core.errors import AdmissionError, QueueFull, SchedulerError
from ..core.types import TaskSpec
from .lifecycle import RUNNING, Guarded

__all__ = ["Admission", "AdmissionListener", "Turn"]

log = logging.getLogger("cronoq.scheduler")

# The wall clock, read without a Python frame on the hot paths when the
# scheduler runs on a SystemClock. A module attribute on purpose: freezegun
# replaces module attributes that are the real function, so frozen time is seen.
_wall_ns = time.time_ns

_T = TypeVar("_T")

# What an admission listener is told: (now_ns, tasks, results, error); see Scheduler.add_admission_listener.
AdmissionListener = Callable[[int, Sequence[TaskSpec], "Sequence[tuple[int, bool]] | None",
                              "AdmissionError | None"], None]


class Turn:
    """A submitter's place in line for queue room."""

    __slots__ = ("key", "future")

    def __init__(self, key: Hashable) -> None:
        self.key = key
        self.future: asyncio.Future[None] | None = None


class Admission:
    def __init__(self, driver: Guarded) -> None:
        self.driver = driver
        self.system_time = driver.system_time
        self.now_ns = driver.now_ns
        self.submit_hooks: list[Callable[[TaskSpec], TaskSpec]] = []
        self.listeners: list[AdmissionListener] = []
        self.room: dict[Any, deque[Turn]] = {}     # submitters waiting for queue room, per line

    def hooked(self, spec: TaskSpec) -> TaskSpec:
        for hook in self.submit_hooks:
            spec = hook(spec)
            if not isinstance(spec, TaskSpec):
                raise TypeError(f"a submit hook returned {type(spec).__name__}, not a cronoq.Task")
        return spec

    def admit_now(self, core: Core, spec: TaskSpec) -> tuple[int, bool] | None:
        """Admission, the one place it happens (under the lock): the answer,
        or None when a full queue asks the submitter to wait for room."""
        now = _wall_ns() if self.system_time else self.now_ns()
        try:
            result = core.submit(now, spec)
        except QueueFull as exc:
            if core.overflow_policy(spec.pool) != "wait" or exc.never:
                if self.listeners:
                    self.tell(now, (spec,), None, exc)
                raise
            return None
        except AdmissionError as exc:
            if self.listeners:
                self.tell(now, (spec,), None, exc)
            raise
        if self.listeners:
            self.tell(now, (spec,), (result,), None)
        return result

    def batch_attempt(self, specs: list[TaskSpec], line: list[Any]
                      ) -> Callable[[Core], tuple[list[TaskSpec], list[tuple[int, bool]]] | None]:
        """The admission of a batch, for ``with_room``: all or none. A full
        queue under "wait" moves ``line`` to the line of the task that did not fit."""

        def attempt(core: Core) -> tuple[list[TaskSpec], list[tuple[int, bool]]] | None:
            now = _wall_ns() if self.system_time else self.now_ns()
            try:
                results = core.submit_batch(now, specs)
            except QueueFull as exc:
                index = exc.index if exc.index is not None else 0
                if core.overflow_policy(specs[index].pool) != "wait" or exc.never:
                    if self.listeners:
                        self.tell(now, specs, None, exc)
                    raise
                line[0] = (specs[index].pool, specs[index].priority)
                return None
            except AdmissionError as exc:
                if self.listeners:
                    self.tell(now, specs, None, exc)
                raise
            if self.listeners:
                self.tell(now, specs, results, None)
            return specs, results

        return attempt

    def tell(self, now: int, specs: Sequence[TaskSpec], results: Sequence[tuple[int, bool]] | None,
             error: AdmissionError | None) -> None:
        for listener in self.listeners:
            try:
                listener(now, specs, results, error)
            except Exception:  # the admission stands whatever a listener does
                log.exception("an admission listener failed", extra={"action": "listener_error"})

    async def with_room(self, check: Callable[[], Core], attempt: Callable[[Core], _T | None], line: Any) -> _T:
        """Run ``attempt(check())`` (under the lock) until it fits; while it
        returns None (a full queue with the "wait" policy), wait for room in
        ``line``: that line's key, or a one-item list holding it when the
        attempt updates it (batches)."""
        driver = self.driver
        turn = None
        try:
            while True:
                with driver.lock:
                    result = attempt(check())
                    if result is not None:
                        return result
                    key = line[0] if isinstance(line, list) else line
                    if turn is None or turn.key != key:
                        if turn is not None:
                            self._leave_line(turn)
                        turn = Turn(key)
                        self.room.setdefault(key, deque()).append(turn)
                    loop = driver.life.loop
                    assert loop is not None
                    turn.future = loop.create_future()
                await turn.future
        finally:
            if turn is not None:
                with driver.lock:
                    self._leave_line(turn)
                    if driver.life.state is RUNNING:
                        self.wake_room()   # the next in line may fit now

    def _leave_line(self, turn: Turn) -> None:
        waiting = self.room.get(turn.key)
        if waiting is not None:
            try:
                waiting.remove(turn)
            except ValueError:
                pass
            if not waiting:
                del self.room[turn.key]

    def wake_room(self) -> None:
        # The first in each line retries; the next is woken once it is admitted.
        for waiting in self.room.values():
            future = waiting[0].future
            if future is not None and not future.done():
                future.set_result(None)

    def fail_waiters(self, error: SchedulerError) -> None:
        """No more room will come (shutdown, leadership lost): every waiting
        submitter gets ``error``."""
        turns = [t for waiting in self.room.values() for t in waiting]
        self.room.clear()
        for turn in turns:
            if turn.future is not None and not turn.future.done():
                turn.future.set_exception(error)
