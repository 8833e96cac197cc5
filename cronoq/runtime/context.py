"""What an executor learns about the attempt it runs."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .runner import LocalRunner, ThreadRunner

__all__ = ["TaskContext"]


class TaskContext:
    """The attempt an executor runs: ``(id, attempt)`` is a fencing token that
    never repeats for a task.

    Attributes are read lazily from the scheduler's record of the task, so
    creating a context costs almost nothing.
    """

    __slots__ = ("_entry", "lease", "attempt", "_runner", "_cancelled", "_group")

    def __init__(self, entry, lease: int, attempt: int, runner: LocalRunner | ThreadRunner) -> None:
        self._entry = entry
        self.lease = lease
        self.attempt = attempt
        self._runner = runner
        self._cancelled = False
        self._group = entry.group

    @property
    def id(self) -> int:
        return self._entry.id

    @property
    def kind(self) -> str:
        return self._entry.kind

    @property
    def key(self) -> str | None:
        return self._entry.key

    @property
    def pool(self) -> str:
        return self._entry.pool.name

    @property
    def tags(self) -> dict[str, str]:
        spec = self._entry.spec
        return dict(spec.tags) if spec is not None and spec.tags else {}

    @property
    def timeout(self) -> float | None:
        """The per-attempt timeout in seconds, if any."""
        spec = self._entry.spec
        return None if spec is None or spec.timeout_ns is None else spec.timeout_ns / 1e9

    @property
    def deadline(self) -> float | None:
        """The task's deadline in Unix seconds, if any."""
        deadline = self._entry.deadline
        return None if deadline is None else deadline / 1e9

    @property
    def group(self) -> dict[str, str]:
        """The labels of the worker group this attempt runs in."""
        return dict(self._group.labels) if self._group is not None else {}

    def tag(self, name: str) -> str | None:
        return self.tags.get(name)

    @property
    def traceparent(self) -> str | None:
        """The W3C trace context captured at submission, if any."""
        return self.tags.get("traceparent")

    def heartbeat(self) -> bool:
        """Keep this attempt's lease alive (needed in pools with ``lease_ttl``).
        Safe from executor threads. Returns False once the attempt was given up."""
        if self._cancelled:
            return False
        return self._runner.heartbeat(self.lease)

    def is_cancelled(self) -> bool:
        """True once the scheduler gave up this attempt (cancel, timeout, lost
        lease, shutdown). Long-running sync executors should check it."""
        return self._cancelled

    def __repr__(self) -> str:
        return f"TaskContext(id={self.id}, attempt={self.attempt}, pool={self.pool!r}, kind={self.kind!r})"
