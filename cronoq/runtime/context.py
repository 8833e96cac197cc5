"""What an executor learns about the attempt it runs."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Callable, Coroutine

from ..core.errors import SchedulerError
from ..core.snapshot import Checkpoint
from .runner import Attempt, Checkpoints

__all__ = ["TaskContext"]


class TaskContext:
    """The attempt an executor runs: ``(id, attempt)`` is a fencing token that
    never repeats for a task.

    Attributes are read lazily from the attempt, so creating a context costs
    almost nothing.
    """

    __slots__ = ("_attempt", "lease", "attempt", "_heartbeat", "_book")

    def __init__(self, attempt: Attempt, heartbeat: Callable[[int], bool],
                 checkpoints: Checkpoints | None = None) -> None:
        self._attempt = attempt
        self.lease = attempt.lease
        self.attempt = attempt.attempt
        self._heartbeat = heartbeat
        self._book = checkpoints

    @property
    def id(self) -> int:
        return self._attempt.id

    @property
    def kind(self) -> str:
        return self._attempt.kind

    @property
    def key(self) -> str | None:
        return self._attempt.key

    @property
    def pool(self) -> str:
        return self._attempt.pool

    @property
    def tags(self) -> dict[str, str]:
        return self._attempt.tags

    @property
    def timeout(self) -> float | None:
        """The per-attempt timeout in seconds, if any."""
        return self._attempt.timeout

    @property
    def deadline(self) -> float | None:
        """The task's deadline in Unix seconds, if any."""
        return self._attempt.deadline

    @property
    def group(self) -> dict[str, str]:
        """The labels of the worker group this attempt runs in."""
        return self._attempt.group

    def tag(self, name: str) -> str | None:
        return self._attempt.tags.get(name)

    @property
    def traceparent(self) -> str | None:
        """The W3C trace context captured at submission, if any."""
        return self._attempt.tags.get("traceparent")

    def heartbeat(self) -> bool:
        """Keep this attempt's lease alive (needed in pools with ``lease_ttl``).
        Safe from executor threads. Returns False once the attempt was given up."""
        if self._attempt.cancelled:
            return False
        return self._heartbeat(self.lease)

    def is_cancelled(self) -> bool:
        """True once the scheduler gave up this attempt (cancel, timeout, lost
        lease, shutdown). Long-running sync executors should check it."""
        return self._attempt.cancelled

    @property
    def abort_reason(self) -> str | None:
        """Why the scheduler gave this attempt up: "cancelled", "timeout",
        "lease expired" or "shutdown" (None while it is not given up)."""
        return self._attempt.abort_reason

    # -- checkpointed stages

    @property
    def stages(self) -> tuple[str, ...] | None:
        """The stages the task declared (``stages=`` at submission), or None."""
        return self._attempt.stages

    def _saved(self) -> list[Checkpoint]:
        book = self._book
        return [] if book is None else book.of(self._attempt.id, self._attempt.stages)

    @property
    def checkpoints(self) -> dict[str, Any]:
        """Stage -> the data of its latest checkpoint (earlier attempts' and
        this one's), in stage order."""
        return {c.stage: c.data for c in self._saved()}

    def checkpoint_info(self, stage: str) -> Checkpoint | None:
        """The latest checkpoint of ``stage`` (with its time and attempt), or None."""
        for c in self._saved():
            if c.stage == stage:
                return c
        return None

    @property
    def completed_stages(self) -> list[str]:
        """The stages with a checkpoint, in stage order."""
        return [c.stage for c in self._saved()]

    @property
    def resumed_from(self) -> str | None:
        """The last stage earlier attempts completed (this attempt resumes
        after it), or None when no earlier attempt saved a checkpoint."""
        earlier = [c.stage for c in self._saved() if c.attempt < self.attempt]
        return earlier[-1] if earlier else None

    def checkpoint(self, stage: str, data: Any = None) -> Coroutine[Any, Any, Checkpoint]:
        """``await ctx.checkpoint(stage, data)``: save ``data`` as the checkpoint
        of ``stage`` (replacing an earlier one). With a store it is committed
        before the await returns. ``CheckpointError`` names what is wrong (an
        undeclared stage, data too large or not encodable, an attempt that is
        over). From a plain function's thread, use ``checkpoint_from_thread``."""
        book = self._book
        if book is None:
            raise SchedulerError("checkpoints are not available to this attempt (its runner has none)")
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is None or running is not book.loop:
            raise SchedulerError("ctx.checkpoint() is for async executors on the scheduler's loop; "
                                 "a plain function calls ctx.checkpoint_from_thread(stage, data)")
        return book.save(self._attempt, stage, data)

    def checkpoint_from_thread(self, stage: str, data: Any = None,
                               timeout: float | None = None) -> Checkpoint:
        """``checkpoint`` for plain functions (executor threads): blocks until
        the checkpoint is saved (committed, with a store)."""
        book = self._book
        if book is None or book.loop is None:
            raise SchedulerError("checkpoints are not available to this attempt (its runner has none)")
        if threading.get_ident() == book.loop_thread:
            raise SchedulerError("checkpoint_from_thread() would block the scheduler's loop: "
                                 "an async executor uses await ctx.checkpoint(stage, data)")
        save = book.save(self._attempt, stage, data)
        try:
            future = asyncio.run_coroutine_threadsafe(save, book.loop)
        except RuntimeError:   # the loop is closed: the scheduler is gone
            save.close()
            raise SchedulerError("the scheduler stopped: the checkpoint was not saved") from None
        return future.result(timeout)

    def __repr__(self) -> str:
        return f"TaskContext(id={self.id}, attempt={self.attempt}, pool={self.pool!r}, kind={self.kind!r})"
