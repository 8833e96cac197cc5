"""``cronoq.client.Client``: submit and follow tasks on a cronoq-server."""

from __future__ import annotations

import builtins
import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable, Iterable, Mapping, TypeVar, cast

import grpc

from .._proto import cronoq_pb2 as pb
from .._proto import cronoq_pb2_grpc as pb_grpc
from ..core.actions import StatusEvent
from ..core.snapshot import POOL_FIELDS, Checkpoint
from ..core.types import CLASSES, NS, STATUSES, TaskSpec
from . import wire

__all__ = ["Client", "Submission", "TaskResult", "TaskInfo", "AttemptInfo", "TaskPage", "WorkerInfo", "ScheduleInfo",
           "Explanation", "WaitReason", "Listing", "Dependent", "Dependents"]

T = TypeVar("T")
_PRIORITIES = {pb.PRIORITY_CRITICAL: "critical", pb.PRIORITY_HIGH: "high", pb.PRIORITY_NORMAL: "normal",
               pb.PRIORITY_LOW: "low", pb.PRIORITY_UNSPECIFIED: "normal"}
_CONDITIONS = {pb.EDGE_COND_UNSPECIFIED: "success", pb.EDGE_COND_ON_SUCCESS: "success",
               pb.EDGE_COND_ON_FAILURE: "failure", pb.EDGE_COND_ON_COMPLETE: "complete"}
_OVERLAP = {"skip": pb.OVERLAP_SKIP, "allow": pb.OVERLAP_ALLOW, "queue": pb.OVERLAP_QUEUE,
            "queue_on_success": pb.OVERLAP_QUEUE_ON_SUCCESS}


def _status(value: int) -> str:
    return pb.TaskStatus.Name(value)[len("TASK_STATUS_"):].lower()


def _seconds(message: Any, field_name: str) -> float | None:
    return getattr(message, field_name) / NS if message.HasField(field_name) else None


@dataclass(frozen=True)
class TaskResult:
    """A finished task: ``status`` is terminal; ``output`` (bytes) and its
    ``content_type`` are set when it succeeded and the output is still kept
    (``output_available``); ``message`` explains failures."""

    id: int
    status: str
    output: bytes | None
    content_type: str
    message: str | None
    output_available: bool
    unavailable_shards: tuple[str, ...] = ()   # by key on a sharded server: the shards not asked

    @property
    def ok(self) -> bool:
        return self.status == "succeeded"

    def json(self) -> Any:
        """The output parsed as JSON."""
        if self.output is None:
            raise ValueError(f"task {self.id} has no output ({self.status}"
                             f"{': ' + self.message if self.message else ''})")
        return json.loads(self.output)

    def text(self) -> str:
        """The output as UTF-8 text."""
        if self.output is None:
            raise ValueError(f"task {self.id} has no output ({self.status})")
        return self.output.decode("utf-8")

    @classmethod
    def _from(cls, m: pb.TaskResult) -> TaskResult:
        return cls(m.id, _status(m.status), bytes(m.output) if m.output_available else None, m.content_type,
                   m.message or None, m.output_available)


@dataclass(frozen=True)
class Submission:
    """What ``submit`` returns: the task's id, whether the key named an
    existing task, and with ``wait=True`` its result."""

    id: int
    duplicate: bool
    result: TaskResult | None = None


@dataclass(frozen=True)
class AttemptInfo:
    """One attempt of a task, as the serving leader saw it: ``status`` how
    it ended (None while it runs), ``message`` why; times in Unix seconds;
    ``worker_id`` and ``worker_name`` the worker that got its lease (None
    when the server did not record it)."""

    attempt: int
    status: str | None
    message: str | None
    started: float | None
    ended: float | None
    worker_id: int | None = None
    worker_name: str | None = None

    @classmethod
    def _from(cls, m: pb.Attempt) -> AttemptInfo:
        return cls(m.attempt, _status(m.status) if m.status else None, m.message or None,
                   m.started_unix_ns / NS if m.started_unix_ns else None, _seconds(m, "ended_unix_ns"),
                   m.worker_id or None, m.worker_name if m.worker_id else None)


@dataclass(frozen=True)
class TaskInfo:
    """A task as the server knows it. Times are Unix seconds (None when unknown);
    fields other than ``id`` and ``status`` are best effort."""

    id: int
    status: str
    pool: str
    key: str | None
    kind: str
    attempt: int
    max_attempts: int
    message: str | None
    output_available: bool
    priority: str
    tenant: str | None
    tags: dict[str, str]
    created: float | None
    started: float | None
    finished: float | None
    stages: list[str] | None = None   # as declared
    checkpoints: list[Checkpoint] = field(default_factory=list)   # from get() only, in stage order
    attempts: list[AttemptInfo] = field(default_factory=list)     # the latest ones, oldest first
    labels: dict[str, str] = field(default_factory=dict)          # the worker labels it asked for
    deps: list[tuple[int | str, str]] = field(default_factory=list)   # (id or key, condition), as submitted
    unavailable_shards: tuple[str, ...] = ()   # get() by key on a sharded server: the shards not asked

    @classmethod
    def _from(cls, m: pb.TaskInfo) -> TaskInfo:
        return cls(m.id, _status(m.status), m.pool, m.key or None, m.kind, m.attempt, m.max_attempts,
                   m.message or None, m.output_available, _PRIORITIES.get(m.priority, "normal"), m.tenant or None,
                   dict(m.tags), _seconds(m, "created_unix_ns"), _seconds(m, "started_unix_ns"),
                   _seconds(m, "finished_unix_ns"), list(m.stages) or None,
                   [checkpoint_from(c) for c in m.checkpoints], [AttemptInfo._from(a) for a in m.attempts],
                   dict(sorted(m.labels.items())), _deps(m.deps))


def _deps(deps: Iterable[pb.Dep]) -> list[tuple[int | str, str]]:
    return [(d.ref.id if d.ref.WhichOneof("ref") == "id" else d.ref.key, _CONDITIONS.get(d.cond, "success"))
            for d in deps]


@dataclass(frozen=True)
class Dependent:
    """A task that depends on the one asked about (``Client.dependents``):
    ``depth`` 1 directly, 2 through a dependent of depth 1, and so on;
    ``depends_on``: the ids of the tasks of the answer it depends on (the
    one asked about included); ``deps``: all its dependencies as submitted,
    (id or key, condition), when the server remembers them."""

    id: int
    key: str | None
    status: str
    pool: str
    depth: int
    depends_on: list[int]
    deps: list[tuple[int | str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class Dependents:
    """The tasks that depend on a task (``Client.dependents``), nearest first
    then in id order; ``truncated``: the limit was reached, more exist."""

    id: int
    key: str | None
    status: str
    dependents: list[Dependent]
    truncated: bool
    unavailable_shards: tuple[str, ...] = ()   # by key on a sharded server: the shards not asked

    @classmethod
    def _from(cls, m: pb.DependentsResponse) -> Dependents:
        return cls(m.id, m.key or None, _status(m.status),
                   [Dependent(d.id, d.key or None, _status(d.status), d.pool, d.depth, list(d.depends_on), _deps(d.deps))
                    for d in m.dependents], m.truncated, tuple(m.unavailable_shards))


@dataclass(frozen=True)
class WaitReason:
    """One reason a task is not running yet: ``code`` (dependencies,
    awaiting_key, start_time, labels, resource, hold, fair_share, pool_full,
    next), a sentence, and its figures (docs/server.md lists them)."""

    code: str
    message: str
    detail: dict[str, Any]


@dataclass(frozen=True)
class Explanation:
    """Why a task waits, from the leader's engine (``Client.explain``).
    ``score`` and ``position`` (1: next to start) are set while it is ready in
    its pool's queues; ``queued`` counts those; ``at`` is Unix seconds."""

    id: int
    status: str
    pool: str
    priority: str | None
    key: str | None
    tenant: str | None
    summary: str
    score: float | None
    position: int | None
    queued: int
    reasons: list[WaitReason]
    at: float
    unavailable_shards: tuple[str, ...] = ()   # by key on a sharded server: the shards not asked

    @property
    def waiting(self) -> bool:
        return bool(self.reasons)

    @classmethod
    def _from(cls, m: pb.Explanation) -> Explanation:
        reasons = [WaitReason(r.code, r.message, json.loads(r.detail_json) if r.detail_json else {})
                   for r in m.reasons]
        return cls(m.id, _status(m.status), m.pool, _PRIORITIES[m.priority] if m.priority else None,
                   m.key or None, m.tenant or None, m.summary, m.score if m.HasField("score") else None,
                   m.position if m.HasField("position") else None, m.queued, reasons, m.at_unix_ns / NS)


def checkpoint_from(m: pb.StageCheckpoint) -> Checkpoint:
    """A checkpoint from the wire, its data decoded by its content type (``wire.decode``)."""
    return Checkpoint(m.stage, wire.decode(bytes(m.data), m.content_type), m.saved_unix_ns / NS, m.attempt,
                      len(m.data))


@dataclass(frozen=True)
class TaskPage:
    """One page of ``list``: pass ``next_after`` as ``after`` for the next
    page (``next_before`` as ``before`` when listing newest first); it is
    None on the last one."""

    tasks: list[TaskInfo]
    next_after: int | None
    unavailable_shards: tuple[str, ...] = ()   # with shards: those that could not be asked (their tasks missing)
    next_before: int | None = None


class Listing(builtins.list[T]):
    """A list the server answered (``workers``, ``recurring``), with the
    shards it could not ask in ``unavailable_shards`` (empty without shards)."""

    unavailable_shards: tuple[str, ...]

    def __init__(self, items: Iterable[T] = (), unavailable_shards: Iterable[str] = ()) -> None:
        super().__init__(items)
        self.unavailable_shards = tuple(unavailable_shards)


@dataclass(frozen=True)
class WorkerInfo:
    id: int
    name: str
    pool: str
    labels: dict[str, str]
    slots: int
    busy: int
    connected: float
    health: str = "healthy"        # or "suspect": a lease expired while it was silent; no new leases
    lease_expiries: int = 0        # its leases that expired
    last_seen: float | None = None  # its last message, Unix seconds


@dataclass(frozen=True)
class ScheduleInfo:
    name: str
    cron: str
    tz: str
    pool: str
    kind: str
    overlap: str
    next_at: float | None
    last_task_id: int | None


class Client:
    """An asyncio client of a cronoq-server (see docs/server.md).

    ``target`` is ``host:port`` (``https://host:port`` implies TLS).
    ``tls=True`` uses the system's root certificates; pass
    ``grpc.ssl_channel_credentials(...)`` as ``credentials`` for a private
    CA or mTLS. Calls answered UNAVAILABLE (a standby, a leader change, a
    store outage) are retried with backoff for up to ``retry_for`` seconds.
    Create it anywhere; it connects on first use. Use ``async with`` or
    ``await close()``.
    """

    def __init__(self, target: str, *, token: str | None = None, tls: bool = False,
                 credentials: grpc.ChannelCredentials | None = None,
                 options: Iterable[tuple[str, Any]] | None = None, retry_for: float = 15.0) -> None:
        self.target = target
        self._token = token
        self._tls = tls
        self._credentials = credentials
        self._options = list(options or ())
        if not retry_for >= 0:
            raise ValueError(f"retry_for must be a number of seconds >= 0, got {retry_for!r}")
        self.retry_for = float(retry_for)
        self._metadata = wire.metadata(token)
        self._channel: grpc.aio.Channel | None = None
        self._tasks: pb_grpc.TasksStub | None = None
        self._admin: pb_grpc.AdminStub | None = None
        if target.startswith("http://") and (tls or credentials is not None):
            raise ValueError("TLS settings need an https:// target (or a plain host:port)")

    def __repr__(self) -> str:
        return f"<cronoq.client.Client {self.target}>"

    # -- connection

    def _stubs(self) -> tuple[pb_grpc.TasksStub, pb_grpc.AdminStub]:
        if self._channel is None:
            self._channel = wire.channel(self.target, tls=self._tls, credentials=self._credentials,
                                          options=self._options)
            self._tasks = pb_grpc.TasksStub(self._channel)
            self._admin = pb_grpc.AdminStub(self._channel)
        assert self._tasks is not None and self._admin is not None
        return self._tasks, self._admin

    async def close(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _call(self, make: Callable[[], Awaitable[T]], ref: int | str | None = None) -> T:
        """Run one unary call, retrying UNAVAILABLE with backoff."""
        return await wire.call(make, self.retry_for, ref)

    # -- tasks

    async def submit(self, payload: Any = None, *, wait: bool = False, wait_timeout: float | None = None,
                     content_type: str | None = None, **options: Any) -> Submission:
        """Submit one task. ``payload``: bytes (sent as they are), str (UTF-8
        text) or anything JSON can hold; ``options`` are those of
        ``cronoq.Task`` (pool, kind, priority, key, deadline_in, after, ...).
        With ``wait=True`` it returns once the task finished, with its result
        (``TimeoutError`` after ``wait_timeout``, the task still running)."""
        spec = wire.task_message(payload, content_type=content_type, **options)
        request = pb.SubmitRequest(task=spec, wait=wait)
        if wait_timeout is not None:
            request.wait_timeout_s = wait_timeout
        tasks, _ = self._stubs()
        response: pb.SubmitResponse = await self._call(lambda: tasks.Submit(request, metadata=self._metadata))
        result = TaskResult._from(response.result) if response.HasField("result") else None
        return Submission(response.id, response.duplicate, result)

    async def submit_batch(self, tasks: Iterable[TaskSpec | Mapping[str, Any]]) -> builtins.list[Submission]:
        """Submit tasks atomically: all or none. Each is a ``cronoq.Task`` or a
        dict of ``submit``'s arguments (``payload`` and the options)."""
        request = pb.SubmitBatchRequest()
        for item in tasks:
            if isinstance(item, TaskSpec):
                request.tasks.append(wire.from_task(item))
            elif isinstance(item, Mapping):
                request.tasks.append(wire.task_message(**item))
            else:
                raise TypeError(f"submit_batch takes cronoq.Task objects or dicts, got {type(item).__name__}")
        stub, _ = self._stubs()
        response: pb.SubmitBatchResponse = await self._call(
            lambda: stub.SubmitBatch(request, metadata=self._metadata))
        return [Submission(r.id, r.duplicate) for r in response.tasks]

    async def get(self, ref: int | str) -> TaskInfo:
        """The task with this id (int) or key (str); ``UnknownTask`` if the
        server knows none (or it belongs to a pool the token may not use)."""
        request = pb.GetRequest(task=wire.ref_message(ref))
        tasks, _ = self._stubs()
        answer, missing = await wire.noted_call(lambda: tasks.Get(request, metadata=self._metadata), self.retry_for,
                                                ref)
        info = TaskInfo._from(answer)
        return dataclasses.replace(info, unavailable_shards=missing) if missing else info

    async def explain(self, ref: int | str) -> Explanation:
        """Why the task with this id or key waits: its score, its place in its
        pool's line and every reason it is not running (see ``Explanation``);
        ``UnknownTask`` as for ``get``."""
        request = pb.ExplainRequest(task=wire.ref_message(ref))
        tasks, _ = self._stubs()
        answer, missing = await wire.noted_call(lambda: tasks.Explain(request, metadata=self._metadata),
                                                self.retry_for, ref)
        explanation = Explanation._from(answer)
        return dataclasses.replace(explanation, unavailable_shards=missing) if missing else explanation

    async def dependents(self, ref: int | str, depth: int = 1, limit: int | None = None) -> Dependents:
        """The tasks that depend on the task with this id or key, level by level
        up to ``depth`` (at most 5), at most ``limit`` of them (default 100):
        from the leader's engine and its record of recent tasks, so a finished
        task's dependents are listed while the leader remembers them.
        ``UnknownTask`` as for ``get``."""
        request = pb.DependentsRequest(task=wire.ref_message(ref), depth=depth, limit=limit or 0)
        tasks, _ = self._stubs()
        answer, missing = await wire.noted_call(lambda: tasks.Dependents(request, metadata=self._metadata),
                                                self.retry_for, ref)
        found = Dependents._from(answer)
        if missing:
            found = dataclasses.replace(found, unavailable_shards=tuple(dict.fromkeys((*found.unavailable_shards,
                                                                                      *missing))))
        return found

    async def wait(self, ref: int | str, timeout: float | None = None) -> TaskResult:
        """Wait until the task finished (at most ``timeout`` seconds, capped by
        the server's limits.max_wait_s): its result, or ``TimeoutError``."""
        request = pb.WaitRequest(task=wire.ref_message(ref))
        if timeout is not None:
            request.timeout_s = timeout
        tasks, _ = self._stubs()
        answer, missing = await wire.noted_call(lambda: tasks.Wait(request, metadata=self._metadata), self.retry_for,
                                                ref)
        result = TaskResult._from(answer)
        return dataclasses.replace(result, unavailable_shards=missing) if missing else result

    async def cancel(self, ref: int | str) -> bool:
        """Cancel a task: True if this call cancelled it, False if it had finished."""
        request = pb.CancelRequest(task=wire.ref_message(ref))
        tasks, _ = self._stubs()
        response = await self._call(lambda: tasks.Cancel(request, metadata=self._metadata), ref)
        return bool(response.cancelled)

    async def list(self, *, pools: Iterable[str] = (), statuses: Iterable[str] = (), after: int = 0,
                   limit: int = 100, query: str = "", newest_first: bool = False, before: int = 0) -> TaskPage:
        """One page of tasks in id order, or descending with ``newest_first``
        (only ids below ``before`` unless 0). ``query``: all digits finds
        that id; other text, the tasks whose key, kind, tenant, message or a
        tag value holds it, case-insensitive (see ``TaskPage``)."""
        wanted = list(statuses)
        for status in wanted:
            if status not in STATUSES:
                raise ValueError(f"unknown status {status!r}; statuses are {', '.join(STATUSES)}")
        request = pb.ListTasksRequest(pools=list(pools), after=after, limit=limit, query=query,
                                      newest_first=newest_first, before=before,
                                      statuses=[cast("pb.TaskStatus", pb.TaskStatus.Value("TASK_STATUS_" + s.upper()))
                                                for s in wanted])
        tasks, _ = self._stubs()
        response: pb.ListTasksResponse = await self._call(lambda: tasks.ListTasks(request, metadata=self._metadata))
        return TaskPage([TaskInfo._from(t) for t in response.tasks], response.next_after or None,
                        tuple(response.unavailable_shards), response.next_before or None)

    async def watch(self, *, pools: Iterable[str] = (), terminal_only: bool = False) -> AsyncIterator[StatusEvent]:
        """Status events as they happen (``cronoq.StatusEvent``, ``at`` in Unix
        seconds), until the server stops serving (``SchedulerError``) or the
        reader falls behind (``ServerError`` with code DATA_LOSS)."""
        request = pb.WatchRequest(pools=list(pools), terminal_only=terminal_only)
        tasks, _ = self._stubs()
        call = tasks.Watch(request, metadata=self._metadata)
        try:
            async for m in call:
                yield StatusEvent(m.id, m.pool, m.key or None, _status(m.status), m.attempt, m.at_unix_ns / NS,
                                  m.message or None, m.stage or None, max_attempts=m.max_attempts or None)
        except grpc.aio.AioRpcError as exc:
            raise wire.error_from(exc) from None
        finally:
            call.cancel()

    # -- admin

    async def workers(self, *, pools: Iterable[str] = ()) -> Listing[WorkerInfo]:
        """Connected workers (metrics role); with shards, every shard's (see ``Listing``)."""
        _, admin = self._stubs()
        request = pb.ListWorkersRequest(pools=list(pools))
        response = await self._call(lambda: admin.ListWorkers(request, metadata=self._metadata))
        return Listing((WorkerInfo(w.id, w.name, w.pool, dict(w.labels), w.slots, w.busy, w.connected_unix_ns / NS,
                                   "suspect" if w.health == pb.WORKER_HEALTH_SUSPECT else "healthy", w.lease_expiries,
                                   w.last_seen_unix_ns / NS if w.last_seen_unix_ns else None)
                        for w in response.workers), response.unavailable_shards)

    async def recurring(self) -> Listing[ScheduleInfo]:
        """Recurring schedules, by name (metrics role); with shards, every shard's (see ``Listing``)."""
        _, admin = self._stubs()
        response = await self._call(lambda: admin.ListRecurring(pb.ListRecurringRequest(), metadata=self._metadata))
        overlap = {v: k for k, v in _OVERLAP.items()}
        return Listing((ScheduleInfo(s.name, s.cron, s.tz or "UTC", s.pool, s.kind, overlap.get(s.overlap, "skip"),
                                     _seconds(s, "next_unix_ns"), s.last_task_id if s.HasField("last_task_id") else None)
                        for s in response.schedules), response.unavailable_shards)

    async def add_recurring(self, name: str, cron: str, payload: Any = None, *, tz: str = "UTC",
                            overlap: str = "skip", content_type: str | None = None, **options: Any) -> float | None:
        """Register or replace a cron schedule (admin role); returns its next
        occurrence in Unix seconds. ``options`` are task options (pool, kind,
        priority, key, deadline_in, tolerance, on_miss, ...)."""
        if overlap not in _OVERLAP:
            raise ValueError(f"overlap must be one of {', '.join(_OVERLAP)}, got {overlap!r}")
        template = wire.task_message(payload, content_type=content_type, **options)
        request = pb.AddRecurringRequest(name=name, cron=cron, tz=tz, template=template, overlap=_OVERLAP[overlap])
        _, admin = self._stubs()
        response = await self._call(lambda: admin.AddRecurring(request, metadata=self._metadata))
        return _seconds(response, "next_unix_ns")

    async def remove_recurring(self, name: str) -> bool:
        """Remove a schedule (admin role): False if there was none."""
        _, admin = self._stubs()
        request = pb.RemoveRecurringRequest(name=name)
        response = await self._call(lambda: admin.RemoveRecurring(request, metadata=self._metadata))
        return bool(response.removed)

    async def snapshot(self) -> dict[str, Any]:
        """The server's snapshot (metrics role) as a dict: ``pools`` (one dict
        per pool the token may see, with its ``groups``), ``totals``,
        ``live_tasks``, ``running``, ``pending``, ``workers_connected``, ``at``
        (Unix seconds), ``metrics_window`` (seconds: what the pools' attempt
        counts and rates cover), ``unavailable_shards`` (with shards: those
        that could not be asked, left out of the pools and the counts).
        Field meanings: docs/server.md."""
        _, admin = self._stubs()
        r = await self._call(lambda: admin.Snapshot(pb.SnapshotRequest(), metadata=self._metadata))
        pools = []
        for p in r.pools:
            pool: dict[str, Any] = {name: getattr(p, name) for name in _POOL_FIELDS}
            pool["pending_by_class"] = dict(zip(CLASSES, p.pending_by_class))
            pool["groups"] = [{"labels": dict(g.labels), "capacity": g.capacity, "busy": g.busy} for g in p.groups]
            pools.append(pool)
        return {"pools": pools, "totals": dict(r.totals), "live_tasks": r.live_tasks, "running": r.running,
                "pending": r.pending, "workers_connected": r.workers_connected, "at": r.at_unix_ns / NS,
                "metrics_window": r.metrics_window_s, "unavailable_shards": list(r.unavailable_shards)}


_POOL_FIELDS = ("name", *(field.wire for field in POOL_FIELDS if field.kind != "classes"))

