"""``cronoq.client.Worker``: serve a pool of a cronoq-server from this process.

The worker opens the Workers.Work stream, registers for its pool with a
number of slots, and runs ``handler(lease)`` for every lease it receives, at
most ``granted_slots`` at once. It heartbeats running leases every
``lease_ttl / 3``, cancels a handler when the server aborts its attempt
(``lease.abort_reason`` says why),
reconnects with exponential backoff when the stream ends (at once when the
server announces a leadership change), and on ``stop()`` drains: no new
leases, running handlers get ``grace`` seconds, the rest are cancelled and
reported as retryable failures.

What a handler returns is the task's output: bytes (sent as they are), str
(UTF-8 text) or anything JSON can hold. What it raises decides the attempt:
``cronoq.Retryable`` / ``cronoq.Permanent`` as they say, ``Reject`` gives
the lease back to another worker, ``CancelTask`` ends the task as cancelled,
any other exception is a retryable failure.
"""

from __future__ import annotations

import asyncio
import asyncio.threads
import concurrent.futures.thread
import inspect
import json
import logging
import random
import signal
import threading
import time
import traceback
import urllib.parse
from typing import Any, Callable, Iterable, Mapping

import grpc

from .._proto import PROTOCOL_VERSION
from .._proto import cronoq_pb2 as pb
from .._proto import cronoq_pb2_grpc as pb_grpc
from ..core.errors import CheckpointError, CronoqError, SchedulerError
from ..core.snapshot import Checkpoint
from ..errors import CancelTask, Reject
from ..loopback import is_loopback
from ..core.types import NS
from ..runtime.runner import clean_message, outcome_of
from . import wire
from .client import checkpoint_from

__all__ = ["Worker", "Lease", "Reject", "CancelTask"]

log = logging.getLogger("cronoq.client")

_PRIORITIES = {pb.PRIORITY_CRITICAL: "critical", pb.PRIORITY_HIGH: "high", pb.PRIORITY_NORMAL: "normal",
               pb.PRIORITY_LOW: "low", pb.PRIORITY_UNSPECIFIED: "normal"}
# Lease.abort_reason for each Abort.code (a code this worker does not know: "unknown").
_ABORT_REASONS = {pb.ABORT_REASON_CANCELLED: "cancelled", pb.ABORT_REASON_TIMEOUT: "timeout",
                  pb.ABORT_REASON_LEASE_EXPIRED: "lease expired", pb.ABORT_REASON_SHUTDOWN: "shutdown"}
_MAX_REDIRECTS = 3   # shard redirects followed in a row
# The end of a failed handler's traceback sent with its Fail (the end names the error).
TRACEBACK_SENT = 8192


# Frames a handler's traceback starts with that are the worker's, not the handler's.
_OWN_FILES = frozenset({__file__, asyncio.threads.__file__, concurrent.futures.thread.__file__})


def traceback_text(exc: BaseException) -> str:
    """``exc``'s formatted traceback from the handler's frame on, its last
    TRACEBACK_SENT characters (every exception's, Retryable and Permanent too:
    an operator reads where it came from)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None and tb.tb_frame.f_code.co_filename in _OWN_FILES:
        tb = tb.tb_next
    try:
        text = "".join(traceback.format_exception(type(exc), exc, tb))
    except Exception:  # a broken __str__ must not keep the attempt from ending
        return ""
    text = text.replace("\x00", "\ufffd")
    if len(text) > TRACEBACK_SENT:
        text = "\u2026" + text[len(text) - TRACEBACK_SENT + 1:]
    return text
# Status codes that retrying cannot fix: run() raises them.
_FATAL = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.NOT_FOUND,
          grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNIMPLEMENTED)


class Lease:
    """One attempt of a task, leased to this worker.

    ``id`` is the lease (unique per attempt), ``task_id`` and ``attempt``
    name the attempt; ``payload`` is bytes with its ``content_type``
    (``json()`` and ``text()`` decode it). ``timeout`` (seconds) and
    ``deadline`` (Unix seconds) are None when the task has none;
    ``lease_ttl`` is the heartbeat horizon the worker keeps; ``cancelled``
    (an ``asyncio.Event``) is set when the attempt is given up, and
    ``abort_reason`` then says why: "cancelled" (the task ended: no retry
    follows), "timeout" or "lease expired" (retryable failures), "shutdown"
    (the server stops or lost leadership, or this worker's ``stop()``),
    "disconnected" (the stream broke), "unknown" (a server that does not say).

    Checkpointed stages: ``stages`` (as declared, or None), the checkpoints
    earlier attempts saved (``checkpoints``, ``completed_stages``,
    ``resumed_from``), and ``await checkpoint(stage, data)``, which returns
    once the server stored it (``checkpoint_from_thread`` in a plain handler).
    """

    __slots__ = ("id", "task_id", "attempt", "pool", "payload", "content_type", "kind", "key", "tags", "labels",
                 "priority", "tenant", "timeout", "deadline", "lease_ttl", "cancelled", "abort_reason", "stages",
                 "_saved", "_session", "_loop")

    def __init__(self, m: pb.Lease, lease_ttl: float, session: _Session | None = None) -> None:
        self.id: int = m.lease
        self.task_id: int = m.task_id
        self.attempt: int = m.attempt
        self.pool: str = m.pool
        self.payload: bytes = bytes(m.payload)
        self.content_type: str = m.content_type
        self.kind: str = m.kind
        self.key: str | None = m.key or None
        self.tags: dict[str, str] = dict(m.tags)
        self.labels: dict[str, str] = dict(m.labels)
        self.priority: str = _PRIORITIES.get(m.priority, "normal")
        self.tenant: str | None = m.tenant or None
        self.timeout: float | None = m.timeout_s if m.HasField("timeout_s") else None
        self.deadline: float | None = m.deadline_unix_ns / NS if m.HasField("deadline_unix_ns") else None
        self.lease_ttl = lease_ttl
        self.cancelled = asyncio.Event()
        self.abort_reason: str | None = None
        self.stages: tuple[str, ...] | None = tuple(m.stages) or None
        self._saved: dict[str, Checkpoint] = {c.stage: checkpoint_from(c) for c in m.checkpoints}
        self._session = session
        self._loop = asyncio.get_running_loop() if session is not None else None

    # -- checkpointed stages

    def _ordered(self) -> list[Checkpoint]:
        saved = dict(self._saved)
        if self.stages is None:
            return list(saved.values())
        return [saved[s] for s in self.stages if s in saved]

    @property
    def checkpoints(self) -> dict[str, Any]:
        """Stage -> the data of its latest checkpoint, in stage order (bytes,
        str or JSON values, by the content type it was saved with)."""
        return {c.stage: c.data for c in self._ordered()}

    def checkpoint_info(self, stage: str) -> Checkpoint | None:
        """The latest checkpoint of ``stage`` (with its time and attempt), or None."""
        return self._saved.get(stage)

    @property
    def completed_stages(self) -> list[str]:
        return [c.stage for c in self._ordered()]

    @property
    def resumed_from(self) -> str | None:
        """The last stage earlier attempts completed, or None."""
        earlier = [c.stage for c in self._ordered() if c.attempt < self.attempt]
        return earlier[-1] if earlier else None

    async def checkpoint(self, stage: str, data: Any = None, content_type: str | None = None) -> Checkpoint:
        """Save ``data`` (bytes, str, or anything JSON can hold) as the
        checkpoint of ``stage``; returns once the server stored it.
        ``CheckpointError`` says why the server refused it."""
        session = self._session
        if session is None or not session.checkpoints:
            raise SchedulerError("the server does not keep checkpoints for this worker (it did not accept "
                                 "accept_checkpoints: upgrade the server)")
        if not isinstance(stage, str) or not stage:
            raise CheckpointError("stage must be a non-empty string")
        try:
            encoded, ctype = wire.encode(data, content_type)
        except TypeError as exc:
            raise CheckpointError(f"the checkpoint of stage {stage!r}: {exc}") from None
        if session.ended:
            raise SchedulerError("the worker's stream ended: the checkpoint was not saved")
        session.seq += 1
        seq = session.seq
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        session.saving[seq] = future
        session.out.put_nowait(pb.WorkerMessage(checkpoint=pb.Checkpoint(
            lease=self.id, stage=stage, data=encoded, content_type=ctype, seq=seq)))
        try:
            error = await future
        finally:
            session.saving.pop(seq, None)
        if error:
            raise CheckpointError(error)
        saved = Checkpoint(stage, wire.decode(encoded, ctype), time.time(), self.attempt, len(encoded))
        self._saved[stage] = saved
        return saved

    def checkpoint_from_thread(self, stage: str, data: Any = None, content_type: str | None = None,
                               timeout: float | None = None) -> Checkpoint:
        """``checkpoint`` for a plain handler (it runs on a thread): blocks until stored."""
        loop = self._loop
        if loop is None:
            raise SchedulerError("this lease has no worker stream to send checkpoints on")
        save = self.checkpoint(stage, data, content_type)
        return asyncio.run_coroutine_threadsafe(save, loop).result(timeout)

    def json(self) -> Any:
        """The payload parsed as JSON."""
        return json.loads(self.payload)

    def text(self) -> str:
        """The payload as UTF-8 text."""
        return self.payload.decode("utf-8")

    def __repr__(self) -> str:
        return f"Lease(id={self.id}, task_id={self.task_id}, attempt={self.attempt}, pool={self.pool!r})"


Handler = Callable[[Lease], Any]


class _Session:
    """One stream's state."""

    def __init__(self) -> None:
        self.out: asyncio.Queue[pb.WorkerMessage | None] = asyncio.Queue()
        self.running: dict[int, tuple[asyncio.Task[None], Lease]] = {}
        self.lease_ttl = 30.0
        self.not_leader = False
        self.shut = False
        self.registered = False
        self.max_bytes = 4 * 1024 * 1024
        self.checkpoints = False   # the server keeps checkpoints (Registered.checkpoints)
        self.seq = 0
        self.saving: dict[int, asyncio.Future[str]] = {}   # seq -> the answer's error ("" when stored)
        self.ended = False

    def end(self) -> None:
        """The stream ended: checkpoints not yet confirmed fail."""
        self.ended = True
        for future in self.saving.values():
            if not future.done():
                future.set_result("the worker's stream ended before the server confirmed the checkpoint")


# The workers of each loop that SIGTERM and SIGINT drain (one handler a loop, for all of them).
_DRAINED: dict[asyncio.AbstractEventLoop, set[Worker]] = {}
_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _drain_on_signals(loop: asyncio.AbstractEventLoop, worker: Worker) -> bool:
    """Have SIGTERM and SIGINT stop ``worker`` (False where signals cannot be
    caught: off the main thread, or a loop without signal handlers)."""
    workers = _DRAINED.get(loop)
    if workers is None:
        if threading.current_thread() is not threading.main_thread():
            return False
        try:
            for signum in _SIGNALS:
                loop.add_signal_handler(signum, _on_signal, loop, signum)
        except (NotImplementedError, RuntimeError, ValueError):
            for signum in _SIGNALS:
                loop.remove_signal_handler(signum)
            return False
        workers = _DRAINED[loop] = set()
    workers.add(worker)
    return True


def _forget_on_signals(loop: asyncio.AbstractEventLoop, worker: Worker) -> None:
    workers = _DRAINED.get(loop)
    if workers is None:
        return
    workers.discard(worker)
    if not workers:
        del _DRAINED[loop]
        for signum in _SIGNALS:
            loop.remove_signal_handler(signum)


def _on_signal(loop: asyncio.AbstractEventLoop, signum: int) -> None:
    for worker in list(_DRAINED.get(loop, ())):
        log.info("%s: draining the worker of pool %s (running handlers get %g s)", signal.Signals(signum).name,
                 worker.pool, worker.grace)
        worker.stop()


class Worker:
    """A remote worker for ``pool`` of the server at ``target`` (see the module docstring).

    ``slots``: how many leases to run at once (the server may grant fewer:
    ``granted_slots``); ``labels``: this worker's labels (tasks submitted
    with labels run only on workers that have them); ``name``: shown in the
    server's worker list; ``grace``: seconds running handlers get after
    ``stop()``; ``initial_backoff`` / ``max_backoff``: reconnection delays.
    ``token``, ``tls``, ``credentials`` and ``options`` as for ``Client``.
    A plain (non-async) handler runs on a thread.
    """

    def __init__(self, target: str, pool: str, handler: Handler, *, slots: int = 1, token: str | None = None,
                 tls: bool = False, credentials: grpc.ChannelCredentials | None = None,
                 labels: Mapping[str, str] | None = None, name: str | None = None, grace: float = 30.0,
                 options: Iterable[tuple[str, Any]] | None = None, initial_backoff: float = 0.2,
                 max_backoff: float = 10.0, insecure_redirect_http: bool = False) -> None:
        if not callable(handler):
            raise ValueError(f"handler must be callable, got {type(handler).__name__}")
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise ValueError(f"slots must be an integer >= 1, got {slots!r}")
        for field, value in (("grace", grace), ("initial_backoff", initial_backoff), ("max_backoff", max_backoff)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"{field} must be a number of seconds >= 0, got {value!r}")
        if target.startswith("http://") and (tls or credentials is not None):
            raise ValueError("TLS settings need an https:// target (or a plain host:port); refusing to connect "
                             "in plaintext")
        self.target = target
        self.pool = pool
        self.handler = handler
        self.slots = slots
        self.labels = dict(labels or {})
        self.name = name or f"python-{threading.get_native_id()}"
        self.grace = float(grace)
        self.initial_backoff = float(initial_backoff)
        self.max_backoff = float(max_backoff)
        self._token = token
        self._tls = tls
        self._credentials = credentials
        self._options = list(options or ())
        self.insecure_redirect_http = insecure_redirect_http   # follow shards to plain http:// off loopback
        self._metadata = wire.metadata(token)
        self._is_async = inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
            getattr(handler, "__call__", None))
        self.granted_slots = 0
        self.worker_id: int | None = None
        self.connected = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._stop_requested = False
        self._session: _Session | None = None

    def __repr__(self) -> str:
        return f"<cronoq.client.Worker pool={self.pool!r} {self.target} slots={self.granted_slots}/{self.slots}>"

    # -- control

    def stop(self) -> None:
        """Stop taking leases, let running handlers finish (``grace``), then
        return from ``run()``. Safe from any thread."""
        self._stop_requested = True
        loop, event = self._loop, self._stop
        if loop is None or event is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            event.set()
        elif not loop.is_closed():
            loop.call_soon_threadsafe(event.set)

    async def run(self, *, handle_signals: bool = True) -> None:
        """Serve the pool until ``stop()``. Raises for what retrying cannot fix
        (a rejected token, an unknown pool, a protocol version the server does
        not speak); reconnects after anything else. With ``handle_signals``
        (and on the main thread), SIGTERM and SIGINT drain the worker as
        ``stop()`` does: running handlers get ``grace`` seconds."""
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        if self._stop_requested:
            return
        caught = handle_signals and _drain_on_signals(self._loop, self)
        try:
            await self._run()
        finally:
            if caught:
                _forget_on_signals(self._loop, self)

    def _redirect(self, exc: grpc.aio.AioRpcError, chain: list[str]) -> str | None:
        """The endpoint a sharded server sent this worker to (its pool's shard),
        checked: at most three redirects in a row, never from TLS to plain
        http://, the token over plain http:// only to loopback unless allowed."""
        if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:
            return None
        trailing: dict[str, str] = {k: v for k, v in (exc.trailing_metadata() or ()) if isinstance(v, str)}
        endpoint = trailing.get("cronoq-shard-endpoint")
        if not endpoint:
            return None
        if len(chain) > _MAX_REDIRECTS:
            raise CronoqError(f"pool {self.pool!r}: more than {_MAX_REDIRECTS} shard redirects in a row "
                              f"({' -> '.join(chain + [endpoint])})")
        secure = self._tls or self._credentials is not None or chain[-1].startswith("https://")
        if endpoint.startswith("http://"):
            if secure:
                raise CronoqError(f"pool {self.pool!r} is served at {endpoint}: refusing to follow a redirect "
                                  f"from TLS to plain http://")
            host = urllib.parse.urlsplit(endpoint).hostname or ""
            if self._token is not None and not is_loopback(host) and not self.insecure_redirect_http:
                raise CronoqError(f"pool {self.pool!r} is served at {endpoint}: refusing to send the token over "
                                  f"plain http:// to another host (insecure_redirect_http=True allows it)")
        return endpoint

    async def _run(self) -> None:
        assert self._stop is not None
        backoff = self.initial_backoff
        chain = [self.target]    # the configured target, then the shards it sent this worker to
        channel = wire.channel(self.target, tls=self._tls, credentials=self._credentials, options=self._options)
        try:
            stub = pb_grpc.WorkersStub(channel)
            while not self._stop.is_set():
                session = _Session()
                self._session = session
                moved: str | None = None
                try:
                    await self._serve(stub, session)
                except grpc.aio.AioRpcError as exc:
                    moved = self._redirect(exc, chain)
                    if moved is None and exc.code() in _FATAL:
                        raise wire.error_from(exc) from None
                    if moved is None:
                        log.warning("worker stream for pool %s ended: %s %s", self.pool, exc.code().name,
                                    exc.details())
                finally:
                    self.connected = False
                    self.granted_slots = 0
                    self._session = None
                if self._stop.is_set():
                    break
                if session.registered:
                    backoff = self.initial_backoff
                    del chain[1:]
                if moved is not None or (len(chain) > 1 and not session.registered):
                    # Follow the redirect; or, that shard out of reach, ask the configured target again.
                    if moved is not None:
                        log.info("pool %s is served at %s: connecting there", self.pool, moved)
                        chain.append(moved)
                        target = moved
                    else:
                        del chain[1:]
                        target = self.target
                    await channel.close()
                    channel = wire.channel(target, tls=self._tls and not target.startswith("http://"),
                                           credentials=self._credentials, options=self._options)
                    stub = pb_grpc.WorkersStub(channel)
                    if moved is not None:
                        continue
                delay = 0.0 if session.not_leader else backoff * (0.5 + random.random() / 2)
                if not session.not_leader:
                    backoff = min(max(backoff * 2, self.initial_backoff), self.max_backoff)
                if delay:
                    try:
                        await asyncio.wait_for(self._stop.wait(), delay)
                    except asyncio.TimeoutError:
                        pass
        finally:
            await channel.close()

    # -- one stream

    async def _serve(self, stub: pb_grpc.WorkersStub, session: _Session) -> None:
        assert self._stop is not None
        call = stub.Work(metadata=self._metadata)
        tasks: list[asyncio.Task[Any]] = []
        try:
            await call.write(pb.WorkerMessage(register=pb.Register(
                pool=self.pool, slots=self.slots, worker_name=self.name, protocol_version=PROTOCOL_VERSION,
                labels=self.labels, accept_batches=True, accept_checkpoints=True)))
            first = await call.read()
            if first is grpc.aio.EOF:
                await self._raise_status(call)
                return
            rest: list[pb.ServerMessage] = []
            if first.WhichOneof("msg") == "batch" and first.batch.messages:
                first, *rest = first.batch.messages
            if first.WhichOneof("msg") != "registered":
                raise CronoqError(f"the server answered Register with {first.WhichOneof('msg')}")
            registered = first.registered
            session.registered = True
            session.lease_ttl = registered.lease_ttl_s or 30.0
            self.granted_slots = registered.slots
            self.worker_id = registered.worker_id
            session.max_bytes = registered.max_message_bytes or session.max_bytes
            session.checkpoints = registered.checkpoints
            self.connected = True
            log.info("connected to %s: worker %d of pool %s with %d slots", self.target, registered.worker_id,
                     self.pool,
                     registered.slots)
            for message in rest:
                self._receive(message, session)
            loop = asyncio.get_running_loop()
            reader = loop.create_task(self._read(call, session))
            tasks = [reader, loop.create_task(self._write(call, session)),
                     loop.create_task(self._heartbeat(session))]
            stopping = loop.create_task(self._stop.wait())
            tasks.append(stopping)
            await asyncio.wait((reader, tasks[1], stopping), return_when=asyncio.FIRST_COMPLETED)
            if stopping.done() and not reader.done():
                await self._drain(call, session, reader)
            elif reader.done() and not reader.cancelled() and reader.exception() is not None:
                raise reader.exception()  # type: ignore[misc]
            elif tasks[1].done() and not tasks[1].cancelled() and tasks[1].exception() is not None:
                raise tasks[1].exception()  # type: ignore[misc]
        finally:
            session.end()
            for task in tasks:
                task.cancel()
            for handler_task, lease in list(session.running.values()):
                if lease.abort_reason is None:
                    lease.abort_reason = "shutdown" if session.shut or self._stop.is_set() else "disconnected"
                lease.cancelled.set()
                handler_task.cancel()
            call.cancel()

    async def _raise_status(self, call: Any) -> None:
        code = await call.code()
        if code != grpc.StatusCode.OK:
            raise grpc.aio.AioRpcError(code, await call.initial_metadata(), await call.trailing_metadata(),
                                       await call.details())

    async def _read(self, call: Any, session: _Session) -> None:
        while True:
            message = await call.read()
            if message is grpc.aio.EOF:
                await self._raise_status(call)
                return
            if message.WhichOneof("msg") == "batch":
                for inner in message.batch.messages:
                    if self._receive(inner, session):
                        return
            elif self._receive(message, session):
                return

    def _receive(self, message: pb.ServerMessage, session: _Session) -> bool:
        """Act on one message from the server; True at Shutdown."""
        kind = message.WhichOneof("msg")
        if kind == "lease":
            lease = Lease(message.lease, session.lease_ttl, session)
            task = asyncio.get_running_loop().create_task(self._run_one(lease, session))
            session.running[lease.id] = (task, lease)
        elif kind == "abort":
            abort = message.abort
            running = session.running.pop(abort.lease, None)
            if running is not None:
                task, lease = running
                lease.abort_reason = _ABORT_REASONS.get(abort.code, "unknown")
                lease.cancelled.set()
                task.cancel()
            if abort.code == pb.ABORT_REASON_LEASE_EXPIRED:
                # The server heard nothing from us for a lease TTL (a pause): any message
                # shows it this worker is alive again, so that it gets leases again.
                session.out.put_nowait(pb.WorkerMessage(heartbeat=pb.Heartbeat(lease=abort.lease)))
        elif kind == "checkpoint_saved":
            saved = message.checkpoint_saved
            future = session.saving.get(saved.seq)
            if future is not None and not future.done():
                future.set_result(saved.error)
        elif kind == "slots_granted":
            self.granted_slots = message.slots_granted.slots
        elif kind == "shutdown":
            session.shut = True
            session.not_leader = message.shutdown.not_leader
            log.info("the server asked this worker to go (%s)", message.shutdown.reason)
            return True
        return False

    async def _write(self, call: Any, session: _Session) -> None:
        """Send what the handlers queue; what queued up meanwhile goes as one batch."""
        out = session.out
        limit = session.max_bytes // 2
        while True:
            message = await out.get()
            if message is not None and not out.empty():
                batch = pb.WorkerBatch()
                batch.messages.append(message)
                size = message.ByteSize()
                while not out.empty() and len(batch.messages) < 512:
                    nxt = out.get_nowait()
                    if nxt is None:   # the end: it is always the last item
                        out.put_nowait(None)
                        break
                    size += nxt.ByteSize() + 8
                    batch.messages.append(nxt)
                    if size > limit:
                        break
                message = pb.WorkerMessage(batch=batch)
            if message is None:
                await call.done_writing()
                return
            await call.write(message)

    async def _heartbeat(self, session: _Session) -> None:
        interval = max(session.lease_ttl / 3, 0.05)
        while True:
            await asyncio.sleep(interval)
            for lease_id in list(session.running):
                session.out.put_nowait(pb.WorkerMessage(heartbeat=pb.Heartbeat(lease=lease_id)))

    async def _drain(self, call: Any, session: _Session, reader: asyncio.Task[None]) -> None:
        """stop(): take no more leases, give running ones ``grace``, then cancel them."""
        session.out.put_nowait(pb.WorkerMessage(set_slots=pb.SetSlots(slots=0)))
        running = [task for task, _ in session.running.values()]
        if running:
            await asyncio.wait(running, timeout=self.grace)
        for task, lease in list(session.running.values()):
            lease.abort_reason = "shutdown"
            lease.cancelled.set()
            task.cancel()
            session.running.pop(lease.id, None)
            session.out.put_nowait(pb.WorkerMessage(fail=pb.Fail(
                lease=lease.id, message="the worker stopped before the attempt finished")))
        session.out.put_nowait(None)   # done writing: the server ends the stream
        try:
            await asyncio.wait_for(asyncio.shield(reader), 5.0)
        except (asyncio.TimeoutError, grpc.aio.AioRpcError, asyncio.CancelledError):
            pass

    async def _call_handler(self, lease: Lease) -> Any:
        if self._is_async:
            return await self.handler(lease)
        result = await asyncio.to_thread(self.handler, lease)
        if inspect.isawaitable(result):
            return await result
        return result

    async def _run_one(self, lease: Lease, session: _Session) -> None:
        out = session.out
        message: pb.WorkerMessage | None = None
        try:
            value = await self._call_handler(lease)
            try:
                data, content_type = wire.encode(value)
            except TypeError as exc:
                message = pb.WorkerMessage(fail=pb.Fail(lease=lease.id, permanent=True,
                                                        message=clean_message(f"the handler's output: {exc}")))
            else:
                message = pb.WorkerMessage(complete=pb.Complete(lease=lease.id, output=data,
                                                                content_type=content_type))
        except asyncio.CancelledError:
            raise   # aborted or shut down: the server already gave the attempt up (or stop() reports it)
        except Reject as exc:
            message = pb.WorkerMessage(nack=pb.Nack(lease=lease.id, reason=clean_message(exc.reason)))
        except CancelTask as exc:
            message = pb.WorkerMessage(cancelled=pb.Cancelled(lease=lease.id, message=clean_message(exc.message)))
        except Exception as exc:
            outcome, text, retry_after_ns = outcome_of(exc)
            fail = pb.Fail(lease=lease.id, permanent=outcome == "permanent", message=text or "",
                           traceback=traceback_text(exc))
            if retry_after_ns is not None:
                fail.retry_after_s = retry_after_ns / NS
            message = pb.WorkerMessage(fail=fail)
        finally:
            if session.running.get(lease.id, (None,))[0] is asyncio.current_task():
                del session.running[lease.id]
        if message is not None and not lease.cancelled.is_set() and not session.shut:
            out.put_nowait(message)

