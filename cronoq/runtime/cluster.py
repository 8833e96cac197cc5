"""Many processes, one scheduler: the runtime side of a shared store.

Every ``Scheduler`` given a store that supports it (``SqliteStore``,
``PostgresStore``) is a *member* of the store's cluster. One member leads:
it runs the engine. The others *follow*: their calls reach the leader through
the store's inbox and get its answer, and the leader leases attempts to their
executors. The design, the tables and the failure cases are in
docs/architecture.md ("Many processes, one scheduler"); the SQL is in
``cronoq.store.cluster``.

``Cluster`` is one process's part: a loop on the scheduler's event loop that
runs one *cycle* of store I/O at a time on a thread of its own (the writes
queued since the last cycle, then the reads needed now), and

- as a follower (``request``, ``watch``): sends calls and waits for their
  answers, at most ``request_timeout`` (then the call is taken back and
  raises ``LeaderUnavailable``, or, if the leader answered meanwhile, gets
  that answer); resolves the handles of watched tasks when the store says
  they ended;
- as a member (``member_link``): claims the attempts leased to it, runs
  them on its own runners and writes their outcomes;
- as the leader (``lead``, ``ClusterRunner``): carries out the inbox's
  requests in order (through ``serve``), places every attempt on the least
  busy member (itself included: its own attempts go straight to its runners),
  reads the outcomes, and gives back or fails the attempts of members that
  stopped heartbeating.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import logging
from functools import partial
from typing import Any, Awaitable, Callable, Coroutine, Iterable

from .. import realtime
from ..core import errors as _errors
from ..core.errors import CronoqError, SchedulerError
from ..core.snapshot import Checkpoint, GroupSnapshot, PoolSnapshot, Snapshot, TaskInfo
from ..core.types import CLASSES, NS, RETRYABLE, SUCCESS
from ..realtime import real_time_ns
from ..store.base import LeaderUnavailable, StoreRejected, StoreUnavailable
from ..store.cluster import ClusterTransport, Incoming, MemberRow, Offer, Outgoing, Report, Wants
from ..store.codec import Codec
from ..store.sql import Worker
from .handle import TaskHandle
from .runner import ABORT_CANCELLED, ABORT_SHUTDOWN, Attempt, Checkpoints, Runner, RunnerLink, aborter

__all__ = ["Cluster", "ClusterRunner", "MemberCheckpoints", "encode_error", "decode_error", "snapshot_from_dict",
           "info_from_dict", "RemoteEntry"]

log = logging.getLogger("cronoq.scheduler")


# ---------------------------------------------------------------- answers


_ERRORS: dict[str, type[BaseException]] = {name: getattr(_errors, name) for name in _errors.__all__}
_ERRORS.update({cls.__name__: cls for cls in (StoreUnavailable, StoreRejected, LeaderUnavailable, ValueError,
                                               TypeError, KeyError, LookupError)})


def encode_error(exc: BaseException) -> dict[str, Any]:
    """An exception as JSON-able data that ``decode_error`` rebuilds (the
    cronoq errors with their fields; others by type name and message)."""
    name = type(exc).__name__
    args: list[Any] = [str(exc)]
    if isinstance(exc, CronoqError) and _ERRORS.get(name) is type(exc):
        try:
            reduced = exc.__reduce__()
            candidate = list(reduced[1]) if isinstance(reduced, tuple) and len(reduced) > 1 else args
            json.dumps(candidate)
            args = candidate
        except (TypeError, ValueError):
            pass
    elif _ERRORS.get(name) is not type(exc):
        base = next((cls for cls in type(exc).__mro__ if _ERRORS.get(cls.__name__) is cls), SchedulerError)
        name = base.__name__
    return {"type": name, "args": args, "never": bool(getattr(exc, "never", False))}


def decode_error(data: dict[str, Any]) -> BaseException:
    cls = _ERRORS.get(str(data.get("type")), SchedulerError)
    args = data.get("args") or []
    try:
        exc = cls(*args)
    except Exception:
        exc = SchedulerError(*[str(a) for a in args[:1]])
    if data.get("never"):
        exc.never = True   # type: ignore[attr-defined]
    return exc


def info_from_dict(data: dict[str, Any]) -> TaskInfo:
    return TaskInfo(data["id"], data["status"], data["pool"], data["key"], data["kind"], data["attempt"],
                    data["message"], tenant=data.get("tenant"))


def snapshot_from_dict(data: dict[str, Any]) -> Snapshot:
    pools = []
    for pool in data["pools"]:
        fields = dict(pool)
        fields["groups"] = [GroupSnapshot(g["labels"], g["capacity"], g["busy"]) for g in pool["groups"]]
        pools.append(PoolSnapshot(**fields))
    return Snapshot(pools, dict(data["totals"]), data["live_tasks"], data["running"], data["pending"], data["at"])


# ---------------------------------------------------------------- attempts from the store


class _Named:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


class _Labels:
    __slots__ = ("labels",)

    def __init__(self, labels: dict[str, str]) -> None:
        self.labels = labels


class _SpecView:
    __slots__ = ("tenant", "tags", "labels", "timeout_ns", "stages")

    def __init__(self, record: dict[str, Any]) -> None:
        self.tenant = record.get("tenant")
        self.tags = record.get("tags") or None
        self.labels = record.get("labels") or None
        stages = record.get("stages")
        self.stages = tuple(stages) if stages else None
        timeout = record.get("timeout")
        self.timeout_ns = None if timeout is None else round(timeout * NS)


class RemoteEntry:
    """What an ``Attempt`` reads of its task, for an attempt leased through
    the store (the leader's ``Attempt`` fields, carried as JSON)."""

    __slots__ = ("id", "pool", "kind", "key", "payload", "cls", "spec", "deadline", "submitted", "group")

    def __init__(self, task_id: int, pool: str, record: dict[str, Any], payload: Any) -> None:
        self.id = task_id
        self.pool = _Named(pool)
        self.kind = record.get("kind", "default")
        self.key = record.get("key")
        self.payload = payload
        self.cls = CLASSES.index(record.get("priority", "normal"))
        self.spec = _SpecView(record)
        deadline = record.get("deadline")
        self.deadline = None if deadline is None else round(deadline * NS)
        self.submitted = round(float(record.get("submitted", 0.0)) * NS)
        self.group = _Labels(record.get("group") or {}) if record.get("group") else None


def attempt_record(attempt: Attempt, saved: Iterable[tuple[str, bytes, int, float]] = ()) -> str:
    """The JSON an offer carries: the attempt's fields, and ``saved``, the
    checkpoints of earlier attempts as (stage, encoded data, attempt, at)."""
    record: dict[str, Any] = {"kind": attempt.kind, "key": attempt.key, "priority": attempt.priority,
                              "submitted": attempt.submitted}
    for name in ("tenant", "tags", "labels", "timeout", "deadline", "group", "stages"):
        value = getattr(attempt, name)
        if value:
            record[name] = value
    checkpoints = [[stage, base64.b64encode(data).decode("ascii"), number, at]
                   for stage, data, number, at in saved]
    if checkpoints:
        record["checkpoints"] = checkpoints
    return json.dumps(record, separators=(",", ":"))


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

    def __init__(self, cluster: Cluster, book: Any) -> None:
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
        saved = self._cluster.remote_checkpoints(task_id)
        if saved is None:
            return list(self._book.of(task_id, stages))
        if stages is None:
            return list(saved.values())
        return [saved[s] for s in stages if s in saved]

    def save(self, attempt: Attempt, stage: str, value: Any) -> Coroutine[Any, Any, Checkpoint]:
        if not self._cluster.leased_here(attempt):
            save: Coroutine[Any, Any, Checkpoint] = self._book.save(attempt, stage, value)
            return save
        return self._save_through_leader(attempt, stage, value)

    async def _save_through_leader(self, attempt: Attempt, stage: str, value: Any) -> Checkpoint:
        stage, data, decoded = self._book.prepare(attempt, stage, value)   # the caller's errors, raised here
        answer = await self._cluster.request("checkpoint", {
            "lease": attempt.lease, "task": attempt.id, "attempt": attempt.attempt, "stage": stage}, [data])
        checkpoint = Checkpoint(stage, decoded, float(answer["at"]), attempt.attempt, len(data))
        self._cluster.remember_checkpoint(attempt, checkpoint)
        return checkpoint


# ---------------------------------------------------------------- the cluster


class _Call:
    """A follower's call waiting for the leader's answer."""

    __slots__ = ("future", "seq", "kind", "body", "payload")

    def __init__(self, future: asyncio.Future[Any], kind: str, body: str, payload: bytes | None) -> None:
        self.future = future
        self.seq: int | None = None
        self.kind = kind
        self.body = body
        self.payload = payload


class _Leased:
    """An attempt the leader placed on another member."""

    __slots__ = ("member", "attempt", "runner")

    def __init__(self, member: str, attempt: Attempt, runner: ClusterRunner) -> None:
        self.member = member
        self.attempt = attempt
        self.runner = runner


Serve = Callable[[str, dict[str, Any], list[bytes]], Awaitable[Any]]


def pack(payloads: Iterable[bytes]) -> bytes:
    """Payloads in one column: each one's length (4 bytes) then its bytes."""
    return b"".join(len(p).to_bytes(4, "big") + p for p in payloads)


def unpack(data: bytes | None) -> list[bytes]:
    out: list[bytes] = []
    if not data:
        return out
    i = 0
    while i < len(data):
        size = int.from_bytes(data[i:i + 4], "big")
        out.append(data[i + 4:i + 4 + size])
        i += 4 + size
    return out


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Cluster:
    """One process's part of the store's cluster (see the module documentation)."""

    def __init__(self, transport: ClusterTransport, codec: Codec, *, pools: Iterable[str],
                 request_timeout: float, poll: float, heartbeat: float = 1.0, member_ttl: float = 10.0) -> None:
        self.transport = transport
        self.identity = transport.identity
        self.codec = codec
        self.pools = sorted(pools)
        self.request_timeout = request_timeout
        self.poll = poll
        self.heartbeat = heartbeat
        self.member_ttl = member_ttl
        self.notified = False                  # the store wakes us (PostgreSQL) instead of polling
        self._worker = Worker("cronoq-cluster")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._napping: asyncio.Future[None] | None = None   # the cycle loop's wait
        self._woken = False   # wake() was called since the cycle loop last waited
        self._stopping = False
        self._serving = True                   # takes attempts (False once leaving)
        self._tokens = itertools.count(1)
        # Follower: calls not answered yet.
        self._calls: dict[int, _Call] = {}         # token -> call
        self._by_seq: dict[int, int] = {}          # inbox seq -> token
        self._to_send: list[int] = []              # tokens not written yet
        self._withdraw: list[int] = []             # seqs to take back
        self._forget: list[int] = []
        self._watch: dict[int, list[TaskHandle]] = {}
        self._watch_new = False
        # Member: runners of this process's executors, and attempts leased to it.
        self._runners: dict[str, Runner] = {}
        self._aborts: dict[str, Callable[[int, str], bool]] = {}   # each runner's abort(lease, reason)
        self._leased_here: dict[int, Attempt] = {}
        # task -> (lease, its checkpoints), for the attempts in _leased_here
        self._remote_saved: dict[int, tuple[int, dict[str, Checkpoint]]] = {}
        self.book: Any = None                      # this process's checkpoint book (member_link)
        self._own: dict[int, RunnerLink] = {}      # leases its own leader placed here -> the engine's link
        self._outcomes: list[tuple[int, str, bytes | None, str | None, int | None]] = []
        self._returns: list[int] = []
        self._beats: set[int] = set()
        self._last_beat = 0.0
        # Leader.
        self.epoch: int | None = None
        self._serve: Serve | None = None
        self._on_fenced: Callable[[str], None] | None = None
        self._cursor = 0
        self._takeover: int | None = None
        self._members: dict[str, MemberRow] = {}
        self._members_at = 0.0
        self._leased: dict[int, _Leased] = {}      # lease -> where it runs
        self._load: dict[str, int] = {}            # member -> attempts placed there
        self._turn = 0
        self._answers: list[tuple[int, str]] = []
        self._offers: list[Offer] = []
        self._cancels: list[int] = []
        self._purge: list[int] = []
        self._take_back: list[int] = []
        self._dead: set[int] = set()               # leases of members that stopped heartbeating
        self._beats_since: int | None = None
        self._serving_requests: set[asyncio.Task[None]] = set()
        self._retiring = False                     # the stopping leader starts no more calls
        self._tidied = 0.0
        self._failing = False

    # ------------------------------------------------------------ lifecycle

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.notified = self.transport.wake_on(self._notified_threadsafe)
        self._task = loop.create_task(self._run())

    def _notified_threadsafe(self, payload: str) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(self._notified, payload)
        except RuntimeError:   # the loop closed meanwhile
            pass

    def _notified(self, payload: str) -> None:
        if payload in ("", self.identity) or (payload == "leader" and self.epoch is not None) \
                or (payload == "answers" and (self._calls or self._withdraw)):
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
        timer = realtime.call_later(interval, partial(_settle, napping), loop)
        try:
            await napping
        finally:
            timer.cancel()
            self._napping = None
            self._woken = False

    def member_link(self, pool: str, make: Callable[[RunnerLink], Runner],
                    checkpoints: Checkpoints | None = None) -> Runner:
        """Make this process's runner of ``pool`` (``make(link)``) with a link
        that reports to the engine that placed each attempt: this process's
        own (when it leads) or the leader's, through the store. ``checkpoints``:
        this process's checkpoint book (it serves the attempts of its own
        engine, when it leads)."""
        loop = self._loop
        assert loop is not None
        reach: Checkpoints | None = None
        if checkpoints is not None:
            self.book = checkpoints
            reach = MemberCheckpoints(self, checkpoints)
        link = RunnerLink(pool, loop, self._member_report, self._member_heartbeat, self._member_not_started,
                          lambda labels, slots: None, checkpoints=reach)
        runner = make(link)
        self._runners[pool] = runner
        self._aborts[pool] = aborter(runner)
        return runner

    async def stop(self, grace: float) -> None:
        """Leave: take no more attempts, let those running here finish for
        ``grace`` seconds, give back the rest, answer every waiting call with
        ``SchedulerError``, and delete this member's row."""
        self._serving = False
        self._stopping = True
        if self._leased_here and grace > 0:
            deadline = realtime.real_monotonic() + grace
            while self._leased_here and realtime.real_monotonic() < deadline:
                await self._cycle_now()
                await realtime.sleep(min(self.poll, 0.05))
        for runner in self._runners.values():
            for lease in runner.cancel_all():
                if self._release(lease) is not None:
                    self._returns.append(lease)
        await asyncio.sleep(0)    # outcomes already on their way to the loop
        for lease in list(self._leased_here):
            self._release(lease)
            self._outcomes.append((lease, RETRYABLE, None, "the process running it shut down", None))
        error = SchedulerError("the scheduler shut down")
        for call in self._calls.values():
            if not call.future.done():
                call.future.set_exception(error)
        self._calls.clear()
        for handles in self._watch.values():
            for handle in handles:
                handle.set_failure("shutdown", "the scheduler shut down before the task finished")
        self._watch.clear()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        out = self._collect_member()
        out.leave = True
        out.beat = None
        try:
            await self._worker.call(self.transport.cycle, out, Wants())
        except Exception as exc:
            log.warning("could not leave the store's members cleanly: %s", exc, extra={"action": "store_outage"})
        await self._worker.call(self.transport.close)
        self._worker.shutdown()

    # ------------------------------------------------------------ follower

    async def request(self, kind: str, body: dict[str, Any], payloads: Iterable[bytes] = ()) -> Any:
        """Send a call to the leader and wait for its answer (raising the
        error it answered with). Gives up after ``request_timeout``: the call
        is taken back if no leader took it (``LeaderUnavailable``)."""
        if self._stopping:
            raise SchedulerError("the scheduler is shut down")
        loop = self._loop
        assert loop is not None
        data = list(payloads)
        call = _Call(loop.create_future(), kind, json.dumps(body, separators=(",", ":")),
                     pack(data) if data else None)
        token = next(self._tokens)
        self._calls[token] = call
        self._to_send.append(token)
        self.wake()
        try:
            answer = await realtime.wait_for(asyncio.shield(call.future), self.request_timeout)
        except asyncio.TimeoutError:
            answer = await self._take_back_call(token, call)
        if "error" in answer:
            raise decode_error(answer["error"])
        return answer.get("ok")

    async def _take_back_call(self, token: int, call: _Call) -> dict[str, Any]:
        if call.seq is None and token in self._to_send:
            self._to_send.remove(token)
            self._calls.pop(token, None)
        elif call.seq is not None:
            # Deleted if still unanswered (then LeaderUnavailable), else its answer is read.
            self._withdraw.append(call.seq)
            self.wake()
            try:
                return dict(await realtime.wait_for(asyncio.shield(call.future), max(10.0, self.poll * 10)))
            except asyncio.TimeoutError:
                pass
        raise LeaderUnavailable(f"no process that leads the store answered within {self.request_timeout:g} s "
                                f"(leadership is moving, or none leads): the call was not carried out; "
                                f"call again")

    def watch(self, handle: TaskHandle) -> None:
        """Resolve ``handle`` when the store says its task ended."""
        self._watch.setdefault(handle.id, []).append(handle)
        self._watch_new = True
        self.wake()

    def watched_handles(self) -> int:
        return sum(len(handles) for handles in self._watch.values())

    # ------------------------------------------------------------ member

    def _member_report(self, attempt: Attempt, outcome: str, output: Any, message: str | None,
                       retry_after_ns: int | None) -> None:
        lease = attempt.lease
        link = self._own.pop(lease, None)
        if link is not None:
            link.report(attempt, outcome, output, message, retry_after_ns)
            return
        if self._release(lease) is None:
            return
        data: bytes | None = None
        if outcome == SUCCESS:
            try:
                data = self.codec.encode(output)
            except Exception as exc:   # the leader would store no output either
                log.warning("task %d: its output could not be encoded for the store: %s", attempt.id, exc,
                            extra={"action": "output", "task_id": attempt.id})
        self._outcomes.append((lease, outcome, data, message, retry_after_ns))
        self.wake()

    def _member_heartbeat(self, lease: int) -> bool:
        link = self._own.get(lease)
        if link is not None:
            return link.heartbeat(lease)
        if lease not in self._leased_here:
            return False
        self._beats.add(lease)
        return True

    def _member_not_started(self, lease: int, reason: str) -> None:
        link = self._own.pop(lease, None)
        if link is not None:
            link.not_started(lease, reason)
            return
        if self._release(lease) is not None:
            self._returns.append(lease)
            self.wake()

    def _start_claimed(self, got: Incoming) -> None:
        for row in got.claimed:
            runner = self._runners.get(row.pool)
            if runner is None or not self._serving:
                self._returns.append(row.lease)
                continue
            try:
                record = json.loads(row.record)
                payload = self.codec.decode(row.payload)
            except Exception as exc:
                self._outcomes.append((row.lease, "permanent", None,
                                       f"the leased attempt could not be decoded here: {exc}", None))
                continue
            attempt = Attempt(RemoteEntry(row.task_id, row.pool, record, payload), row.lease, row.attempt)
            self._leased_here[row.lease] = attempt
            self._remote_saved[row.task_id] = (row.lease, self._carried_checkpoints(record))
            runner.start(attempt)
        for lease in got.cancelled:
            cancelled = self._release(lease)
            if cancelled is not None:
                runner = self._runners.get(cancelled.pool)
                if runner is not None:
                    runner.abort(lease)
            self._outcomes.append((lease, "cancelled", None, None, None))

    def _release(self, lease: int) -> Attempt | None:
        """An attempt leased here is over here: forget it and its checkpoints."""
        attempt = self._leased_here.pop(lease, None)
        # (a newer attempt of the task claimed in the same cycle keeps its own)
        if attempt is not None and self._remote_saved.get(attempt.id, (lease,))[0] == lease:
            self._remote_saved.pop(attempt.id, None)
        return attempt

    def _carried_checkpoints(self, record: dict[str, Any]) -> dict[str, Checkpoint]:
        saved: dict[str, Checkpoint] = {}
        for stage, text, number, at in record.get("checkpoints") or ():
            data = base64.b64decode(text)
            try:
                decoded = self.codec.decode(data)
            except Exception:   # as at recovery: an undecodable checkpoint is as if never saved
                continue
            saved[stage] = Checkpoint(stage, decoded, float(at), int(number), len(data))
        return saved

    def leased_here(self, attempt: Attempt) -> bool:
        """True if ``attempt`` runs here for another process's engine."""
        return self._leased_here.get(attempt.lease) is attempt

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

    # ------------------------------------------------------------ leader

    def leased_attempt(self, lease: int, member: str) -> Attempt | None:
        """The attempt the leader leased as ``lease`` to ``member``, while it
        is out there (None once it ended, was taken back or is unknown)."""
        leased = self._leased.get(lease)
        if leased is None or leased.member != member or lease in self._dead:
            return None
        return leased.attempt

    def lead(self, epoch: int, serve: Serve, on_fenced: Callable[[str], None]) -> None:
        """This process leads from now on, in ``epoch``: serve the inbox
        with ``serve(kind, body, payloads)``."""
        self.epoch = epoch
        self._serve = serve
        self._on_fenced = on_fenced
        self._retiring = False
        self._cursor = 0
        self._takeover = epoch
        self._members_at = 0.0
        self.wake()

    async def finish_serving(self, timeout: float) -> None:
        """The stopping leader, its last commits made: start no more of the
        inbox's calls (they stay there for the next leader), wait up to
        ``timeout`` for those it is carrying out, then write their answers,
        before it gives up the lead. An answer left unwritten would make the
        next leader carry the call out a second time."""
        self._retiring = True
        pending = set(self._serving_requests)
        if pending:
            try:
                await realtime.wait_for(asyncio.wait(pending), timeout)
            except asyncio.TimeoutError:
                log.warning("shutdown: %d calls of other processes did not finish within %g s; the "
                            "next leader carries them out", len(self._serving_requests), timeout,
                            extra={"action": "store_outage"})
                for task in list(self._serving_requests):
                    task.cancel()
        if self.epoch is None or not self._answers:
            return
        await self._cycle_now()
        if self._answers:
            log.error("shutdown: the answers to %d calls of other processes could not be written; the next "
                      "leader carries those calls out again (a key makes that safe)", len(self._answers),
                      extra={"action": "store_outage"})

    def step_down(self) -> list[Attempt]:
        """No longer the leader (leadership lost): forget the leader's state.
        Returns nothing to report: the next leader recovers those tasks."""
        self.epoch = None
        self._serve = None
        for task in list(self._serving_requests):
            task.cancel()
        self._serving_requests.clear()
        self._leased.clear()
        self._load.clear()
        self._answers.clear()
        self._offers.clear()
        self._cancels.clear()
        self._purge.clear()
        self._take_back.clear()
        self._dead.clear()
        return []

    def place(self, attempt: Attempt, runner: ClusterRunner) -> str:
        """The member an attempt of ``runner``'s pool goes to: the least busy
        of the live members serving the pool (this one included), in turn."""
        now = real_time_ns()
        pool = attempt.pool
        candidates = [self.identity] if self._serving and pool in self._runners else []
        for member in self._members.values():
            if member.id != self.identity and member.state == "serving" \
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
        self.wake()

    def _saved_for(self, attempt: Attempt) -> list[tuple[str, bytes, int, float]]:
        """The checkpoints earlier attempts saved, encoded for an offer."""
        book = self.book
        if book is None:
            return []
        out = []
        for checkpoint in book.of(attempt.id, attempt.stages):
            try:
                data = self.codec.encode(checkpoint.data)
            except Exception:   # it was encoded when saved; if not now, the stage runs again
                continue
            out.append((checkpoint.stage, bytes(data), checkpoint.attempt, checkpoint.at))
        return out

    def run_here(self, attempt: Attempt, link: RunnerLink) -> bool:
        runner = self._runners.get(attempt.pool)
        if runner is None:
            return False
        self._own[attempt.lease] = link
        self._load[self.identity] = self._load.get(self.identity, 0) + 1
        runner.start(attempt)
        return True

    def ran_here(self, lease: int) -> None:
        if self._own.pop(lease, None) is not None:
            self._unload(self.identity)

    def abort(self, lease: int, reason: str = ABORT_CANCELLED) -> bool:
        """Give up an attempt: one of this process's own runs (with ``reason``),
        or one leased to another member (told through the store, which carries
        no reason: that member's runner hears the default)."""
        if lease in self._own:
            attempt_runner = None
            for abort in self._aborts.values():
                if abort(lease, reason):
                    attempt_runner = abort
                    break
            self._own.pop(lease, None)
            self._unload(self.identity)
            return attempt_runner is not None
        leased = self._leased.pop(lease, None)
        if leased is None:
            return False
        self._unload(leased.member)
        self._cancels.append(lease)
        self.wake()
        return True

    def _unload(self, member: str) -> None:
        count = self._load.get(member, 0) - 1
        if count > 0:
            self._load[member] = count
        else:
            self._load.pop(member, None)

    def runner_of(self, pool: str) -> Runner | None:
        return self._runners.get(pool)

    def own_leases(self) -> set[int]:
        return set(self._own)

    def returned_here(self, lease: int) -> None:
        """A leased attempt this process's runner never started: give it back."""
        if self._release(lease) is not None:
            self._returns.append(lease)
            self.wake()

    def leased_elsewhere(self, runner: ClusterRunner) -> list[int]:
        return [lease for lease, leased in self._leased.items() if leased.runner is runner]

    async def settle_offers(self) -> list[int]:
        """Shutdown of the leader: take back the offers no member claimed
        yet; returns their leases (they never ran: give them back)."""
        if not self._leased:
            return []
        self._take_back.extend(self._leased)
        got = await self._cycle_now()
        back = [] if got is None else got.taken_back
        for lease in back:
            leased = self._leased.pop(lease, None)
            if leased is not None:
                self._unload(leased.member)
                self._purge.append(lease)
        return back

    def _apply_leader(self, got: Incoming) -> None:
        if got.members is not None:
            self._members = {m.id: m for m in got.members}
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
            if lease in self._dead:
                self._dead.discard(lease)
            if leased is not None:
                self._unload(leased.member)
                leased.runner.give_back(lease)
            self._purge.append(lease)
        serve = self._serve
        if serve is None or self._retiring:
            return
        for request in got.requests:
            self._cursor = max(self._cursor, request.seq)
            task = asyncio.get_running_loop().create_task(self._serve_request(serve, request.seq, request.member,
                                                                              request.kind, request.body,
                                                                              request.payload))
            self._serving_requests.add(task)
            task.add_done_callback(self._serving_requests.discard)

    def _apply_report(self, report: Report) -> None:
        leased = self._leased.pop(report.lease, None)
        self._purge.append(report.lease)
        if leased is None:
            return   # aborted, or of an older leader
        self._unload(leased.member)
        self._dead.discard(report.lease)
        if report.state == "returned":
            leased.runner.give_back(report.lease)
            return
        output: Any = None
        outcome = report.outcome or RETRYABLE
        message = report.message
        if outcome == SUCCESS and report.output is not None:
            try:
                output = self.codec.decode(report.output)
            except Exception as exc:
                outcome, message = "permanent", f"the output could not be decoded: {exc}"
        leased.runner.link.report(leased.attempt, outcome, output, message, report.retry_after_ns)

    def _find_dead(self) -> None:
        now = real_time_ns()
        live = {m.id for m in self._members.values() if now - m.heartbeat_ns < self.member_ttl * NS}
        live.add(self.identity)
        for lease, leased in self._leased.items():
            if leased.member not in live and lease not in self._dead:
                self._dead.add(lease)
                self._take_back.append(lease)
                log.warning("process %s stopped heartbeating; its attempt %d of task %d is given back or "
                            "retried", leased.member, leased.attempt.attempt, leased.attempt.id,
                            extra={"action": "member_lost", "task_id": leased.attempt.id})

    async def _serve_request(self, serve: Serve, seq: int, member: str, kind: str, body: str,
                             payload: bytes | None) -> None:
        try:
            data = json.loads(body)
            if kind == "checkpoint":
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
        token = self._by_seq.get(seq) if member == self.identity else None
        call = self._calls.get(token) if token is not None else None
        if call is not None:   # this process's own call, made before it led: answer it here
            self._by_seq.pop(seq, None)
            self._calls.pop(token, None)   # type: ignore[arg-type]
            if not call.future.done():
                call.future.set_result(answer)
            self._forget.append(seq)
        else:
            self._answers.append((seq, json.dumps(answer, separators=(",", ":"))))
        self.wake()

    # ------------------------------------------------------------ the loop

    def _collect_member(self) -> Outgoing:
        out = Outgoing()
        now = realtime.real_monotonic()
        if now - self._last_beat >= self.heartbeat:
            self._last_beat = now
            # "leading": a new leader places nothing on a member still marked so (its predecessor, likely dead).
            state = "leaving" if not self._serving else "leading" if self.epoch is not None else "serving"
            out.beat = (json.dumps(self.pools), state)
        for token in self._to_send:
            call = self._calls.get(token)
            if call is not None:
                out.requests.append((token, call.kind, call.body, call.payload))
        self._to_send = []
        out.forget, self._forget = self._forget, []
        out.outcomes, self._outcomes = self._outcomes, []
        out.returns, self._returns = self._returns, []
        out.heartbeats, self._beats = list(self._beats), set()
        return out

    def _collect(self) -> tuple[Outgoing, Wants]:
        out = self._collect_member()
        want = Wants(force=self._watch_new)
        self._watch_new = False
        if self._withdraw:
            # Withdrawn calls are deleted if still unanswered (see _cycle_withdraw).
            want.force = True
        want.answers = [call.seq for call in self._calls.values() if call.seq is not None]
        want.claim = self._serving
        want.cancelled = bool(self._leased_here)
        want.tasks = list(self._watch)
        if self.epoch is not None:
            out.epoch = self.epoch
            out.answers, self._answers = self._answers, []
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
        return out, want

    def _requeue(self, out: Outgoing, member: bool) -> None:
        """Writes that were not made go out with the next cycle."""
        if member:
            self._to_send[:0] = [token for token, *_ in out.requests]
            self._forget[:0] = out.forget
            self._outcomes[:0] = out.outcomes
            self._returns[:0] = out.returns
            self._beats.update(out.heartbeats)
            if out.beat is not None:
                self._last_beat = 0.0
        if self.epoch is not None and out.epoch == self.epoch:
            self._answers[:0] = out.answers
            self._offers[:0] = out.offers
            self._cancels[:0] = out.cancels
            self._purge[:0] = out.purge
            self._take_back[:0] = out.take_back

    async def _cycle_now(self) -> Incoming | None:
        out, want = self._collect()
        if not self._withdraw and not out.member_writes() and not out.leader_writes() and not want.force \
                and want.takeover is None and want.heartbeats_since is None and self.transport.unchanged():
            # Nothing to write, and nothing new in the store (SQLite): the
            # reads would find nothing, so the worker thread is not asked.
            return Incoming()
        withdraw, self._withdraw = self._withdraw, []
        try:
            if withdraw:
                self._withdrawn(await self._worker.call(self.transport.withdraw, withdraw))
            got = await self._worker.call(self.transport.cycle, out, want)
        except self.transport.errors as exc:
            self._withdraw[:0] = withdraw
            # Calls that could not even be written fail now: nothing of them was carried out.
            failed = StoreUnavailable(f"the store is unavailable, the call was not sent to the leader: {exc}")
            for token, *_ in out.requests:
                call = self._calls.pop(token, None)
                if call is not None and not call.future.done():
                    call.future.set_result({"error": encode_error(failed)})
            out.requests = []
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
        self._apply(out, want, got)
        return got

    def _withdrawn(self, seqs: list[int]) -> None:
        """Calls taken back before any leader carried them out."""
        for seq in seqs:
            token = self._by_seq.pop(seq, None)
            call = self._calls.pop(token, None) if token is not None else None
            if call is not None and not call.future.done():
                call.future.set_result({"error": encode_error(LeaderUnavailable(
                    f"no process that leads the store answered within {self.request_timeout:g} s (leadership "
                    f"is moving, or none leads): the call was taken back, nothing of it was carried out; "
                    f"call again"))})

    def _outage(self, exc: BaseException) -> None:
        if not self._failing:
            self._failing = True
            log.error("the cluster cannot reach the store: %s", exc, extra={"action": "store_outage"})

    def _apply(self, out: Outgoing, want: Wants, got: Incoming) -> None:
        for token, seq in got.seqs.items():
            call = self._calls.get(token)
            if call is not None:
                call.seq = seq
                self._by_seq[seq] = token
        for seq, text in got.answers.items():
            answered = self._by_seq.pop(seq, None)
            self._forget.append(seq)
            call = self._calls.pop(answered, None) if answered is not None else None
            if call is not None and not call.future.done():
                try:
                    call.future.set_result(json.loads(text))
                except ValueError:
                    call.future.set_result({"error": {"type": "SchedulerError",
                                                      "args": ["the leader's answer could not be read"]}})
        for task_id, status, attempt, message, output in got.finished:
            handles = self._watch.pop(task_id, None)
            if handles:
                self._resolve(handles, task_id, status, message, output)
        self._start_claimed(got)
        if got.fenced is not None:
            if self._on_fenced is not None and self.epoch is not None:
                self._on_fenced(got.fenced)
            return
        if self.epoch is not None:
            for seq in got.vanished:
                log.warning("inbox request %d was taken back by its sender while this leader carried it out",
                            seq, extra={"action": "request_withdrawn"})
            self._apply_leader(got)

    def _resolve(self, handles: list[TaskHandle], task_id: int, status: str, message: str | None,
                 output: bytes | None) -> None:
        if status == "succeeded":
            if output is None:
                for handle in handles:
                    handle.set_failure(status, "the task succeeded but its output is no longer available (the "
                                               "store has none: it could not be encoded, or was pruned)")
                return
            try:
                value = self.codec.decode(output)
            except Exception as exc:
                for handle in handles:
                    handle.set_failure(status, f"the task succeeded but its output could not be decoded: {exc}")
                return
            for handle in handles:
                handle.set_result(value)
        else:
            for handle in handles:
                handle.set_failure(status, message)

    def _busy(self) -> bool:
        """Whether something waits on the store (poll at the short interval)."""
        return bool(self._calls or self._watch or self._leased_here or self._leased or self._outcomes
                    or self._returns or self._forget or self._withdraw)

    async def _run(self) -> None:
        backoff = 0.05
        while not self._stopping:
            got = await self._cycle_now()
            if got is None or got.error is not None:
                await realtime.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            backoff = 0.05
            if self._work_queued():
                continue
            if self._tidied + 60.0 < realtime.real_monotonic() and self.epoch is not None:
                self._tidied = realtime.real_monotonic()
                now = real_time_ns()
                try:
                    await self._worker.call(self.transport.tidy, now - int(max(60.0, 6 * self.member_ttl) * NS),
                                            now - 600 * NS)
                except self.transport.errors:
                    pass
            interval = self.poll
            if self.notified and not (self._watch or self._dead):
                interval = max(interval, 1.0)   # the store wakes us; this is the fallback
            elif not self._busy() and self.epoch is None:
                interval = max(interval, 0.1)
            interval = min(interval, max(0.0, self._last_beat + self.heartbeat - realtime.real_monotonic()))
            await self._nap(max(interval, 0.001))

    def _work_queued(self) -> bool:
        return bool(self._to_send or self._answers or self._offers or self._cancels or self._take_back
                    or self._outcomes or self._returns or self._withdraw)


class ClusterRunner:
    """The leader's runner of one pool: it places each attempt on a member
    (``Cluster.place``), this process's runner or another's through the store."""

    def __init__(self, link: RunnerLink, cluster: Cluster, encode: Callable[[Attempt], bytes],
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
        self.cluster.ran_here(attempt.lease)
        self.link.report(attempt, outcome, output, message, retry_after_ns)

    def _not_started_local(self, lease: int, reason: str) -> None:
        self.cluster.ran_here(lease)
        self.link.not_started(lease, reason)

    def start(self, attempt: Attempt) -> None:
        cluster = self.cluster
        member = cluster.place(attempt, self)
        if member == cluster.identity:
            if cluster.run_here(attempt, self._local):
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
        cluster.offer(member, attempt, self, payload)

    def abort(self, lease: int, reason: str = ABORT_CANCELLED) -> bool:
        return self.cluster.abort(lease, reason)

    def close(self) -> None:
        self.closed = True

    def cancel_all(self) -> list[int]:
        """Give up every attempt of this pool: this process's own (those
        never started are returned) and those leased elsewhere (cancelled
        there; offers taken back by ``Cluster.settle_offers`` before are not
        among them any more)."""
        unstarted: list[int] = []
        runner = self.cluster.runner_of(self.link.pool)
        if runner is not None:
            for lease in runner.cancel_all():
                if lease in self.cluster.own_leases():
                    self.cluster.ran_here(lease)
                    unstarted.append(lease)
                else:
                    self.cluster.returned_here(lease)
        for lease in self.cluster.leased_elsewhere(self):
            self.cluster.abort(lease, ABORT_SHUTDOWN)
        return unstarted

    @property
    def stray_threads(self) -> int:
        runner = self.cluster.runner_of(self.link.pool)
        return 0 if runner is None else runner.stray_threads
