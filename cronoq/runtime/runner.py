"""The seam between the scheduler and whatever runs attempts.

The scheduler drives every pool's executor through one small interface, a
``Runner``: it *starts* an attempt and may *abort* it; at shutdown it
*closes* the runner and, after the grace, *cancels* what still runs. The
runner reports back through the callables of the ``RunnerLink`` it was made
with: the outcome of each attempt, heartbeats, an attempt it could not start
(given back without using an attempt), and, for runners whose capacity comes
from outside (remote workers), the slots of a worker group.

``abort`` may take a ``reason`` keyword (one of ``ABORT_REASONS``: why the
scheduler gave the attempt up); the scheduler passes it to runners whose
``abort`` accepts it, and calls ``abort(lease)`` on the others.

Every call in both directions happens on the scheduler's event loop thread;
a runner whose work ends elsewhere (threads, other processes, the network)
comes back to the loop with ``loop.call_soon_threadsafe``.

Implementations: ``LocalRunner`` (``async def`` executors, in
``cronoq.runtime.local``), ``ThreadRunner`` (plain functions on threads the
pool owns, in ``cronoq.runtime.threads``); the server's remote runner leases
attempts to workers over the network. A pool takes a runner with
``Pool(name, runner=factory)``, where ``factory(link)`` returns the runner.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import TYPE_CHECKING, Any, Callable, Coroutine, Protocol

from ..core.errors import Permanent, Retryable
from ..core.types import CLASSES, NS, PERMANENT, RETRYABLE

if TYPE_CHECKING:
    from ..core.snapshot import Checkpoint

__all__ = ["Attempt", "Checkpoints", "Runner", "RunnerLink", "RunnerFactory", "clean_message", "outcome_of",
           "ABORT_CANCELLED", "ABORT_TIMEOUT", "ABORT_LEASE_EXPIRED", "ABORT_SHUTDOWN", "ABORT_REASONS",
           "abort_reason", "aborter"]

_MAX_MESSAGE = 8192

# Why the scheduler gave an attempt up (``Runner.abort``'s ``reason``).
ABORT_CANCELLED = "cancelled"            # the task ended while it ran (cancelled): no retry follows
ABORT_TIMEOUT = "timeout"                # it ran past its timeout: a retryable failure
ABORT_LEASE_EXPIRED = "lease expired"    # no heartbeat within the lease TTL: a retryable failure
ABORT_SHUTDOWN = "shutdown"              # the scheduler stops, or lost the lead
ABORT_REASONS = (ABORT_CANCELLED, ABORT_TIMEOUT, ABORT_LEASE_EXPIRED, ABORT_SHUTDOWN)


class Attempt:
    """One attempt of a task, as a runner receives it.

    ``(id, attempt)`` never repeats for a task, and ``lease`` names the
    attempt in every report. The other fields are read from the scheduler's
    record of the task when asked for, so handing one over costs little.
    Read-only but for ``cancelled``, which the runner sets when the
    scheduler gives the attempt up (executors see it as
    ``ctx.is_cancelled()``), and ``abort_reason``, which it sets then to
    the reason it was given (``ctx.abort_reason``).
    """

    __slots__ = ("_entry", "id", "lease", "attempt", "payload", "_group", "cancelled", "abort_reason")

    def __init__(self, entry: Any, lease: int, attempt: int) -> None:
        self._entry = entry
        self.id: int = entry.id
        self.lease = lease
        self.attempt = attempt
        self.payload: Any = entry.payload
        self._group = entry.group
        self.cancelled = False
        self.abort_reason: str | None = None

    @property
    def pool(self) -> str:
        return str(self._entry.pool.name)

    @property
    def kind(self) -> str:
        return str(self._entry.kind)

    @property
    def key(self) -> str | None:
        key: str | None = self._entry.key
        return key

    @property
    def priority(self) -> str:
        """The task's class: critical, high, normal or low."""
        return CLASSES[self._entry.cls]

    @property
    def tenant(self) -> str | None:
        spec = self._entry.spec
        return None if spec is None else spec.tenant

    @property
    def tags(self) -> dict[str, str]:
        spec = self._entry.spec
        return dict(spec.tags) if spec is not None and spec.tags else {}

    @property
    def labels(self) -> dict[str, str]:
        """The worker labels the task requires."""
        spec = self._entry.spec
        return dict(spec.labels) if spec is not None and spec.labels else {}

    @property
    def group(self) -> dict[str, str]:
        """The labels of the worker group this attempt runs in."""
        return dict(self._group.labels) if self._group is not None else {}

    @property
    def timeout(self) -> float | None:
        """The per-attempt timeout in seconds, if any."""
        spec = self._entry.spec
        return None if spec is None or spec.timeout_ns is None else spec.timeout_ns / NS

    @property
    def deadline(self) -> float | None:
        """The task's deadline in Unix seconds, if any."""
        deadline = self._entry.deadline
        return None if deadline is None else deadline / NS

    @property
    def stages(self) -> tuple[str, ...] | None:
        """The stages the task declared, in order, or None."""
        spec = self._entry.spec
        return None if spec is None else spec.stages

    @property
    def submitted(self) -> float:
        """When the task was submitted, in Unix seconds."""
        return float(self._entry.submitted / NS)

    def __repr__(self) -> str:
        return f"Attempt(id={self.id}, attempt={self.attempt}, lease={self.lease}, pool={self.pool!r})"


Report = Callable[[Attempt, str, Any, "str | None", "int | None"], None]


class Checkpoints(Protocol):
    """The scheduler's checkpoints, as runners and contexts reach them
    (implemented by ``cronoq.runtime.checkpoints.CheckpointBook``)."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The scheduler's loop (saves run there)."""

    @property
    def loop_thread(self) -> int | None:
        """The thread of that loop."""

    def of(self, task_id: int, stages: tuple[str, ...] | None = None) -> list[Checkpoint]:
        """A task's checkpoints in stage order."""

    def save(self, attempt: Attempt, stage: str, value: Any) -> Coroutine[Any, Any, Checkpoint]:
        """Save a checkpoint for ``attempt`` (on the loop; durable on return with a store)."""


class RunnerLink:
    """What the scheduler gives a runner: its pool, its loop, and the
    callables it reports through (all of them to be called on that loop).

    - ``report(attempt, outcome, output, message, retry_after_ns)``: the
      attempt ended; ``outcome`` is ``"success"``, ``"retryable"``,
      ``"permanent"`` or ``"cancelled"`` (see ``outcome_of``);
    - ``heartbeat(lease) -> bool``: keep the attempt's lease alive (False
      once the attempt is no longer live);
    - ``not_started(lease, reason)``: the attempt could not start; it is
      given back to its queue without using an attempt;
    - ``set_capacity(labels, slots)``: the pool now has ``slots`` worker
      slots with exactly ``labels`` (for runners whose capacity is outside);
    - ``checkpoints``: the scheduler's checkpoint book (``Checkpoints``): the checkpoints
      earlier attempts saved, and ``save(attempt, stage, value)`` (None for
      a link made without one).
    """

    __slots__ = ("pool", "loop", "report", "heartbeat", "not_started", "set_capacity", "checkpoints")

    def __init__(self, pool: str, loop: asyncio.AbstractEventLoop, report: Report,
                 heartbeat: Callable[[int], bool], not_started: Callable[[int, str], None],
                 set_capacity: Callable[[dict[str, str], int], None], *,
                 checkpoints: Checkpoints | None = None) -> None:
        self.pool = pool
        self.loop = loop
        self.report = report
        self.heartbeat = heartbeat
        self.not_started = not_started
        self.set_capacity = set_capacity
        self.checkpoints = checkpoints


class Runner(Protocol):
    """The executor side of one pool (see the module docstring)."""

    def start(self, attempt: Attempt) -> None:
        """Run ``attempt``; report its outcome later through the link."""

    def abort(self, lease: int) -> bool:
        """The scheduler gave the attempt up (cancel, timeout, lost lease,
        shutdown): stop it if possible and do not report it. False if
        unknown here. A runner that wants to know why declares
        ``abort(self, lease, reason=ABORT_CANCELLED)`` (see ``aborter``)."""

    def close(self) -> None:
        """No new attempts will come; running ones go on."""

    def cancel_all(self) -> list[int]:
        """Shutdown, after the grace: give up every attempt. Returns the
        leases of attempts that never started (they are given back)."""

    @property
    def stray_threads(self) -> int:
        """Threads still running attempts that were given up (0 if none)."""


RunnerFactory = Callable[[RunnerLink], Runner]


def abort_reason(engine_reason: object) -> str:
    """The ``ABORT_REASONS`` entry for the reason of an engine's ABORT action
    ("timeout", "lease expired", or the status the task ended with)."""
    if engine_reason == ABORT_TIMEOUT or engine_reason == ABORT_LEASE_EXPIRED or engine_reason == ABORT_SHUTDOWN:
        return str(engine_reason)
    return ABORT_CANCELLED


def aborter(runner: Runner) -> Callable[[int, str], bool]:
    """``runner.abort`` as a callable of ``(lease, reason)``: the reason goes
    to runners whose ``abort`` takes a ``reason`` keyword (or ``**kwargs``);
    runners written before reasons existed are called with the lease only.
    A runner whose class sets ``abort_takes_reason = True`` is taken at its
    word: the package's runners do, as compiled there is no signature to read."""
    abort: Callable[..., bool] = runner.abort
    if getattr(runner, "abort_takes_reason", False):
        return abort
    try:
        parameters = inspect.signature(abort).parameters.values()
    except (TypeError, ValueError):   # no signature to read (a builtin, a C extension)
        parameters = None
    if parameters is not None and any(
            p.kind is p.VAR_KEYWORD or (p.name == "reason" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
            for p in parameters):
        def with_reason(lease: int, reason: str) -> bool:
            return abort(lease, reason=reason)
        return with_reason

    def lease_only(lease: int, reason: str) -> bool:
        return abort(lease)
    return lease_only


# ---------------------------------------------------------------- outcomes


def clean_message(text: object) -> str:
    """A failure message fit for events and stores: NUL replaced, 8 KiB at most."""
    message = str(text)
    if "\x00" in message:
        message = message.replace("\x00", "\ufffd")
    if len(message) > _MAX_MESSAGE:
        message = message[:_MAX_MESSAGE - 1] + "\u2026"
    return message


def _describe(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # a broken __str__ must not keep the attempt from ending
        text = "<the exception could not be printed>"
    return clean_message(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


def outcome_of(exc: BaseException) -> tuple[str, str | None, int | None]:
    """``(outcome, message, retry_after_ns)`` for an exception an executor
    raised: ``Retryable`` and ``Permanent`` as they say, anything else (a
    ``BaseException`` included) a retryable failure named after its type."""
    if isinstance(exc, Retryable):
        retry_after = None if exc.retry_after is None else max(0, int(exc.retry_after * NS))
        return RETRYABLE, clean_message(exc.message) if exc.message else None, retry_after
    if isinstance(exc, Permanent):
        return PERMANENT, clean_message(exc.message) if exc.message else None, None
    return RETRYABLE, _describe(exc), None
