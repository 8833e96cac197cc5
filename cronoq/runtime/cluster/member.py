"""The member's side of a cluster: this process's runners of its own
executors, the attempts the leader leased to them through the store, and
their outcomes, heartbeats and give-backs on the way back."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from typing import Any, Callable, Coroutine, Iterable, Protocol

from ... import realtime
from ...core.snapshot import Checkpoint
from ...core.types import RETRYABLE, SUCCESS
from ...store.cluster import Incoming, Outgoing
from .. import operations as ops
from ..durability import EncodedPayloads
from ..runner import Attempt, Checkpoints, Runner, RunnerLink, aborter
from .hub import Hub
from .wire import RemoteEntry

__all__ = ["MemberSide", "MemberCheckpoints"]

log = logging.getLogger("cronoq.scheduler")


class MemberSide:
    def __init__(self, cluster: Hub, pools: list[str], heartbeat: float) -> None:
        self.cluster = cluster
        self.pools = pools
        self.heartbeat = heartbeat
        self.serving = True                        # takes attempts (False once leaving)
        self.runners: dict[str, Runner] = {}
        self.aborts: dict[str, Callable[[int, str], bool]] = {}   # each runner's abort(lease, reason)
        self.running: dict[int, Attempt] = {}      # lease -> attempt leased here by another process
        # task -> (lease, its checkpoints), for the attempts in running
        self._remote_saved: dict[int, tuple[int, dict[str, Checkpoint]]] = {}
        self.book: Any = None                      # this process's checkpoint book (member_link)
        self.own: dict[int, RunnerLink] = {}       # leases this process's own engine placed here -> its link
        self.outcomes: list[tuple[int, str, bytes | None, str | None, int | None]] = []
        self.returns: list[int] = []
        self.beats: set[int] = set()
        self.last_beat = 0.0

    def member_link(self, pool: str, make: Callable[[RunnerLink], Runner],
                    checkpoints: Checkpoints | None = None) -> Runner:
        """Make this process's runner of ``pool`` (``make(link)``) with a link
        that reports to the engine that placed each attempt: this process's
        own (when it leads) or the leader's, through the store. ``checkpoints``:
        this process's checkpoint book (it serves the attempts of its own
        engine, when it leads)."""
        loop = self.cluster.loop
        assert loop is not None
        reach: Checkpoints | None = None
        if checkpoints is not None:
            self.book = checkpoints
            reach = MemberCheckpoints(_Reach(self), checkpoints)
        link = RunnerLink(pool, loop, self._report, self._heartbeat, self._not_started,
                          lambda labels, slots: None, checkpoints=reach)
        runner = make(link)
        self.runners[pool] = runner
        self.aborts[pool] = aborter(runner)
        return runner

    def _report(self, attempt: Attempt, outcome: str, output: Any, message: str | None,
                retry_after_ns: int | None) -> None:
        lease = attempt.lease
        link = self.own.pop(lease, None)
        if link is not None:
            link.report(attempt, outcome, output, message, retry_after_ns)
            return
        if self.release(lease) is None:
            return
        data: bytes | None = None
        if outcome == SUCCESS:
            try:
                data = self.cluster.codec.encode(output)
            except Exception as exc:   # the leader would store no output either
                log.warning("task %d: its output could not be encoded for the store: %s", attempt.id, exc,
                            extra={"action": "output", "task_id": attempt.id})
        self.outcomes.append((lease, outcome, data, message, retry_after_ns))
        self.cluster.wake()

    def _heartbeat(self, lease: int) -> bool:
        link = self.own.get(lease)
        if link is not None:
            return link.heartbeat(lease)
        if lease not in self.running:
            return False
        self.beats.add(lease)
        return True

    def _not_started(self, lease: int, reason: str) -> None:
        link = self.own.pop(lease, None)
        if link is not None:
            link.not_started(lease, reason)
            return
        self.returned_here(lease)

    def start_claimed(self, got: Incoming) -> None:
        """Run the attempts this cycle claimed; give up those cancelled."""
        codec = self.cluster.codec
        for row in got.claimed:
            runner = self.runners.get(row.pool)
            if runner is None or not self.serving:
                self.returns.append(row.lease)
                continue
            try:
                record = json.loads(row.record)
                payload = codec.decode(row.payload)
            except Exception as exc:
                self.outcomes.append((row.lease, "permanent", None,
                                      f"the leased attempt could not be decoded here: {exc}", None))
                continue
            attempt = Attempt(RemoteEntry(row.task_id, row.pool, record, payload), row.lease, row.attempt)
            self.running[row.lease] = attempt
            self._remote_saved[row.task_id] = (row.lease, self._carried_checkpoints(record))
            runner.start(attempt)
        for lease in got.cancelled:
            cancelled = self.release(lease)
            if cancelled is not None:
                runner = self.runners.get(cancelled.pool)
                if runner is not None:
                    runner.abort(lease)
            self.outcomes.append((lease, "cancelled", None, None, None))

    def release(self, lease: int) -> Attempt | None:
        """An attempt leased here is over here: forget it and its checkpoints."""
        attempt = self.running.pop(lease, None)
        # (a newer attempt of the task claimed in the same cycle keeps its own)
        if attempt is not None and self._remote_saved.get(attempt.id, (lease,))[0] == lease:
            self._remote_saved.pop(attempt.id, None)
        return attempt

    def returned_here(self, lease: int) -> None:
        """A leased attempt this process's runner never started: give it back."""
        if self.release(lease) is not None:
            self.returns.append(lease)
            self.cluster.wake()

    def _carried_checkpoints(self, record: dict[str, Any]) -> dict[str, Checkpoint]:
        saved: dict[str, Checkpoint] = {}
        for stage, text, number, at in record.get("checkpoints") or ():
            data = base64.b64decode(text)
            try:
                decoded = self.cluster.codec.decode(data)
            except Exception:   # as at recovery: an undecodable checkpoint is as if never saved
                continue
            saved[stage] = Checkpoint(stage, decoded, float(at), int(number), len(data))
        return saved

    def leased_here(self, attempt: Attempt) -> bool:
        """True if ``attempt`` runs here for another process's engine."""
        return self.running.get(attempt.lease) is attempt

    def remote_checkpoints(self, task_id: int) -> dict[str, Checkpoint] | None:
        """The checkpoints of a task whose attempt runs here for another
        process's engine (None if none does). A copy: any thread reads."""
        held = self._remote_saved.get(task_id)
        return None if held is None else dict(held[1])

    def remember_checkpoint(self, attempt: Attempt, checkpoint: Checkpoint) -> None:
        if self.leased_here(attempt):
            held = self._remote_saved.get(attempt.id)
            if held is not None and held[0] == attempt.lease:
                held[1][checkpoint.stage] = checkpoint

    def give_up_all(self) -> None:
        """Leaving, after the grace: the attempts still running here go
        back to the leader (those never started unused, the others to be
        retried)."""
        for runner in self.runners.values():
            for lease in runner.cancel_all():
                if self.release(lease) is not None:
                    self.returns.append(lease)

    def fail_running(self) -> None:
        for lease in list(self.running):
            self.release(lease)
            self.outcomes.append((lease, RETRYABLE, None, "the process running it shut down", None))

    # ------------------------------------------------------------ one cycle

    def collect_writes(self, out: Outgoing, leading: bool) -> None:
        now = realtime.real_monotonic()
        if now - self.last_beat >= self.heartbeat:
            self.last_beat = now
            # "leading": a new leader places nothing on a member still marked so (its predecessor, likely dead).
            state = "leaving" if not self.serving else "leading" if leading else "serving"
            out.beat = (json.dumps(self.pools), state)
        out.outcomes, self.outcomes = self.outcomes, []
        out.returns, self.returns = self.returns, []
        out.heartbeats, self.beats = list(self.beats), set()

    def requeue(self, out: Outgoing) -> None:
        self.outcomes[:0] = out.outcomes
        self.returns[:0] = out.returns
        self.beats.update(out.heartbeats)
        if out.beat is not None:
            self.last_beat = 0.0

    def busy(self) -> bool:
        return bool(self.running or self.outcomes or self.returns)


class Reach(Protocol):
    """What ``MemberCheckpoints`` reaches: the member, and calls to the leader."""

    payloads: EncodedPayloads

    @property
    def member(self) -> MemberSide:
        ...

    async def request(self, kind: str, body: dict[str, Any], payloads: Iterable[bytes] = ()) -> Any:
        ...


class _Reach:
    __slots__ = ("member", "payloads", "request")

    def __init__(self, member: MemberSide) -> None:
        self.member = member
        self.payloads = member.cluster.payloads
        self.request = member.cluster.request


class MemberCheckpoints:
    """The checkpoints a member's runners reach (``RunnerLink.checkpoints``).

    An attempt this process's own engine placed here uses the process's
    book, as without a cluster. An attempt leased by another process's
    engine (this one follows) reads the checkpoints its offer carried (the
    leader's book when it placed the attempt: everything earlier attempts
    saved), and saves through the inbox: the leader checks that the attempt
    is still live and is this member's, then saves it as its own attempts'
    (committed, fenced by its epoch) before it answers.
    """

    def __init__(self, cluster: Reach, book: Any) -> None:
        self._cluster = cluster
        self._book = book

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        loop: asyncio.AbstractEventLoop | None = self._book.loop
        return loop

    @property
    def loop_thread(self) -> int | None:
        thread: int | None = self._book.loop_thread
        return thread

    def of(self, task_id: int, stages: tuple[str, ...] | None = None) -> list[Checkpoint]:
        saved = self._cluster.member.remote_checkpoints(task_id)
        if saved is None:
            return list(self._book.of(task_id, stages))
        if stages is None:
            return list(saved.values())
        return [saved[s] for s in stages if s in saved]

    def save(self, attempt: Attempt, stage: str, value: Any) -> Coroutine[Any, Any, Checkpoint]:
        if not self._cluster.member.leased_here(attempt):
            save: Coroutine[Any, Any, Checkpoint] = self._book.save(attempt, stage, value)
            return save
        return self._save_through_leader(attempt, stage, value)

    async def _save_through_leader(self, attempt: Attempt, stage: str, value: Any) -> Checkpoint:
        stage, data, decoded = self._book.prepare(attempt, stage, value)   # the caller's errors, raised here
        cluster = self._cluster
        at = await ops.send(cluster.request, ops.CHECKPOINT,
                            ops.CheckpointArgs(attempt.lease, attempt.id, attempt.attempt, stage, data),
                            cluster.payloads)
        checkpoint = Checkpoint(stage, decoded, at, attempt.attempt, len(data))
        cluster.member.remember_checkpoint(attempt, checkpoint)
        return checkpoint
