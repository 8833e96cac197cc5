"""Remote workers: the runner behind every server pool, and worker sessions.

A pool's capacity is the sum of the slots its connected workers were
granted, per worker group (workers with exactly the same labels). The engine
picks the group of each attempt; ``RemotePool.start`` leases it to the
healthy worker of that group with the most free slots. Heartbeats, outcomes,
Nack and disconnects go back to the scheduler through the pool's ``RunnerLink``.

Health: a worker whose lease expires although it sent no message at all
since that lease's last heartbeat (so for a whole lease TTL) is *suspect*:
it is paused, frozen or cut off. A suspect worker gets no new lease and its
free slots leave the pool's capacity (so the retries go to the others) until
it sends any message again.

``WorkerSession`` runs one Workers.Work stream, independent of the transport:
it gets a ``read()`` coroutine (the next message, or None at the end) and a
``write(message)`` coroutine, and enforces the protocol rules (docs/server.md).
Everything here runs on the scheduler's loop.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from .._proto import PROTOCOL_VERSION
from .._proto import cronoq_pb2 as pb
from ..core.errors import CheckpointError
from ..core.types import CANCELLED_OUTCOME, NS, PERMANENT, RETRYABLE, SUCCESS
from ..runtime.runner import (
    ABORT_CANCELLED, ABORT_LEASE_EXPIRED, ABORT_SHUTDOWN, ABORT_TIMEOUT, Attempt, RunnerLink, clean_message)
from .codec import OCTETS, Blob, check_content_type
from .convert import checkpoint_message
from .errors import Code, ServiceError
from .info import TRACEBACK_KEPT, last_chars

if TYPE_CHECKING:
    from .auth import Principal
    from .config import LimitsConfig, PoolSection

__all__ = ["WorkerHub", "RemotePool", "WorkerConn", "WorkerSession"]

log = logging.getLogger("cronoq.server")

_PRIORITY = (pb.PRIORITY_CRITICAL, pb.PRIORITY_HIGH, pb.PRIORITY_NORMAL, pb.PRIORITY_LOW)
_MAX_RETRY_AFTER = 100 * 365 * 86_400.0
_BATCH = 512   # messages in one ServerBatch at most
_ABORT_CODES = {ABORT_CANCELLED: pb.ABORT_REASON_CANCELLED, ABORT_TIMEOUT: pb.ABORT_REASON_TIMEOUT,
                ABORT_LEASE_EXPIRED: pb.ABORT_REASON_LEASE_EXPIRED, ABORT_SHUTDOWN: pb.ABORT_REASON_SHUTDOWN}


class WorkerConn:
    """One connected worker: its slots, the leases it holds, its outbound
    queue, and what its health is judged by (see the module docstring)."""

    def __init__(self, hub: WorkerHub, worker_id: int, name: str, pool: str, labels: dict[str, str],
                 slots: int) -> None:
        self.hub = hub
        self.id = worker_id
        self.name = name
        self.pool = pool
        self.labels = labels
        self.group = frozenset(labels.items())
        self.slots = slots
        self.leases: dict[int, Attempt] = {}
        self.marks: dict[int, int] = {}   # lease -> ``said`` when it was leased or last heartbeated
        self.said = 0                     # messages read from the worker so far
        self.suspect = False
        self.lease_expiries = 0
        self.out: deque[pb.ServerMessage] = deque()
        self.connected_ns = time.time_ns()
        self.seen_ns = self.connected_ns  # its last message
        self.writable: asyncio.Event = asyncio.Event()
        self.done: asyncio.Future[ServiceError | None] = asyncio.get_running_loop().create_future()
        self.draining = False     # Shutdown sent: the stream ends shortly
        self.reason = "the server ended the stream"
        self.batches = False      # the worker accepts ServerBatch messages
        self.checkpoints = False  # the worker registered with accept_checkpoints
        self.saves = 0            # its checkpoints being stored
        self.progress: asyncio.Event = asyncio.Event()   # set when one is stored, or a message went out

    @property
    def free(self) -> int:
        return self.slots - len(self.leases)

    @property
    def placeable(self) -> bool:
        """It may get a new lease (when it has a free slot)."""
        return not self.draining and not self.suspect

    @property
    def capacity(self) -> int:
        """The slots it adds to its group's capacity: a suspect worker keeps
        only those of the leases it still holds (they end as they expire)."""
        if self.draining:
            return 0
        return min(self.slots, len(self.leases)) if self.suspect else self.slots

    def hold(self, attempt: Attempt) -> None:
        self.leases[attempt.lease] = attempt
        self.marks[attempt.lease] = self.said

    def drop(self, lease: int) -> Attempt | None:
        self.marks.pop(lease, None)
        return self.leases.pop(lease, None)

    def drop_all(self) -> list[tuple[int, Attempt]]:
        leases = list(self.leases.items())
        self.leases.clear()
        self.marks.clear()
        return leases

    @property
    def saves_allowed(self) -> bool:
        """After a checkpoint, its stream is read on: a worker that waits for
        each answer (one checkpoint per lease at a time) never reaches this
        bound; one that sends them without waiting cannot pile up saves the
        store has not taken, nor their answers past ``bound``."""
        return self.saves + len(self.out) < max(self.slots, len(self.leases)) + 4

    @property
    def bound(self) -> int:
        # About one lease and one abort per slot, and room for the control messages.
        return 2 * max(self.slots, len(self.leases)) + 8

    def send(self, message: pb.ServerMessage) -> None:
        if self.done.done():
            return
        self.out.append(message)
        if len(self.out) > self.bound:
            self.end(ServiceError(Code.RESOURCE_EXHAUSTED,
                                  f"the worker does not read its stream: more than {self.bound} messages wait "
                                  f"to be sent to it"))
            return
        self.writable.set()

    def end(self, error: ServiceError | None) -> None:
        """End the stream (with ``error``, or cleanly)."""
        if not self.done.done():
            self.done.set_result(error)
        self.writable.set()

    def __repr__(self) -> str:
        return f"<worker {self.id} {self.name!r} pool={self.pool} slots={self.slots} busy={len(self.leases)}>"


class WorkerHub:
    """Every connected worker of the server, by pool."""

    def __init__(self, limits: LimitsConfig, lease_ttls: dict[str, float], standby_close_s: float) -> None:
        self.limits = limits
        self.lease_ttls = lease_ttls
        self.standby_close_s = standby_close_s
        self.pools: dict[str, RemotePool] = {}
        self.workers: dict[int, WorkerConn] = {}
        self._next_id = 1
        self.graceful = False     # a graceful stop (SIGTERM) is under way; else a stop means lost leadership
        self.waiting = {True: 0, False: 0}   # streams waiting for their first message, by caller valid or not
        # Where a worker's traceback of a failed attempt goes: (task id, attempt, traceback), the service's info cache.
        self.tracebacks: Callable[[int, int, str], None] | None = None
        # Told of every lease sent: (task id, attempt, worker id, worker name); the service's info cache.
        self.on_lease: Callable[[int, int, int, str], None] | None = None

    def factory(self, section: PoolSection) -> Callable[[RunnerLink], RemotePool]:
        def make(link: RunnerLink) -> RemotePool:
            pool = RemotePool(self, link, section)
            self.pools[section.name] = pool
            return pool
        return make

    async def first_message(self, read: Reader, *, valid: bool = True) -> pb.WorkerMessage | None:
        """A new stream's first message, within limits.register_timeout_s.

        At most limits.max_workers streams wait for theirs at once, counted
        apart for callers whose credential was refused (so that they cannot
        crowd out workers): a flood of silent streams would otherwise hold
        the server's memory for the whole timeout."""
        limits = self.limits
        waiting = self.waiting
        if waiting[valid] >= limits.max_workers:
            raise ServiceError(Code.RESOURCE_EXHAUSTED,
                               f"{waiting[valid]} streams already wait for their Register (at most "
                               f"limits.max_workers); send Register at once, or try again later")
        waiting[valid] += 1
        try:
            return await asyncio.wait_for(read(), limits.register_timeout_s)
        except asyncio.TimeoutError:
            raise ServiceError(Code.DEADLINE_EXCEEDED,
                               f"no Register within {limits.register_timeout_s:g} s of opening the stream") from None
        finally:
            waiting[valid] -= 1

    def next_id(self) -> int:
        worker_id = self._next_id
        self._next_id += 1
        return worker_id

    def shutdown_all(self, reason: str, not_leader: bool) -> None:
        """Tell every worker to reconnect elsewhere; their streams end shortly."""
        for conn in list(self.workers.values()):
            self.shut(conn, reason, not_leader)

    def shut(self, conn: WorkerConn, reason: str, not_leader: bool) -> None:
        if conn.draining or conn.done.done():
            return
        conn.draining = True
        conn.send(pb.ServerMessage(shutdown=pb.Shutdown(reason=reason, not_leader=not_leader)))
        asyncio.get_running_loop().call_later(self.standby_close_s, conn.end, None)


class RemotePool:
    """The runner of one server pool (see the module docstring)."""

    def __init__(self, hub: WorkerHub, link: RunnerLink, section: PoolSection) -> None:
        self.hub = hub
        self.link = link
        self.name = section.name
        self.max = section.max
        self.lease_ttl = section.lease_ttl_s
        self.groups: dict[frozenset[tuple[str, str]], list[WorkerConn]] = {}
        self.where: dict[int, WorkerConn] = {}          # lease -> the worker holding it
        self.nacked: dict[int, set[int]] = {}           # lease -> workers that gave it back
        self.closed = False
        self.capacity = 0
        self.saving: set[asyncio.Task[None]] = set()    # checkpoints being stored
        self.lease_expiries = 0                         # leases of its workers that expired, since start
        self.suspicions = 0                             # times one of its workers was found silent

    @property
    def stray_threads(self) -> int:
        return 0

    # -- the Runner protocol

    def start(self, attempt: Attempt) -> None:
        workers = self.groups.get(frozenset(attempt.group.items()))
        best = None
        if workers:
            for conn in workers:
                if conn.placeable and conn.free > 0 and (best is None or conn.free > best.free):
                    best = conn
        if best is None:   # the engine and this runner disagree on capacity: give it back unused
            self.link.not_started(attempt.lease, "no healthy connected worker of its group has a free slot")
            return
        self._lease(best, attempt)

    def abort(self, lease: int, reason: str = ABORT_CANCELLED) -> bool:
        conn = self.where.pop(lease, None)
        if conn is None:
            return False
        self.nacked.pop(lease, None)
        mark = conn.marks.get(lease)
        attempt = conn.drop(lease)
        if attempt is not None:
            attempt.abort_reason = reason
            attempt.cancelled = True
        if reason == ABORT_LEASE_EXPIRED:
            self.lease_expiries += 1
            conn.lease_expiries += 1
            if mark == conn.said and not conn.suspect:   # not a word since the lease's last heartbeat
                conn.suspect = True
                self.suspicions += 1
                log.warning("worker %d %r of pool %s is suspect: a lease expired and it sent nothing for %g s; "
                            "it gets no new lease until it sends a message", conn.id, conn.name, self.name,
                            self.lease_ttl, extra={"action": "worker_suspect", "pool": self.name, "worker": conn.id})
        if conn.suspect:
            self._set_capacity(conn.group)
        conn.send(pb.ServerMessage(abort=pb.Abort(lease=lease, reason=self._abort_text(reason, attempt),
                                                  code=_ABORT_CODES.get(reason, pb.ABORT_REASON_UNSPECIFIED))))
        return True

    def _abort_text(self, reason: str, attempt: Attempt | None) -> str:
        if reason == ABORT_TIMEOUT:
            timeout = attempt.timeout if attempt is not None else None
            return f"the attempt ran past its timeout of {timeout:g} s" if timeout else "the attempt timed out"
        if reason == ABORT_LEASE_EXPIRED:
            return f"no heartbeat for {self.lease_ttl:g} s: the lease expired"
        if reason == ABORT_SHUTDOWN:
            return "the server gave the attempt up: it is stopping or lost leadership"
        return "the task was cancelled"

    def revive(self, conn: WorkerConn) -> None:
        """A suspect worker sent a message: it is placed again."""
        conn.suspect = False
        self._set_capacity(conn.group)
        log.info("worker %d %r of pool %s shows life again: it gets leases again", conn.id, conn.name, self.name,
                 extra={"action": "worker_healthy", "pool": self.name, "worker": conn.id})

    def close(self) -> None:
        self.closed = True

    def cancel_all(self) -> list[int]:
        """Shutdown after the grace, or lost leadership: workers are told to
        reconnect; attempts still running are given up (a new leader retries them)."""
        self.closed = True
        not_leader = not self.hub.graceful
        reason = "the server lost leadership" if not_leader else "the server is shutting down"
        for workers in self.groups.values():
            for conn in workers:
                for lease, attempt in conn.drop_all():
                    attempt.abort_reason = ABORT_SHUTDOWN
                    attempt.cancelled = True
                    conn.send(pb.ServerMessage(abort=pb.Abort(lease=lease, reason=reason,
                                                              code=pb.ABORT_REASON_SHUTDOWN)))
                self.hub.shut(conn, reason, not_leader)
        self.where.clear()
        self.nacked.clear()
        return []

    # -- workers coming and going

    def room(self, conn: WorkerConn | None = None) -> int:
        """Slots the pool can still grant (its max bounds all workers together)."""
        held = sum(c.slots for workers in self.groups.values() for c in workers if c is not conn)
        return max(0, self.max - held)

    def reserve(self, conn: WorkerConn) -> None:
        """Hold the worker's slots (``room`` counts them) before they are used."""
        self.groups.setdefault(conn.group, []).append(conn)

    def attach(self, conn: WorkerConn) -> None:
        """The worker's slots join the pool's capacity."""
        if conn not in self.groups.get(conn.group, ()):
            self.reserve(conn)
        self._set_capacity(conn.group)

    def detach(self, conn: WorkerConn, reason: str) -> None:
        workers = self.groups.get(conn.group)
        if workers is None or conn not in workers:
            return
        workers.remove(conn)
        self._set_capacity(conn.group)
        for lease, attempt in conn.drop_all():
            self.where.pop(lease, None)
            self.nacked.pop(lease, None)
            self.link.report(attempt, RETRYABLE, None, clean_message(f"worker disconnected: {reason}"), None)

    def set_slots(self, conn: WorkerConn, slots: int) -> int:
        conn.slots = min(slots, self.hub.limits.max_slots_per_worker, self.room(conn))
        self._set_capacity(conn.group)
        return conn.slots

    def _set_capacity(self, group: frozenset[tuple[str, str]]) -> None:
        workers = self.groups.get(group, ())
        self.link.set_capacity(dict(group), sum(c.capacity for c in workers))

    # -- leases

    def _lease(self, conn: WorkerConn, attempt: Attempt) -> None:
        conn.hold(attempt)
        self.where[attempt.lease] = conn
        told = self.hub.on_lease
        if told is not None:
            told(attempt.id, attempt.attempt, conn.id, conn.name)
        message = lease_message(attempt)
        book = self.link.checkpoints
        if conn.checkpoints and book is not None:   # only to workers that understand them
            stages = attempt.stages
            if stages:
                message.stages.extend(stages)
            for checkpoint in book.of(attempt.id, stages):
                message.checkpoints.append(checkpoint_message(checkpoint))
        conn.send(pb.ServerMessage(lease=message))

    def checkpoint(self, conn: WorkerConn, request: pb.Checkpoint) -> None:
        """Save a worker's checkpoint; CheckpointSaved answers once it is stored."""
        attempt = conn.leases.get(request.lease)
        answer = pb.CheckpointSaved(lease=request.lease, stage=request.stage, seq=request.seq)
        book = self.link.checkpoints
        if attempt is None or book is None:
            answer.error = ("the worker does not hold this lease (aborted, reported or unknown)"
                            if book is not None else "this pool keeps no checkpoints")
            conn.send(pb.ServerMessage(checkpoint_saved=answer))
            return
        try:
            content_type = check_content_type(request.content_type) if request.content_type else OCTETS
        except ValueError as exc:
            answer.error = f"checkpoint content_type: {exc}"
            conn.send(pb.ServerMessage(checkpoint_saved=answer))
            return

        async def save() -> None:
            try:
                await book.save(attempt, request.stage, Blob(bytes(request.data), content_type))
            except CheckpointError as exc:   # refused: the worker is told why
                answer.error = clean_message(str(exc))
            except Exception as exc:   # not stored (the store is unavailable, ...)
                answer.error = clean_message(f"{type(exc).__name__}: {exc}")
            finally:
                conn.saves -= 1
                conn.progress.set()
            conn.send(pb.ServerMessage(checkpoint_saved=answer))

        conn.saves += 1

        task = asyncio.get_running_loop().create_task(save())
        self.saving.add(task)
        task.add_done_callback(self.saving.discard)

    def held(self, conn: WorkerConn, lease: int) -> Attempt | None:
        return conn.leases.get(lease)

    def report(self, conn: WorkerConn, lease: int, outcome: str, output: Any, message: str | None,
               retry_after_ns: int | None, traceback: str = "") -> None:
        attempt = conn.drop(lease)
        if attempt is None:
            return   # not held (already aborted, or unknown): ignored
        self.where.pop(lease, None)
        self.nacked.pop(lease, None)
        if traceback and self.hub.tracebacks is not None:   # before the attempt's end is an event
            self.hub.tracebacks(attempt.id, attempt.attempt, traceback)
        self.link.report(attempt, outcome, output, message, retry_after_ns)

    def heartbeat(self, conn: WorkerConn, lease: int) -> None:
        if lease in conn.leases:   # (for a lease not held: ignored)
            conn.marks[lease] = conn.said
            self.link.heartbeat(lease)

    def nack(self, conn: WorkerConn, lease: int, reason: str) -> None:
        """Offer the attempt to another worker of its group, without using an
        attempt; if none has a free slot, it fails as retryable."""
        attempt = conn.drop(lease)
        if attempt is None:
            return
        tried = self.nacked.setdefault(lease, set())
        tried.add(conn.id)
        best = None
        for other in self.groups.get(conn.group, ()):
            if other.id not in tried and other.placeable and other.free > 0 and (
                    best is None or other.free > best.free):
                best = other
        if best is not None:
            self._lease(best, attempt)
            return
        self.where.pop(lease, None)
        self.nacked.pop(lease, None)
        text = f"worker {conn.name!r} gave the lease back" + (f" ({reason})" if reason else "")
        self.link.report(attempt, RETRYABLE, None,
                         clean_message(f"{text}; no other worker of the pool had a free slot"), None)


def clean_traceback(text: str) -> str:
    """A worker's traceback as the leader keeps it: NUL replaced, its last TRACEBACK_KEPT characters."""
    return last_chars(text.replace("\x00", "\ufffd"), TRACEBACK_KEPT)


def lease_message(attempt: Attempt) -> pb.Lease:
    blob = attempt.payload
    lease = pb.Lease(lease=attempt.lease, task_id=attempt.id, attempt=attempt.attempt, pool=attempt.pool,
                     kind=attempt.kind, priority=_PRIORITY[_class_index(attempt.priority)])
    if isinstance(blob, Blob):
        lease.payload = blob.data
        lease.content_type = blob.content_type
    key = attempt.key
    if key is not None:
        lease.key = key
    tags = attempt.tags
    if tags:
        lease.tags.update(tags)
    labels = attempt.labels
    if labels:
        lease.labels.update(labels)
    tenant = attempt.tenant
    if tenant is not None:
        lease.tenant = tenant
    timeout = attempt.timeout
    if timeout is not None:
        lease.timeout_s = timeout
    deadline = attempt.deadline
    if deadline is not None:
        lease.deadline_unix_ns = round(deadline * NS)
    return lease


_CLASS_INDEX = {"critical": 0, "high": 1, "normal": 2, "low": 3}


def _class_index(name: str) -> int:
    return _CLASS_INDEX[name]


# ---------------------------------------------------------------- sessions


Reader = Callable[[], Awaitable["pb.WorkerMessage | None"]]
Writer = Callable[[pb.ServerMessage], Awaitable[None]]


class WorkerSession:
    """One Workers.Work stream (see the module docstring and docs/server.md)."""

    def __init__(self, hub: WorkerHub, caller: Principal, serving: Callable[[], None],
                 pool_names: list[str],
                 elsewhere: Callable[[Principal, str], ServiceError | None] | None = None) -> None:
        self.hub = hub
        self.elsewhere = elsewhere      # a sharded server's redirect to the pool's shard
        self.caller = caller
        self.serving = serving          # raises UNAVAILABLE unless this server leads
        self.pool_names = pool_names
        self.conn: WorkerConn | None = None
        self.pool: RemotePool | None = None

    async def run(self, read: Reader, write: Writer) -> None:
        """Serve the stream; raises ``ServiceError`` to end it with a status.

        The first message is read before the caller is judged, so a worker
        that is refused has finished sending its Register when it hears why."""
        limits = self.hub.limits
        first = await self.hub.first_message(read)
        self.caller.require("worker")
        self.serving()
        if first is None:
            return
        if first.WhichOneof("msg") != "register":
            raise ServiceError(Code.INVALID_ARGUMENT,
                               f"the first message must be Register, got {first.WhichOneof('msg') or 'an empty one'}")
        conn, pool = self._register(first.register)
        self.conn, self.pool = conn, pool
        # The slots are the worker's from now on; they count once Registered went out, alone and first.
        pool.reserve(conn)
        self.hub.workers[conn.id] = conn
        try:
            await write(pb.ServerMessage(registered=pb.Registered(
                worker_id=conn.id, lease_ttl_s=pool.lease_ttl, slots=conn.slots, protocol_version=PROTOCOL_VERSION,
                max_message_bytes=limits.max_message_bytes, checkpoints=conn.checkpoints)))
        except BaseException:
            self.hub.workers.pop(conn.id, None)
            pool.detach(conn, "the Registered message could not be sent")
            raise
        pool.attach(conn)
        log.info("worker %d %r registered for pool %s with %d slots (labels %s)", conn.id, conn.name, pool.name,
                 conn.slots, conn.labels or "none",
                 extra={"action": "worker_registered", "pool": pool.name, "worker": conn.id})
        writer = asyncio.get_running_loop().create_task(self._write(write))
        reader = asyncio.get_running_loop().create_task(self._read(read))
        reason = "the stream ended"
        try:
            error = await conn.done
            if error is not None:
                reason = error.message
                raise error
            reason = conn.reason
        except asyncio.CancelledError:
            reason = "the call was cancelled"
            raise
        finally:
            conn.end(None)
            for task in (reader, writer):
                task.cancel()
            self.hub.workers.pop(conn.id, None)
            pool.detach(conn, reason)
            log.info("worker %d %r of pool %s disconnected: %s", conn.id, conn.name, pool.name, reason,
                     extra={"action": "worker_disconnected", "pool": pool.name, "worker": conn.id})

    def _register(self, reg: pb.Register) -> tuple[WorkerConn, RemotePool]:
        limits = self.hub.limits
        if reg.protocol_version != PROTOCOL_VERSION:
            raise ServiceError(Code.FAILED_PRECONDITION,
                               f"this server speaks worker protocol version {PROTOCOL_VERSION}; the worker sent "
                               f"protocol_version {reg.protocol_version}: upgrade the worker")
        pool = self.hub.pools.get(reg.pool or "default") if (reg.pool or "default") in self.pool_names else None
        name = reg.pool or "default"
        if pool is None:
            redirect = self.elsewhere(self.caller, name) if self.elsewhere is not None else None
            if redirect is not None:
                raise redirect
            raise ServiceError(Code.NOT_FOUND, f"no pool named {name!r}", "UnknownPool")
        if not self.caller.sees(name):
            raise ServiceError(Code.PERMISSION_DENIED, f"the credential may not serve pool {name!r}")
        if reg.slots < 1:
            raise ServiceError(Code.INVALID_ARGUMENT, "slots must be at least 1 (send SetSlots 0 to drain)")
        worker_name = reg.worker_name or "unnamed"
        if "\x00" in worker_name or len(worker_name.encode()) > limits.max_name_bytes:
            raise ServiceError(Code.INVALID_ARGUMENT,
                               f"worker_name must be at most {limits.max_name_bytes} bytes, without NUL")
        labels = dict(reg.labels)
        if len(labels) > limits.max_labels:
            raise ServiceError(Code.INVALID_ARGUMENT, f"at most {limits.max_labels} labels, got {len(labels)}")
        for key, value in labels.items():
            if not key or "\x00" in key or "\x00" in value or not value \
                    or len(key.encode()) > limits.max_name_bytes or len(value.encode()) > limits.max_value_bytes:
                raise ServiceError(Code.INVALID_ARGUMENT,
                                   f"label {key!r} must have a non-empty name and value without NUL, within "
                                   f"{limits.max_name_bytes} and {limits.max_value_bytes} bytes")
        allowed = self.caller.labels
        if allowed is not None:
            extra = sorted(f"{k}={v}" for k, v in labels.items() if (k, v) not in allowed)
            if extra:
                raise ServiceError(Code.PERMISSION_DENIED,
                                   f"the credential may not register the labels {', '.join(extra)}")
        if len(self.hub.workers) >= limits.max_workers:
            raise ServiceError(Code.RESOURCE_EXHAUSTED, f"the server serves at most {limits.max_workers} workers")
        granted = min(reg.slots, limits.max_slots_per_worker, pool.room())
        if granted < 1:
            raise ServiceError(Code.RESOURCE_EXHAUSTED,
                               f"pool {name!r} already has its max of {pool.max} slots; try again later")
        conn = WorkerConn(self.hub, self.hub.next_id(), worker_name, name, labels, granted)
        conn.batches = reg.accept_batches
        conn.checkpoints = reg.accept_checkpoints
        return conn, pool

    async def _write(self, write: Writer) -> None:
        conn = self.conn
        assert conn is not None
        out = conn.out
        # Messages that queued up while a write was under way go out as one
        # batch (to workers that accept them), within half the message limit.
        limit = self.hub.limits.max_message_bytes // 2
        try:
            while True:
                while out:
                    if not conn.batches or len(out) == 1:
                        await write(out.popleft())
                        conn.progress.set()
                        continue
                    batch = pb.ServerBatch()
                    messages = batch.messages
                    size = 0
                    while out and len(messages) < _BATCH:
                        n = out[0].ByteSize() + 8
                        if messages and size + n > limit:
                            break
                        messages.append(out.popleft())
                        size += n
                    await write(pb.ServerMessage(batch=batch))
                    conn.progress.set()
                if conn.done.done():
                    return
                conn.writable.clear()
                await conn.writable.wait()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the transport failed: the stream is gone
            conn.end(ServiceError(Code.UNAVAILABLE, f"writing to the worker failed: {exc}"))

    async def _read(self, read: Reader) -> None:
        conn = self.conn
        pool = self.pool
        assert conn is not None and pool is not None
        try:
            while True:
                message = await read()
                if message is None:
                    conn.reason = "the worker closed the stream"
                    conn.end(None)
                    return
                conn.said += 1
                conn.seen_ns = time.time_ns()
                if conn.suspect:
                    pool.revive(conn)
                kind = message.WhichOneof("msg")
                if kind != "batch":
                    self._handle(message)
                    if kind == "checkpoint":
                        await self._saves_settle()
                    continue
                for inner in message.batch.messages:
                    kind = inner.WhichOneof("msg")
                    if kind in ("batch", "register"):
                        raise ServiceError(Code.INVALID_ARGUMENT, f"a batch may not hold a {kind} message")
                    self._handle(inner)
                    if kind == "checkpoint":
                        await self._saves_settle()
        except asyncio.CancelledError:
            raise
        except ServiceError as exc:
            conn.end(exc)
        except Exception as exc:  # the transport failed (or the worker sent too large a message)
            conn.end(ServiceError(Code.UNAVAILABLE, f"reading from the worker failed: {exc}"))

    async def _saves_settle(self) -> None:
        """Backpressure, after a checkpoint: with too many of the worker's
        checkpoints being stored or answered, read its stream on only once
        one is (gRPC's flow control then holds the worker back)."""
        conn = self.conn
        assert conn is not None
        while not conn.saves_allowed:
            conn.progress.clear()
            await conn.progress.wait()

    def _handle(self, message: pb.WorkerMessage) -> None:
        """One message (never a batch: _read unpacks those)."""
        conn = self.conn
        pool = self.pool
        assert conn is not None and pool is not None
        kind = message.WhichOneof("msg")
        if kind == "heartbeat":
            pool.heartbeat(conn, message.heartbeat.lease)
        elif kind == "complete":
            done = message.complete
            if done.lease not in conn.leases:
                return
            try:
                content_type = check_content_type(done.content_type) if done.content_type else OCTETS
            except ValueError:
                content_type = OCTETS   # sanitized, as messages are
            pool.report(conn, done.lease, SUCCESS, Blob(bytes(done.output), content_type), None, None)
        elif kind == "fail":
            fail = message.fail
            retry_after = None
            if fail.HasField("retry_after_s") and math.isfinite(fail.retry_after_s):
                retry_after = int(min(max(fail.retry_after_s, 0.0), _MAX_RETRY_AFTER) * NS)
            pool.report(conn, fail.lease, PERMANENT if fail.permanent else RETRYABLE, None,
                        clean_message(fail.message) if fail.message else None, retry_after,
                        clean_traceback(fail.traceback) if fail.traceback else "")
        elif kind == "nack":
            pool.nack(conn, message.nack.lease, clean_message(message.nack.reason))
        elif kind == "cancelled":
            cancel = message.cancelled
            pool.report(conn, cancel.lease, CANCELLED_OUTCOME, None,
                        clean_message(cancel.message) if cancel.message else "cancelled by the worker", None)
        elif kind == "checkpoint":
            if not conn.checkpoints:
                raise ServiceError(Code.INVALID_ARGUMENT,
                                   "a Checkpoint from a worker that did not register with accept_checkpoints")
            pool.checkpoint(conn, message.checkpoint)
        elif kind == "set_slots":
            granted = pool.set_slots(conn, message.set_slots.slots)
            conn.send(pb.ServerMessage(slots_granted=pb.SlotsGranted(slots=granted)))
        elif kind == "register":
            raise ServiceError(Code.INVALID_ARGUMENT, "a second Register ends the stream")
        else:
            raise ServiceError(Code.INVALID_ARGUMENT, "an empty WorkerMessage")
