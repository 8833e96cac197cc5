"""One process's part of the store's cluster: the loop that runs one
*cycle* of store I/O at a time, and the three roles it serves (see the
package's documentation)."""

from __future__ import annotations

import asyncio
import logging
from functools import partial
from typing import Any, Callable, Iterable

from ... import realtime
from ...core.types import NS
from ...realtime import real_time_ns
from ...store.cluster import ClusterTransport, Incoming, Outgoing, Wants
from ...store.codec import Codec
from ...store.worker import Worker
from ..durability import EncodedPayloads
from ..handle import TaskHandle
from ..lifecycle import TaskGroup, cancel_and_wait
from ..runner import Checkpoints, Runner, RunnerLink
from .follower import FollowerSide
from .leader import LeaderSide, Serve
from .member import MemberSide
from .wire import settle

__all__ = ["Cluster"]

log = logging.getLogger("cronoq.scheduler")


class Cluster:
    """One process's part of the store's cluster: ``follower`` (its calls
    to the leader, its watched handles), ``member`` (the attempts leased to
    its executors) and, while it leads, ``leader`` (the inbox it serves and
    the attempts it places). Each cycle writes what the three queued since
    the last one, then reads what they need now."""

    def __init__(self, transport: ClusterTransport, codec: Codec, *, pools: Iterable[str],
                 request_timeout: float, poll: float, heartbeat: float = 1.0, member_ttl: float = 10.0,
                 payloads: EncodedPayloads | None = None, tasks: TaskGroup | None = None) -> None:
        self.transport = transport
        self.identity = transport.identity
        self.codec = codec
        self.payloads = payloads if payloads is not None else EncodedPayloads(codec)
        self.tasks = tasks if tasks is not None else TaskGroup()
        self.poll = poll
        self.notified = False                  # the store wakes us (PostgreSQL) instead of polling
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stopping = False
        self.follower = FollowerSide(self, request_timeout)
        self.member = MemberSide(self, sorted(pools), heartbeat)
        self.leader = LeaderSide(self, self.follower, self.member, heartbeat, member_ttl)
        self._worker = Worker("cronoq-cluster")
        self._task: asyncio.Task[None] | None = None
        self._napping: asyncio.Future[None] | None = None   # the cycle loop's wait
        self._woken = False   # wake() was called since the cycle loop last waited
        self._tidied = 0.0
        self._failing = False

    # ------------------------------------------------------------ what the scheduler calls

    @property
    def epoch(self) -> int | None:
        """The epoch this process leads in (None while it follows)."""
        return self.leader.epoch

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.notified = self.transport.wake_on(self._notified_threadsafe)
        self._task = self.tasks.spawn(self._run(), loop)

    async def request(self, kind: str, body: dict[str, Any], payloads: Iterable[bytes] = ()) -> Any:
        """A call to the leader (see ``FollowerSide.request``)."""
        return await self.follower.request(kind, body, payloads)

    def watch(self, handle: TaskHandle) -> None:
        self.follower.watch(handle)

    def member_link(self, pool: str, make: Callable[[RunnerLink], Runner],
                    checkpoints: Checkpoints | None = None) -> Runner:
        return self.member.member_link(pool, make, checkpoints)

    def lead(self, epoch: int, serve: Serve, on_fenced: Callable[[str], None]) -> None:
        self.leader.lead(epoch, serve, on_fenced)

    async def stop(self, grace: float) -> None:
        """Leave: take no more attempts, let those running here finish for
        ``grace`` seconds, give back the rest, answer every waiting call with
        ``SchedulerError``, and delete this member's row."""
        member = self.member
        member.serving = False
        self.stopping = True
        if member.running and grace > 0:
            deadline = realtime.real_monotonic() + grace
            while member.running and realtime.real_monotonic() < deadline:
                await self.cycle_once()
                await realtime.sleep(min(self.poll, 0.05))
        member.give_up_all()
        await asyncio.sleep(0)    # outcomes already on their way to the loop
        member.fail_running()
        self.follower.stop()
        task, self._task = self._task, None
        await cancel_and_wait(task)
        out = Outgoing()
        self.follower.collect_writes(out)
        member.collect_writes(out, self.leader.epoch is not None)
        out.leave = True
        out.beat = None
        try:
            await self._worker.call(self.transport.cycle, out, Wants())
        except Exception as exc:
            log.warning("could not leave the store's members cleanly: %s", exc, extra={"action": "store_outage"})
        await self._worker.call(self.transport.close)
        self._worker.shutdown()

    # ------------------------------------------------------------ waking

    def _notified_threadsafe(self, payload: str) -> None:
        loop = self.loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(self._notified, payload)
        except RuntimeError:   # the loop closed meanwhile
            pass

    def _notified(self, payload: str) -> None:
        if payload in ("", self.identity) or (payload == "leader" and self.leader.epoch is not None) \
                or (payload == "answers" and self.follower.waits_for_answers()):
            self.wake()

    def wake(self) -> None:
        self._woken = True
        napping = self._napping
        if napping is not None and not napping.done():
            napping.set_result(None)

    async def _nap(self, interval: float) -> None:
        """Wait ``interval`` real seconds, or until ``wake()``. A future and a
        timer: no task per wait (this runs a hundred times a second)."""
        if self._woken:
            self._woken = False
            return
        loop = asyncio.get_running_loop()
        napping = self._napping = loop.create_future()
        timer = realtime.call_later(interval, partial(settle, napping), loop)
        try:
            await napping
        finally:
            timer.cancel()
            self._napping = None
            self._woken = False

    # ------------------------------------------------------------ one cycle

    def _collect(self) -> tuple[Outgoing, Wants]:
        out = Outgoing()
        want = Wants()
        leader = self.leader
        self.follower.collect_writes(out)
        self.member.collect_writes(out, leader.epoch is not None)
        self.follower.collect_wants(want)
        want.claim = self.member.serving
        want.cancelled = bool(self.member.running)
        leader.collect(out, want)
        return out, want

    def _requeue(self, out: Outgoing, member: bool) -> None:
        """Writes that were not made go out with the next cycle."""
        if member:
            self.follower.requeue(out)
            self.member.requeue(out)
        self.leader.requeue(out)

    async def cycle_once(self) -> Incoming | None:
        """One cycle now (None if the store could not be reached)."""
        return await self._cycle_now()

    async def _cycle_now(self) -> Incoming | None:
        out, want = self._collect()
        follower = self.follower
        if not follower.withdraw and not out.member_writes() and not out.leader_writes() and not want.force \
                and want.takeover is None and want.heartbeats_since is None and self.transport.unchanged():
            # Nothing to write, and nothing new in the store (SQLite): the
            # reads would find nothing, so the worker thread is not asked.
            return Incoming()
        withdraw, follower.withdraw = follower.withdraw, []
        try:
            if withdraw:
                follower.withdrawn(await self._worker.call(self.transport.withdraw, withdraw))
            got = await self._worker.call(self.transport.cycle, out, want)
        except self.transport.errors as exc:
            follower.withdraw[:0] = withdraw
            follower.unsent(out, exc)
            self._requeue(out, member=True)
            self._outage(exc)
            return None
        if got.error is not None:
            if out.leader_writes() and got.fenced is None and not got.leader_written:
                self._requeue(out, member=False)
            self._outage(got.error)
        elif self._failing:
            self._failing = False
            log.warning("the store answers the cluster's calls again", extra={"action": "store_recovered"})
        self._apply(got)
        return got

    def _outage(self, exc: BaseException) -> None:
        if not self._failing:
            self._failing = True
            log.error("the cluster cannot reach the store: %s", exc, extra={"action": "store_outage"})

    def _apply(self, got: Incoming) -> None:
        self.follower.apply(got)
        self.member.start_claimed(got)
        leader = self.leader
        if got.fenced is not None:
            if leader.on_fenced is not None and leader.epoch is not None:
                leader.on_fenced(got.fenced)
            return
        if leader.epoch is not None:
            leader.apply(got)

    def _busy(self) -> bool:
        """Whether something waits on the store (poll at the short interval)."""
        return self.follower.busy() or self.member.busy() or self.leader.busy()

    def _work_queued(self) -> bool:
        return bool(self.follower.to_send or self.follower.withdraw or self.member.outcomes
                    or self.member.returns) or self.leader.work_queued()

    async def _run(self) -> None:
        backoff = 0.05
        while not self.stopping:
            got = await self._cycle_now()
            if got is None or got.error is not None:
                await realtime.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            backoff = 0.05
            if self._work_queued():
                continue
            if self._tidied + 60.0 < realtime.real_monotonic() and self.leader.epoch is not None:
                await self._tidy()
            interval = self.poll
            if self.notified and not (self.follower.watching or self.leader.dead):
                interval = max(interval, 1.0)   # the store wakes us; this is the fallback
            elif not self._busy() and self.leader.epoch is None:
                interval = max(interval, 0.1)
            member = self.member
            interval = min(interval, max(0.0, member.last_beat + member.heartbeat - realtime.real_monotonic()))
            await self._nap(max(interval, 0.001))

    async def _tidy(self) -> None:
        """The leader deletes what members and callers left behind."""
        self._tidied = realtime.real_monotonic()
        now = real_time_ns()
        try:
            await self._worker.call(self.transport.tidy, now - int(max(60.0, 6 * self.leader.member_ttl) * NS),
                                    now - 600 * NS)
        except self.transport.errors:
            pass

