"""Checkpoints: what a staged task's attempts saved, for the attempts after them.

A checkpoint is runtime data kept beside outputs, not scheduling state: the
engine knows a task's declared ``stages`` (an option) and nothing more. The
book keeps, per task, the latest checkpoint of each stage (saving a stage
again replaces it), encoded with the scheduler's codec and held decoded, so
every reader sees what a restart would read back. With a store, a save is
committed (fenced by the leader's epoch) before the call returns; the book
is updated after that, so it never shows what the store does not hold.

Records of tasks the engine no longer knows (ended and past retention) are
swept out when the book has doubled since the last sweep, and on snapshots:
no cost on the dispatch path.
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Iterable

from ..core.errors import CheckpointError
from ..core.snapshot import Checkpoint
from ..core.types import MAX_STAGES, NAME_LIMIT, NS, check_length, check_name

if TYPE_CHECKING:
    from .runner import Attempt

__all__ = ["CheckpointBook", "DEFAULT_MAX_CHECKPOINT_BYTES"]

DEFAULT_MAX_CHECKPOINT_BYTES = 1024 * 1024

# (task id, stage, encoded data, attempt, saved at ns) -> committed
DurableSave = Callable[[int, str, bytes, int, int], Awaitable[None]]


class _Record:
    __slots__ = ("stages", "saved")

    def __init__(self, stages: tuple[str, ...] | None) -> None:
        self.stages = stages
        self.saved: dict[str, Checkpoint] = {}

    def ordered(self, stages: tuple[str, ...] | None = None) -> list[Checkpoint]:
        """The checkpoints in stage order (declared order, else first-save order)."""
        stages = stages or self.stages
        saved = dict(self.saved)   # a copy: a save may land meanwhile (reads come from any thread)
        if stages is None:
            return list(saved.values())
        return [saved[s] for s in stages if s in saved]


class CheckpointBook:
    """The checkpoints of one scheduler (see the module docstring). Every
    method but the read-only views runs on the scheduler's loop."""

    def __init__(self, *, codec: Any, max_bytes: int, now_ns: Callable[[], int],
                 is_live: Callable[[Attempt], bool], known: Callable[[int], bool],
                 on_saved: Callable[[Attempt, Checkpoint], None]) -> None:
        self.codec = codec
        self.max_bytes = max_bytes
        self._now_ns = now_ns
        self._is_live = is_live
        self._known = known
        self._on_saved = on_saved
        self.durable: DurableSave | None = None      # set when a store is configured
        self.loop: asyncio.AbstractEventLoop | None = None
        self.loop_thread: int | None = None
        self.records: dict[int, _Record] = {}
        self.saved = 0          # checkpoints saved since start
        self._swept_at = 0      # records after the last sweep
        self._swept_ns = 0      # the scheduler's time of the last sweep

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.loop_thread = threading.get_ident()

    # -- reads (any thread: they copy)

    def of(self, task_id: int, stages: tuple[str, ...] | None = None) -> list[Checkpoint]:
        """The checkpoints of a task, in stage order (``stages``: the declared ones, if known)."""
        record = self.records.get(task_id)
        return [] if record is None else record.ordered(stages)

    def stages_of(self, task_id: int) -> tuple[str, ...] | None:
        record = self.records.get(task_id)
        return None if record is None else record.stages

    def held(self) -> int:
        return sum(len(r.saved) for r in list(self.records.values()))

    # -- writes (on the loop)

    def prepare(self, attempt: Attempt, stage: object, value: Any) -> tuple[str, bytes, Any]:
        """The stage name, the encoded data and its decoded copy, or ``CheckpointError``."""
        stage = check_length(check_name(stage, "stage", error=CheckpointError), "stage", NAME_LIMIT,
                             error=CheckpointError)
        stages = attempt.stages
        record = self.records.get(attempt.id)
        if stages is not None and stage not in stages:
            raise CheckpointError(f"stage {stage!r} is not one of the stages task {attempt.id} declared "
                                  f"({', '.join(map(repr, stages))})")
        if stages is None and record is not None and stage not in record.saved \
                and len(record.saved) >= MAX_STAGES:
            raise CheckpointError(f"task {attempt.id} already holds checkpoints of {MAX_STAGES} stages, "
                                  f"the limit; stage {stage!r} was not saved")
        try:
            data = self.codec.encode(value)
        except Exception as exc:   # any codec failure names the stage
            raise CheckpointError(f"the checkpoint of stage {stage!r} cannot be encoded by the codec: "
                                  f"{type(exc).__name__}: {exc}") from None
        if not isinstance(data, (bytes, bytearray)):
            raise CheckpointError(f"the codec encoded the checkpoint of stage {stage!r} as "
                                  f"{type(data).__name__}, not bytes")
        data = bytes(data)
        if len(data) > self.max_bytes:
            raise CheckpointError(f"the checkpoint of stage {stage!r} is {len(data)} bytes encoded; the "
                                  f"limit is {self.max_bytes} bytes (Scheduler(max_checkpoint_bytes=...))")
        return stage, data, self.codec.decode(data)

    async def save(self, attempt: Attempt, stage: str, value: Any) -> Checkpoint:
        """Save ``value`` as the checkpoint of ``stage``; durable on return
        when a store is configured."""
        if not self._is_live(attempt):
            raise CheckpointError(f"attempt {attempt.attempt} of task {attempt.id} is over (it ended, was "
                                  f"cancelled or given up): stage {stage!r} was not saved")
        stage, data, decoded = self.prepare(attempt, stage, value)
        at_ns = self._now_ns()
        if self.durable is not None:
            await self.durable(attempt.id, stage, data, attempt.attempt, at_ns)
        checkpoint = Checkpoint(stage, decoded, at_ns / NS, attempt.attempt, len(data))
        record = self.records.get(attempt.id)
        if record is None:
            record = self.records[attempt.id] = _Record(attempt.stages)
            if len(self.records) > 2 * self._swept_at + 16:
                self.sweep()
        elif record.stages is None:
            record.stages = attempt.stages   # restored from the store, which keeps no stages
        record.saved[stage] = checkpoint
        self.saved += 1
        self._on_saved(attempt, checkpoint)
        return checkpoint

    def restore(self, rows: Iterable[tuple[int, str, bytes, int, int]]) -> int:
        """Checkpoints read back from the store at recovery; returns how many
        could be decoded (one that cannot is skipped: its stage runs again)."""
        count = 0
        for task_id, stage, data, attempt, at_ns in rows:
            try:
                decoded = self.codec.decode(data)
            except Exception:   # an undecodable checkpoint is as if never saved: the stage runs again
                continue
            record = self.records.get(task_id)
            if record is None:
                record = self.records[task_id] = _Record(None)
            record.saved[stage] = Checkpoint(stage, decoded, at_ns / NS, attempt, len(data))
            count += 1
        self._swept_at = len(self.records)
        return count

    def sweep(self, at_most_every: float = 0.0) -> int:
        """Forget the records of tasks the engine no longer knows; returns how
        many. With ``at_most_every`` (seconds of the scheduler's clock), only
        if the last sweep is that old (snapshots come often; a sweep reads
        every record)."""
        now = self._now_ns()
        if not self.records or (at_most_every and now - self._swept_ns < at_most_every * NS):
            return 0
        self._swept_ns = now
        gone = [task_id for task_id in self.records if not self._known(task_id)]
        for task_id in gone:
            del self.records[task_id]
        self._swept_at = len(self.records)
        return len(gone)

    def stats(self) -> dict[str, int]:
        return {"tasks": len(self.records), "held": self.held(), "saved": self.saved}
