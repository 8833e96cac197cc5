"""The leader's side of a cluster: it serves the inbox's calls in order,
places every attempt on the least busy member (itself included: its own
attempts go straight to its runners), reads the outcomes, and gives back or
fails the attempts of members that stopped heartbeating."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Awaitable, Callable, Protocol

from ... import realtime
from ...core.types import NS, RETRYABLE, SUCCESS
from ...realtime import real_time_ns
from ...store.base import LeaderUnavailable
from ...store.cluster import Incoming, MemberRow, Offer, Outgoing, Report, Wants
from ..runner import ABORT_CANCELLED, ABORT_SHUTDOWN, Attempt, Runner, RunnerLink
from .follower import FollowerSide
from .hub import Hub
from .member import MemberSide
from .wire import attempt_record, encode_error, unpack

__all__ = ["LeaderSide", "ClusterRunner", "Serve"]

log = logging.getLogger("cronoq.scheduler")

# How the leader carries out a call of the inbox: (kind, body, payloads) -> its answer's value.
Serve = Callable[[str, dict[str, Any], list[bytes]], Awaitable[Any]]


class _Leased:
    """An attempt the leader placed on another member."""

    __slots__ = ("member", "attempt", "runner")

    def __init__(self, member: str, attempt: Attempt, runner: ClusterRunner) -> None:
        self.member = member
        self.attempt = attempt
        self.runner = runner


class LeaderSide:
    def __init__(self, cluster: Hub, follower: FollowerSide, member: MemberSide, heartbeat: float,
                 member_ttl: float) -> None:
        self.cluster = cluster
        self.follower = follower
        self.member = member
        self.heartbeat = heartbeat
        self.member_ttl = member_ttl
        self.epoch: int | None = None
        self.serve: Serve | None = None
        self.on_fenced: Callable[[str], None] | None = None
        self._cursor = 0
        self._takeover: int | None = None
        self.members: dict[str, MemberRow] = {}
        self._members_at = 0.0
        self._leased: dict[int, _Leased] = {}      # lease -> where it runs
        self._load: dict[str, int] = {}            # member -> attempts placed there
        self._turn = 0
        self.answers: list[tuple[int, str]] = []
        self._offers: list[Offer] = []
        self._cancels: list[int] = []
        self._purge: list[int] = []
        self._take_back: list[int] = []
        self.dead: set[int] = set()                # leases of members that stopped heartbeating
        self._beats_since: int | None = None
        self._serving: set[asyncio.Task[None]] = set()   # calls being carried out
        self._retiring = False                     # the stopping leader starts no more calls

    def lead(self, epoch: int, serve: Serve, on_fenced: Callable[[str], None]) -> None:
        """This process leads from now on, in ``epoch``: serve the inbox
        with ``serve(kind, body, payloads)``."""
        self.epoch = epoch
        self.serve = serve
        self.on_fenced = on_fenced
        self._retiring = False
        self._cursor = 0
        self._takeover = epoch
        self._members_at = 0.0
        self.cluster.wake()

    def leased_attempt(self, lease: int, member: str) -> Attempt | None:
        """The attempt the leader leased as ``lease`` to ``member``, while it
        is out there (None once it ended, was taken back or is unknown)."""
        leased = self._leased.get(lease)
        if leased is None or leased.member != member or lease in self.dead:
            return None
        return leased.attempt

    async def finish_serving(self, timeout: float) -> None:
        """The stopping leader, its last commits made: start no more of the
        inbox's calls (they stay there for the next leader), wait up to
        ``timeout`` for those it is carrying out, then write their answers,
        before it gives up the lead. An answer left unwritten would make the
        next leader carry the call out a second time."""
        self._retiring = True
        pending = set(self._serving)
        if pending:
            try:
                await realtime.wait_for(asyncio.wait(pending), timeout)
            except asyncio.TimeoutError:
                log.warning("shutdown: %d calls of other processes did not finish within %g s; the "
                            "next leader carries them out", len(self._serving), timeout,
                            extra={"action": "store_outage"})
                for task in list(self._serving):
                    task.cancel()
        if self.epoch is None or not self.answers:
            return
        await self.cluster.cycle_once()
        if self.answers:
            log.error("shutdown: the answers to %d calls of other processes could not be written; the next "
                      "leader carries those calls out again (a key makes that safe)", len(self.answers),
                      extra={"action": "store_outage"})

    def step_down(self) -> None:
        """No longer the leader (leadership lost): forget the leader's state;
        the next leader recovers those tasks."""
        self.epoch = None
        self.serve = None
        for task in list(self._serving):
            task.cancel()
        self._serving.clear()
        self._leased.clear()
        self._load.clear()
        self.answers.clear()
        self._offers.clear()
        self._cancels.clear()
        self._purge.clear()
        self._take_back.clear()
        self.dead.clear()

    # ------------------------------------------------------------ placing attempts

    def place(self, attempt: Attempt, runner: ClusterRunner) -> str:
        """The member an attempt of ``runner``'s pool goes to: the least busy
        of the live members serving the pool (this one included), in turn."""
        now = real_time_ns()
        pool = attempt.pool
        identity = self.cluster.identity
        member_side = self.member
        candidates = [identity] if member_side.serving and pool in member_side.runners else []
        for member in self.members.values():
            if member.id != identity and member.state == "serving" \
                    and now - member.heartbeat_ns < self.member_ttl * NS and pool in member.pools:
                candidates.append(member.id)
        if not candidates:
            return ""
        load = self._load
        least = min(load.get(m, 0) for m in candidates)
        tied = [m for m in candidates if load.get(m, 0) == least]
        self._turn += 1
        return tied[self._turn % len(tied)]

    def offer(self, member: str, attempt: Attempt, runner: ClusterRunner, payload: bytes) -> None:
        self._leased[attempt.lease] = _Leased(member, attempt, runner)
        self._load[member] = self._load.get(member, 0) + 1
        self._offers.append(Offer(attempt.lease, member, attempt.id, attempt.pool, attempt.attempt,
                                  attempt_record(attempt, self._saved_for(attempt)), payload))
        self.cluster.wake()

    def _saved_for(self, attempt: Attempt) -> list[tuple[str, bytes, int, float]]:
        """The checkpoints earlier attempts saved, encoded for an offer."""
        book = self.member.book
        if book is None:
            return []
        out = []
        for checkpoint in book.of(attempt.id, attempt.stages):
            try:
                data = self.cluster.codec.encode(checkpoint.data)
            except Exception:   # it was encoded when saved; if not now, the stage runs again
                continue
            out.append((checkpoint.stage, bytes(data), checkpoint.attempt, checkpoint.at))
        return out

    def run_here(self, attempt: Attempt, link: RunnerLink) -> bool:
        member = self.member
        runner = member.runners.get(attempt.pool)
        if runner is None:
            return False
        member.own[attempt.lease] = link
        identity = self.cluster.identity
        self._load[identity] = self._load.get(identity, 0) + 1
        runner.start(attempt)
        return True

    def ran_here(self, lease: int) -> None:
        if self.member.own.pop(lease, None) is not None:
            self._unload(self.cluster.identity)

    def abort(self, lease: int, reason: str = ABORT_CANCELLED) -> bool:
        """Give up an attempt: one of this process's own runs (with ``reason``),
        or one leased to another member (told through the store, which carries
        no reason: that member's runner hears the default)."""
        member = self.member
        if lease in member.own:
            aborted = any(abort(lease, reason) for abort in member.aborts.values())
            member.own.pop(lease, None)
            self._unload(self.cluster.identity)
            return aborted
        leased = self._leased.pop(lease, None)
        if leased is None:
            return False
        self._unload(leased.member)
        self._cancels.append(lease)
        self.cluster.wake()
        return True

    def _unload(self, member: str) -> None:
        count = self._load.get(member, 0) - 1
        if count > 0:
            self._load[member] = count
        else:
            self._load.pop(member, None)

    def leased_elsewhere(self, runner: ClusterRunner) -> list[int]:
        return [lease for lease, leased in self._leased.items() if leased.runner is runner]

    async def settle_offers(self) -> list[int]:
        """Shutdown of the leader: take back the offers no member claimed
        yet; returns their leases (they never ran: give them back)."""
        if not self._leased:
            return []
        self._take_back.extend(self._leased)
        got = await self.cluster.cycle_once()
        back = [] if got is None else got.taken_back
        for lease in back:
            leased = self._leased.pop(lease, None)
            if leased is not None:
                self._unload(leased.member)
                self._purge.append(lease)
        return back

    # ------------------------------------------------------------ one cycle

    def apply(self, got: Incoming) -> None:
        for seq in got.vanished:
            log.warning("inbox request %d was taken back by its sender while this leader carried it out",
                        seq, extra={"action": "request_withdrawn"})
        if got.members is not None:
            self.members = {m.id: m for m in got.members}
            self._members_at = realtime.real_monotonic()
            self._find_dead()
        for report in got.reports:
            self._apply_report(report)
        for lease, _ in got.heartbeats:
            leased = self._leased.get(lease)
            if leased is not None:
                leased.runner.link.heartbeat(lease)
        for lease in got.taken_back:
            leased = self._leased.pop(lease, None)
            if lease in self.dead:
                self.dead.discard(lease)
            if leased is not None:
                self._unload(leased.member)
                leased.runner.give_back(lease)
            self._purge.append(lease)
        serve = self.serve
        if serve is None or self._retiring:
            return
        for request in got.requests:
            self._cursor = max(self._cursor, request.seq)
            task = self.cluster.tasks.spawn(self._serve_request(serve, request.seq, request.member, request.kind,
                                                                request.body, request.payload))
            self._serving.add(task)
            task.add_done_callback(self._serving.discard)

    def _apply_report(self, report: Report) -> None:
        leased = self._leased.pop(report.lease, None)
        self._purge.append(report.lease)
        if leased is None:
            return   # aborted, or of an older leader
        self._unload(leased.member)
        self.dead.discard(report.lease)
        if report.state == "returned":
            leased.runner.give_back(report.lease)
            return
        output: Any = None
        outcome = report.outcome or RETRYABLE
        message = report.message
        if outcome == SUCCESS and report.output is not None:
            try:
                output = self.cluster.codec.decode(report.output)
            except Exception as exc:
                outcome, message = "permanent", f"the output could not be decoded: {exc}"
        leased.runner.link.report(leased.attempt, outcome, output, message, report.retry_after_ns)

    def _find_dead(self) -> None:
        now = real_time_ns()
        live = {m.id for m in self.members.values() if now - m.heartbeat_ns < self.member_ttl * NS}
        live.add(self.cluster.identity)
        for lease, leased in self._leased.items():
            if leased.member not in live and lease not in self.dead:
                self.dead.add(lease)
                self._take_back.append(lease)
                log.warning("process %s stopped heartbeating; its attempt %d of task %d is given back or "
                            "retried", leased.member, leased.attempt.attempt, leased.attempt.id,
                            extra={"action": "member_lost", "task_id": leased.attempt.id})

    async def _serve_request(self, serve: Serve, seq: int, member: str, kind: str, body: str,
                             payload: bytes | None) -> None:
        try:
            data = json.loads(body)
            data["member"] = member   # as the store knows the sender, not as it says
            value = await serve(kind, data, unpack(payload))
            answer: dict[str, Any] = {"ok": value}
        except asyncio.CancelledError:
            return   # leadership lost: the next leader answers it
        except LeaderUnavailable:
            return   # not carried out (this leader stops): left to the next
        except Exception as exc:
            answer = {"error": encode_error(exc)}
        if self.epoch is None:
            return
        # This process's own call, made before it led: answered here.
        if member != self.cluster.identity or not self.follower.answer_here(seq, answer):
            self.answers.append((seq, json.dumps(answer, separators=(",", ":"))))
        self.cluster.wake()

    def collect(self, out: Outgoing, want: Wants) -> None:
        if self.epoch is None:
            return
        out.epoch = self.epoch
        out.answers, self.answers = self.answers, []
        out.offers, self._offers = self._offers, []
        out.cancels, self._cancels = self._cancels, []
        out.purge, self._purge = self._purge, []
        out.take_back, self._take_back = self._take_back, []
        want.lead = True
        want.inbox = not self._retiring
        want.cursor = self._cursor
        want.takeover, self._takeover = self._takeover, None
        if realtime.real_monotonic() - self._members_at >= self.heartbeat:
            want.members = True
            want.force = True
        if any(leased.runner.heartbeats for leased in self._leased.values()):
            want.heartbeats_since = self._beats_since if self._beats_since is not None else 0
            self._beats_since = real_time_ns() - NS // 2

    def requeue(self, out: Outgoing) -> None:
        if self.epoch is not None and out.epoch == self.epoch:
            self.answers[:0] = out.answers
            self._offers[:0] = out.offers
            self._cancels[:0] = out.cancels
            self._purge[:0] = out.purge
            self._take_back[:0] = out.take_back

    def busy(self) -> bool:
        return bool(self._leased)

    def work_queued(self) -> bool:
        return bool(self.answers or self._offers or self._cancels or self._take_back)


class Sides(Protocol):
    """What ``ClusterRunner`` reaches: the leader and member sides."""

    identity: str

    @property
    def leader(self) -> LeaderSide:
        ...

    @property
    def member(self) -> MemberSide:
        ...


class ClusterRunner:
    """The leader's runner of one pool: it places each attempt on a member
    (``LeaderSide.place``), this process's runner or another's through the store."""

    def __init__(self, link: RunnerLink, cluster: Sides, encode: Callable[[Attempt], bytes],
                 give_back: Callable[[int], None], heartbeats: bool) -> None:
        self.link = link
        self.cluster = cluster
        self.encode = encode
        self.give_back = give_back
        self.heartbeats = heartbeats
        self.closed = False
        self._local = RunnerLink(link.pool, link.loop, self._report_local, link.heartbeat, self._not_started_local,
                                 link.set_capacity)

    def _report_local(self, attempt: Attempt, outcome: str, output: Any, message: str | None,
                      retry_after_ns: int | None) -> None:
        self.cluster.leader.ran_here(attempt.lease)
        self.link.report(attempt, outcome, output, message, retry_after_ns)

    def _not_started_local(self, lease: int, reason: str) -> None:
        self.cluster.leader.ran_here(lease)
        self.link.not_started(lease, reason)

    def start(self, attempt: Attempt) -> None:
        cluster = self.cluster
        leader = cluster.leader
        member = leader.place(attempt, self)
        if member == cluster.identity:
            if leader.run_here(attempt, self._local):
                return
            member = ""
        if not member:
            self.link.loop.call_soon(self.link.not_started, attempt.lease, "no process serves this pool")
            return
        try:
            payload = self.encode(attempt)
        except Exception as exc:
            self.link.loop.call_soon(self.link.report, attempt, "permanent", None,
                                     f"the payload could not be encoded for another process: {exc}", None)
            return
        leader.offer(member, attempt, self, payload)

    def abort(self, lease: int, reason: str = ABORT_CANCELLED) -> bool:
        return self.cluster.leader.abort(lease, reason)

    def close(self) -> None:
        self.closed = True

    def cancel_all(self) -> list[int]:
        """Give up every attempt of this pool: this process's own (those
        never started are returned) and those leased elsewhere (cancelled
        there; offers taken back by ``LeaderSide.settle_offers`` before are
        not among them any more)."""
        unstarted: list[int] = []
        leader = self.cluster.leader
        member = self.cluster.member
        runner = member.runners.get(self.link.pool)
        if runner is not None:
            for lease in runner.cancel_all():
                if lease in member.own:
                    leader.ran_here(lease)
                    unstarted.append(lease)
                else:
                    member.returned_here(lease)
        for lease in leader.leased_elsewhere(self):
            leader.abort(lease, ABORT_SHUTDOWN)
        return unstarted

    @property
    def stray_threads(self) -> int:
        runner: Runner | None = self.cluster.member.runners.get(self.link.pool)
        return 0 if runner is None else runner.stray_threads
