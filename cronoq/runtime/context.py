"""What an executor learns about the attempt it runs."""

from __future__ import annotations

from typing import Callable

from .runner import Attempt

__all__ = ["TaskContext"]


class TaskContext:
    """The attempt an executor runs: ``(id, attempt)`` is a fencing token that
    never repeats for a task.

    Attributes are read lazily from the attempt, so creating a context costs
    almost nothing.
    """

    __slots__ = ("_attempt", "lease", "attempt", "_heartbeat")

    def __init__(self, attempt: Attempt, heartbeat: Callable[[int], bool]) -> None:
        self._attempt = attempt
        self.lease = attempt.lease
        self.attempt = attempt.attempt
        self._heartbeat = heartbeat

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

    def __repr__(self) -> str:
        return f"TaskContext(id={self.id}, attempt={self.attempt}, pool={self.pool!r}, kind={self.kind!r})"
