"""The service layer: one admission path and one authorization check for
every transport (the gRPC services and the HTTP/JSON gateway).

Requests and responses are the cronoq.v1 protobuf messages, which is the
data model both transports share (the gateway maps JSON onto them). Each
call takes the authenticated ``Principal``, checks its role and pool scope,
converts the wire task into a ``cronoq.Task`` within the configured
[limits], calls the scheduler, and maps what it raises to a
``ServiceError``. Nothing here knows about gRPC.

Pool scope: a credential limited to some pools cannot see tasks of other
pools (they are NOT_FOUND, exactly like tasks that do not exist), cannot
submit into other pools (PERMISSION_DENIED), and cannot reuse a key that a
task of another pool holds (ALREADY_EXISTS). Tenant pinning: a credential
with a tenant submits for it (naming another tenant is PERMISSION_DENIED)
and sees and changes only that tenant's tasks: the others are NOT_FOUND in
lookups, missing from listings and streams, and their keys and ids are
taken (ALREADY_EXISTS) or unknown dependencies, as for pool scope.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import math
import time
from collections import OrderedDict, deque
from typing import TYPE_CHECKING, Any, AsyncIterator, Iterable, cast

from .._proto import cronoq_pb2 as pb
from ..core.errors import EventsLagged, TaskFailed, UnknownTask
from ..core.snapshot import Checkpoint
from ..core.types import CLASSES, NS, TERMINAL, Dep, RetryPolicy, TaskSpec
from .auth import Principal
from .codec import OCTETS, Blob, check_content_type
from .config import RecurringSection, RetrySection, ServerConfig
from .errors import Code, ServiceError, from_exception

if TYPE_CHECKING:
    from ..core.snapshot import Snapshot
    from ..runtime.scheduler import Scheduler
    from .remote import WorkerHub

__all__ = ["Service", "InfoCache", "TaskMeta", "LiveFeed", "status_enum", "status_name"]

log = logging.getLogger("cronoq.server")

_PRIORITY_IN = {pb.PRIORITY_UNSPECIFIED: 2, pb.PRIORITY_CRITICAL: 0, pb.PRIORITY_HIGH: 1,
                pb.PRIORITY_NORMAL: 2, pb.PRIORITY_LOW: 3}
_PRIORITY_OUT = (pb.PRIORITY_CRITICAL, pb.PRIORITY_HIGH, pb.PRIORITY_NORMAL, pb.PRIORITY_LOW)
_EDGE = {pb.EDGE_COND_UNSPECIFIED: "success", pb.EDGE_COND_ON_SUCCESS: "success",
         pb.EDGE_COND_ON_FAILURE: "failure", pb.EDGE_COND_ON_COMPLETE: "complete"}
_EDGE_OUT = {"success": pb.EDGE_COND_ON_SUCCESS, "failure": pb.EDGE_COND_ON_FAILURE,
             "complete": pb.EDGE_COND_ON_COMPLETE}
_MISS = {pb.MISS_POLICY_UNSPECIFIED: None, pb.MISS_POLICY_RUN_LATE: "run_late", pb.MISS_POLICY_SKIP: "skip",
         pb.MISS_POLICY_FAIL: "fail"}
_OVERLAP_IN = {pb.OVERLAP_UNSPECIFIED: "skip", pb.OVERLAP_SKIP: "skip", pb.OVERLAP_ALLOW: "allow",
               pb.OVERLAP_QUEUE: "queue", pb.OVERLAP_QUEUE_ON_SUCCESS: "queue_on_success"}
_OVERLAP_OUT = {"skip": pb.OVERLAP_SKIP, "allow": pb.OVERLAP_ALLOW, "queue": pb.OVERLAP_QUEUE,
                "queue_on_success": pb.OVERLAP_QUEUE_ON_SUCCESS}


def status_enum(status: str) -> pb.TaskStatus:
    return cast("pb.TaskStatus", pb.TaskStatus.Value("TASK_STATUS_" + status.upper()))


def status_name(value: int) -> str:
    return pb.TaskStatus.Name(value)[len("TASK_STATUS_"):].lower()


def checkpoint_message(checkpoint: Checkpoint) -> pb.StageCheckpoint:
    """A checkpoint on the wire: the data and content type the worker sent."""
    out = pb.StageCheckpoint(stage=checkpoint.stage, attempt=checkpoint.attempt,
                             saved_unix_ns=int(round(checkpoint.at * NS)))
    data = checkpoint.data
    if isinstance(data, Blob):
        out.data = data.data
        out.content_type = data.content_type
    return out


def _now_ns() -> int:
    return time.time_ns()


# ---------------------------------------------------------------- the info cache

# Dead-lettered tasks whose payload and options the leader keeps, to submit them again.
DEAD_LETTERS_KEPT = 1000
# Attempts of one task that Get reports (the latest ones).
ATTEMPTS_KEPT = 32


class TaskMeta:
    """What the serving leader remembers of a task beyond the engine's record."""

    __slots__ = ("pool", "key", "kind", "priority", "tenant", "tags", "max_attempts", "created_ns",
                 "started_ns", "finished_ns", "spec", "edges", "attempts")

    def __init__(self, spec: TaskSpec, pool: str, max_attempts: int, created_ns: int) -> None:
        # The submitted task (the engine holds the same object while the task
        # lives): kept after it ends only if it was dead-lettered, to submit it again.
        self.spec: TaskSpec | None = spec
        self.pool = pool
        self.key = spec.key
        self.kind = spec.kind
        self.priority = spec.priority
        self.tenant = spec.tenant
        self.tags = spec.tags
        self.max_attempts = max_attempts
        self.created_ns = created_ns
        self.started_ns: int | None = None
        self.finished_ns: int | None = None
        self.edges = spec.edges
        # [attempt, how it ended (None while it runs), message, started_ns, ended_ns], oldest first
        self.attempts: list[list[Any]] | None = None


# Tasks whose events arrived before their record was made (see InfoCache.early).
EARLY_KEPT = 4096
EARLY_EVENTS = 4 * ATTEMPTS_KEPT   # events kept of one such task


class InfoCache:
    """A bounded record of recent tasks (oldest forgotten first), kept up to
    date by the scheduler's status events.

    A task's first events can arrive before its record exists: with a store,
    the submit's answer and the events of the task's first attempt are
    released by the same commit, in no set order, and the record is made
    when the answer arrives. Such events wait in ``early`` (the newest
    ``EARLY_KEPT`` tasks' worth) and are applied when the record is put."""

    def __init__(self, limit: int, dead_letters: int = DEAD_LETTERS_KEPT) -> None:
        self.limit = limit
        self.entries: OrderedDict[int, TaskMeta] = OrderedDict()
        self.dead_letters = dead_letters
        self.dead: deque[int] = deque()     # dead-lettered tasks whose spec is kept, oldest first
        self.early: OrderedDict[int, list[tuple[str, int, int, str | None]]] = OrderedDict()

    def put(self, task_id: int, meta: TaskMeta) -> None:
        if not self.limit:
            return
        entries = self.entries
        entries[task_id] = meta
        if len(entries) > self.limit:
            entries.popitem(last=False)
        seen = self.early.pop(task_id, None)
        if seen is not None:
            for status, at_ns, attempt, message in seen:
                self.saw(task_id, status, at_ns, attempt, message)

    def clear(self) -> None:
        self.entries.clear()
        self.early.clear()

    def get(self, task_id: int) -> TaskMeta | None:
        return self.entries.get(task_id)

    def saw(self, task_id: int, status: str, at_ns: int, attempt: int = 0, message: str | None = None) -> None:
        meta = self.entries.get(task_id)
        if meta is None:
            if self.limit:
                early = self.early.get(task_id)
                if early is None:
                    early = self.early[task_id] = []
                    if len(self.early) > EARLY_KEPT:
                        self.early.popitem(last=False)
                if len(early) < EARLY_EVENTS:
                    early.append((status, at_ns, attempt, message))
            return
        attempts = meta.attempts
        if attempts and attempts[-1][4] is None:   # the attempt running ends with whatever comes next
            last = attempts[-1]
            last[4] = at_ns
            if status != "running":
                last[1] = status
                last[2] = message or ""
        if status == "running":
            meta.started_ns = at_ns
            if attempts is None:
                attempts = meta.attempts = []
            attempts.append([attempt, None, "", at_ns, None])
            if len(attempts) > ATTEMPTS_KEPT:
                del attempts[0]
        elif status in TERMINAL:
            meta.finished_ns = at_ns
            if status != "dead_lettered":
                meta.spec = None
            elif meta.spec is not None:
                self.dead.append(task_id)
                while len(self.dead) > self.dead_letters:
                    oldest = self.entries.get(self.dead.popleft())
                    if oldest is not None:
                        oldest.spec = None


# ---------------------------------------------------------------- push streams


class LiveFeed:
    """The status events of one push stream (the gateway's Server-Sent
    Events): delivered on the scheduler's loop without ever blocking it,
    buffered up to ``capacity`` (the oldest dropped and counted in
    ``lagged``), taken in batches by the stream's writer."""

    def __init__(self, capacity: int, pools: frozenset[str] | None, tenant: str | None = None) -> None:
        self.capacity = capacity
        self.pools = pools
        self.tenant = tenant      # a pinned caller's: only its tasks' events
        self.events: deque[Any] = deque()
        self.lagged = 0
        self.ended = False
        self.wake = asyncio.Event()

    def deliver(self, event: Any) -> None:
        if self.pools is not None and event.pool not in self.pools:
            return
        if self.tenant is not None and event.tenant != self.tenant:
            return
        self.events.append(event)
        if len(self.events) > self.capacity:
            self.events.popleft()
            self.lagged += 1
        self.wake.set()

    def end(self) -> None:
        self.ended = True
        self.wake.set()

    def take(self) -> tuple[list[Any], int]:
        """Every buffered event, and how many were dropped since the last take."""
        events, lagged = list(self.events), self.lagged
        self.events.clear()
        self.lagged = 0
        self.wake.clear()
        return events, lagged


# ---------------------------------------------------------------- the service


class Service:
    """The calls of the Tasks and Admin services (see the module docstring)."""

    def __init__(self, config: ServerConfig, hub: WorkerHub) -> None:
        self.config = config
        self.limits = config.limits
        self.hub = hub
        self.pools = [p.name for p in config.pools]
        self.pool_sections = {p.name: p for p in config.pools}
        self.default_pool = "default" if "default" in self.pool_sections else self.pools[0]
        self.scheduler: Scheduler | None = None
        self.state = "standby"           # standby, leader, stopping
        self.info = InfoCache(config.outputs.info_entries)
        self.watchers = 0
        self._events: asyncio.Task[None] | None = None

    # -- serving

    def serving(self) -> Scheduler:
        """The scheduler, if this server leads and is not stopping; else UNAVAILABLE."""
        sched = self.scheduler
        if self.state != "leader" or sched is None or not sched.running:
            raise ServiceError(Code.UNAVAILABLE, "not the leader (standby or shutting down): retry with backoff")
        return sched

    def check_serving(self) -> None:
        self.serving()

    def lead(self, sched: Scheduler) -> None:
        self.scheduler = sched
        self.state = "leader"
        self._events = asyncio.get_running_loop().create_task(self._follow(sched))

    def step_down(self, state: str = "standby") -> None:
        self.state = state
        if state == "standby":
            self.scheduler = None
            self.info.clear()
            if self._events is not None:
                self._events.cancel()
                self._events = None

    async def _follow(self, sched: Scheduler) -> None:
        """Keep the info cache's times up to date from the status events."""
        try:
            async with sched.events() as events:
                async for event in events:
                    if event.stage is None:   # a stage completed: the attempt started earlier
                        self.info.saw(event.id, event.status, int(event.at * NS), event.attempt, event.message)
        except asyncio.CancelledError:
            pass

    # -- pools and scope

    def _pool_filter(self, caller: Principal, names: Iterable[str]) -> list[str] | None:
        """The pools a listing covers: those named (each known and visible), or
        every pool the caller sees (None: all of them)."""
        names = list(names)
        if not names:
            return None if caller.pools is None else caller.visible(self.pools)
        for name in names:
            if name not in self.pool_sections:
                raise ServiceError(Code.NOT_FOUND, f"no pool named {name!r}", "UnknownPool")
            if not caller.sees(name):
                raise ServiceError(Code.PERMISSION_DENIED, f"the credential may not use pool {name!r}")
        return sorted(set(names))

    def _not_found(self, ref: int | str) -> ServiceError:
        return ServiceError(Code.NOT_FOUND, str(UnknownTask(ref)), "UnknownTask")

    @staticmethod
    def _ref(message: pb.TaskRef, what: str = "task") -> int | str:
        which = message.WhichOneof("ref")
        if which == "id":
            if message.id == 0:
                raise ServiceError(Code.INVALID_ARGUMENT, f"{what}: ids start at 1", "InvalidTask")
            return int(message.id)
        if which == "key":
            if not message.key or "\x00" in message.key:
                raise ServiceError(Code.INVALID_ARGUMENT, f"{what}: a key must be non-empty and without NUL",
                                   "InvalidTask")
            return message.key
        raise ServiceError(Code.INVALID_ARGUMENT, f"{what}: give an id or a key", "InvalidTask")

    # -- converting a wire task

    def _check_text(self, value: str, field: str, limit: int) -> None:
        if "\x00" in value:
            raise ServiceError(Code.INVALID_ARGUMENT, f"{field} must not contain NUL characters", "InvalidTask")
        if len(value) * 4 > limit and len(value.encode("utf-8", "surrogatepass")) > limit:
            raise ServiceError(Code.INVALID_ARGUMENT, f"{field} is longer than {limit} bytes (limits)",
                               "InvalidTask")

    def task_options(self, caller: Principal, spec: pb.TaskSpec, *, template: bool = False
                     ) -> tuple[Blob, dict[str, Any]]:
        """The payload and ``cronoq.Task`` options of a wire task, checked
        against the caller's scope and tenant and the [limits]."""
        limits = self.limits
        invalid = Code.INVALID_ARGUMENT
        try:
            content_type = check_content_type(spec.content_type) if spec.content_type else OCTETS
        except ValueError as exc:
            raise ServiceError(invalid, str(exc), "InvalidTask") from None
        options: dict[str, Any] = {}
        pool = spec.pool or self.default_pool
        self._check_text(pool, "pool", limits.max_name_bytes)
        if pool not in self.pool_sections:
            raise ServiceError(Code.NOT_FOUND, f"no pool named {pool!r}", "UnknownPool")
        if not caller.sees(pool):
            raise ServiceError(Code.PERMISSION_DENIED, f"the credential may not submit into pool {pool!r}")
        if spec.pool and pool != self.default_pool:
            options["pool"] = pool      # (the default pool is the engine's too: a plain task stays plain)
        if spec.kind:
            self._check_text(spec.kind, "kind", limits.max_name_bytes)
            options["kind"] = spec.kind
        if spec.priority not in _PRIORITY_IN:
            raise ServiceError(invalid, f"unknown priority {spec.priority}", "InvalidTask")
        if _PRIORITY_IN[spec.priority] != 2:
            options["priority"] = CLASSES[_PRIORITY_IN[spec.priority]]
        if spec.key:
            self._check_text(spec.key, "key", limits.max_key_bytes)
            options["key"] = spec.key
        tenant = spec.tenant or None
        if tenant is not None:
            self._check_text(tenant, "tenant", limits.max_name_bytes)
        if caller.tenant is not None:
            if tenant is not None and tenant != caller.tenant:
                raise ServiceError(Code.PERMISSION_DENIED,
                                   f"the credential submits for tenant {caller.tenant!r}, not {tenant!r}")
            tenant = caller.tenant
        if tenant is not None:
            options["tenant"] = tenant
        pairs = (("deadline_in_s", "deadline_unix_ns", "deadline"), ("start_in_s", "start_unix_ns", "start"))
        for relative, absolute, name in pairs:
            has_rel, has_abs = spec.HasField(relative), spec.HasField(absolute)
            if has_rel and has_abs:
                raise ServiceError(invalid, f"give {relative} or {absolute}, not both", "InvalidTask")
            if template and (has_abs or (name == "start" and has_rel)):
                raise ServiceError(invalid, f"a recurring template may not set {absolute if has_abs else relative}: "
                                            f"it describes every occurrence", "InvalidTask")
            if has_rel:
                options[f"{name}_in"] = self._seconds(getattr(spec, relative), relative)
            elif has_abs:
                options[f"{name}_at"] = getattr(spec, absolute) / NS
        for field, option in (("tolerance_s", "tolerance"), ("timeout_s", "timeout"),
                              ("duration_hint_s", "duration_hint")):
            if spec.HasField(field):
                options[option] = self._seconds(getattr(spec, field), field)
        miss = _MISS.get(spec.on_miss, "?")
        if miss == "?":
            raise ServiceError(invalid, f"unknown on_miss {spec.on_miss}", "InvalidTask")
        if miss is not None:
            options["on_miss"] = miss
        if spec.HasField("retry"):
            r = spec.retry
            try:
                options["retry"] = RetryPolicy(
                    max_attempts=r.max_attempts or 3,
                    initial_backoff=r.initial_backoff_s if r.HasField("initial_backoff_s") else 1.0,
                    multiplier=r.multiplier if r.HasField("multiplier") else 2.0,
                    max_backoff=r.max_backoff_s if r.HasField("max_backoff_s") else 60.0,
                    jitter=r.jitter if r.HasField("jitter") else True)
            except ValueError as exc:
                raise ServiceError(invalid, f"retry: {exc}", "InvalidTask") from None
        if spec.resources:
            if len(spec.resources) > limits.max_resources:
                raise ServiceError(invalid, f"at most {limits.max_resources} resources per task (limits)",
                                   "InvalidTask")
            for name in spec.resources:
                self._check_text(name, "resource name", limits.max_name_bytes)
            options["resources"] = dict(spec.resources)
        edges = len(spec.after) + len(spec.deps)
        if edges:
            if template:
                raise ServiceError(invalid, "a recurring template may not have dependencies", "InvalidTask")
            if edges > limits.max_deps:
                raise ServiceError(invalid, f"at most {limits.max_deps} dependencies per task (limits)",
                                   "InvalidTask")
            if spec.after:
                options["after"] = [self._ref(ref, "after") for ref in spec.after]
            if spec.deps:
                options["deps"] = [Dep(self._ref(d.ref, "deps"), _EDGE.get(d.cond, "success")) for d in spec.deps]
        for field, limit in (("tags", limits.max_tags), ("labels", limits.max_labels)):
            items = getattr(spec, field)
            if items:
                if len(items) > limit:
                    raise ServiceError(invalid, f"at most {limit} {field} per task (limits)", "InvalidTask")
                for name, value in items.items():
                    self._check_text(name, f"{field} name", limits.max_name_bytes)
                    self._check_text(value, f"{field}[{name!r}]", limits.max_value_bytes)
                options[field] = dict(items)
        if spec.stages:
            options["stages"] = list(spec.stages)   # checked by TaskSpec (InvalidTask names the problem)
        return Blob(bytes(spec.payload), content_type), options

    @staticmethod
    def _seconds(value: float, field: str) -> float:
        if not math.isfinite(value) or value < 0:
            raise ServiceError(Code.INVALID_ARGUMENT, f"{field} must be a finite number of seconds >= 0, "
                                                      f"got {value!r}", "InvalidTask")
        return value

    def _make(self, caller: Principal, spec: pb.TaskSpec, index: int | None = None) -> TaskSpec:
        try:
            payload, options = self.task_options(caller, spec)
            return TaskSpec(payload, **options)
        except ServiceError as exc:
            if index is not None:
                exc.message = f"task {index} of the batch: {exc.message}"
                exc.args = (exc.message,)
            raise
        except Exception as exc:
            error = from_exception(exc.at_index(index) if index is not None and hasattr(exc, "at_index") else exc)
            raise error from None

    async def _check_scope(self, sched: Scheduler, caller: Principal, specs: list[TaskSpec]) -> None:
        """A key held by a task the caller cannot see (another pool's, or
        another tenant's) is a conflict; a dependency on such a task is an
        unknown dependency."""
        if caller.pools is None and caller.tenant is None:
            return
        keys = {spec.key for spec in specs if spec.key is not None}
        for i, spec in enumerate(specs):
            if spec.key is not None:
                try:
                    info = await sched.info(spec.key)
                except UnknownTask:
                    pass
                else:
                    if not caller.sees(info.pool):
                        raise ServiceError(Code.ALREADY_EXISTS,
                                           f"{'task %d of the batch: ' % i if len(specs) > 1 else ''}the key "
                                           f"{spec.key!r} is used by a task of a pool this credential cannot use")
                    if not caller.owns(info.tenant):
                        raise ServiceError(Code.ALREADY_EXISTS,
                                           f"{'task %d of the batch: ' % i if len(specs) > 1 else ''}the key "
                                           f"{spec.key!r} is used by a task of another tenant")
            for ref, _ in spec.edges:
                if isinstance(ref, str) and ref in keys:
                    continue
                try:
                    info = await sched.info(ref)
                except UnknownTask:
                    continue
                if not caller.sees(info.pool) or not caller.owns(info.tenant):
                    what = f"key {ref!r}" if isinstance(ref, str) else f"id {ref}"
                    prefix = f"task {i} of the batch: " if len(specs) > 1 else ""
                    raise ServiceError(Code.INVALID_ARGUMENT, f"{prefix}no task with {what}", "UnknownDependency")

    def _remember(self, sched: Scheduler, spec: TaskSpec, task_id: int, duplicate: bool, now: int) -> None:
        if duplicate or not self.info.limit:
            return
        pool = spec.pool or self.default_pool
        if spec.retry is not None:
            max_attempts = spec.retry.max_attempts
        else:
            section = self.pool_sections[pool].retry
            max_attempts = section.max_attempts if section is not None else 3
        self.info.put(task_id, TaskMeta(spec, pool, max_attempts, now))

    # -- Tasks

    async def submit(self, caller: Principal, request: pb.SubmitRequest) -> pb.SubmitResponse:
        caller.require("client")
        sched = self.serving()
        spec = self._make(caller, request.task)
        await self._check_scope(sched, caller, [spec])
        now = _now_ns()
        try:
            handles = await sched.submit_batch([spec])
        except Exception as exc:
            raise self._single(exc) from None
        handle = handles[0]
        self._remember(sched, spec, handle.id, handle.duplicate, now)
        response = pb.SubmitResponse(id=handle.id, duplicate=handle.duplicate)
        if request.wait:
            timeout = self._timeout(request.wait_timeout_s if request.HasField("wait_timeout_s") else None,
                                    "wait_timeout_s")
            response.result.CopyFrom(await self._await(handle, timeout))
        return response

    @staticmethod
    def _single(exc: Exception) -> ServiceError:
        # A one-task batch: its errors name no index.
        index = getattr(exc, "index", None)
        message = getattr(exc, "message", None)
        if index is not None and message is not None:
            exc = type(exc)(message)
        return from_exception(exc)

    async def submit_batch(self, caller: Principal, request: pb.SubmitBatchRequest) -> pb.SubmitBatchResponse:
        caller.require("client")
        sched = self.serving()
        if len(request.tasks) > self.limits.max_tasks_per_batch:
            raise ServiceError(Code.INVALID_ARGUMENT, f"a batch holds at most {self.limits.max_tasks_per_batch} "
                                                      f"tasks (limits), got {len(request.tasks)}", "InvalidTask")
        specs = [self._make(caller, task, i) for i, task in enumerate(request.tasks)]
        response = pb.SubmitBatchResponse()
        if not specs:
            return response
        await self._check_scope(sched, caller, specs)
        now = _now_ns()
        try:
            ids = await sched.submit_batch(specs)
        except Exception as exc:
            raise from_exception(exc) from None
        for spec, handle in zip(specs, ids):
            self._remember(sched, spec, handle.id, handle.duplicate, now)
            response.tasks.add(id=handle.id, duplicate=handle.duplicate)
        return response

    def _timeout(self, requested: float | None, field: str) -> float:
        limit = self.limits.max_wait_s
        if requested is None:
            return limit
        if not math.isfinite(requested) or requested < 0:
            raise ServiceError(Code.INVALID_ARGUMENT, f"{field} must be a finite number of seconds >= 0",
                               "InvalidTask")
        return min(requested, limit)

    async def _await(self, handle: Any, timeout: float) -> pb.TaskResult:
        if not handle.done():
            async def settle() -> None:
                try:
                    await handle
                except TaskFailed:
                    pass

            try:
                await asyncio.wait_for(settle(), timeout)
            except asyncio.TimeoutError:
                raise ServiceError(Code.DEADLINE_EXCEEDED,
                                   f"task {handle.id} is still running after {timeout:g} s; wait again or poll") from None
        return self._result(handle)

    def _result(self, handle: Any) -> pb.TaskResult:
        result = pb.TaskResult(id=handle.id)
        try:
            output = handle.result()
        except TaskFailed as exc:
            if exc.status == "shutdown":
                raise ServiceError(Code.UNAVAILABLE, "the server stopped serving while waiting; "
                                                     "wait again (on the new leader)") from None
            result.status = status_enum(exc.status)
            if exc.message:
                result.message = exc.message
            return result
        result.status = pb.TASK_STATUS_SUCCEEDED
        result.output_available = True
        if isinstance(output, Blob):
            result.output = output.data
            result.content_type = output.content_type
        return result

    async def _lookup(self, caller: Principal, sched: Scheduler, ref: int | str) -> Any:
        """The engine's TaskInfo of a task the caller may see, or the store's
        record of one the engine no longer retains; NOT_FOUND otherwise."""
        try:
            info = await sched.info(ref)
        except UnknownTask:
            info = None
        except Exception as exc:
            raise from_exception(exc) from None
        if info is None:
            find = getattr(sched.store, "find_task", None)
            if find is not None:
                try:
                    info = await find(ref)
                except Exception as exc:
                    raise from_exception(exc) from None
        if info is None or not caller.sees(info.pool) or not caller.owns(info.tenant):
            raise self._not_found(ref)
        return info

    async def get(self, caller: Principal, request: pb.GetRequest) -> pb.TaskInfo:
        caller.require("client")
        sched = self.serving()
        info = await self._lookup(caller, sched, self._ref(request.task))
        return self._info_message(sched, info)

    def _info_message(self, sched: Scheduler, info: Any) -> pb.TaskInfo:
        out = pb.TaskInfo(id=info.id, status=status_enum(info.status), pool=info.pool, kind=info.kind or "",
                          attempt=info.attempt)
        if info.key is not None:
            out.key = info.key
        if info.message:
            out.message = info.message
        meta = self.info.get(info.id)
        record = info if hasattr(info, "has_output") else None
        out.output_available = info.status == "succeeded" and (record is None or record.has_output)
        if meta is not None:
            out.priority = _PRIORITY_OUT[meta.priority]
            out.max_attempts = meta.max_attempts
            out.created_unix_ns = meta.created_ns
            if meta.started_ns is not None:
                out.started_unix_ns = meta.started_ns
            if meta.finished_ns is not None:
                out.finished_unix_ns = meta.finished_ns
            if meta.tenant:
                out.tenant = meta.tenant
            if meta.tags:
                out.tags.update(meta.tags)
            for ref, cond in meta.edges:
                target = pb.TaskRef(id=ref) if isinstance(ref, int) else pb.TaskRef(key=ref)
                out.deps.add(ref=target, cond=_EDGE_OUT[cond])
            for number, ended, message, started_ns, ended_ns in meta.attempts or ():
                item = out.attempts.add(attempt=number, message=message, started_unix_ns=started_ns)
                if ended is not None:
                    item.status = status_enum(ended)
                if ended_ns is not None:
                    item.ended_unix_ns = ended_ns
        elif record is not None:
            out.priority = _PRIORITY_OUT[record.priority]
            out.created_unix_ns = record.submitted_ns
            if record.finished_ns is not None:
                out.finished_unix_ns = record.finished_ns
        if not out.tenant and info.tenant:
            out.tenant = info.tenant
        stages = getattr(info, "stages", None)   # (a store's record has neither)
        if stages:
            out.stages.extend(stages)
        for checkpoint in getattr(info, "checkpoints", ()):
            out.checkpoints.append(checkpoint_message(checkpoint))
        return out

    async def wait(self, caller: Principal, request: pb.WaitRequest) -> pb.TaskResult:
        caller.require("client")
        sched = self.serving()
        timeout = self._timeout(request.timeout_s if request.HasField("timeout_s") else None, "timeout_s")
        ref = self._ref(request.task)
        info = await self._lookup(caller, sched, ref)
        if hasattr(info, "has_output"):   # only the store knows it now
            return await self._stored_result(sched, info)
        try:
            handle = await sched.handle(info.id)
        except UnknownTask:
            raise self._not_found(ref) from None
        except Exception as exc:
            raise from_exception(exc) from None
        return await self._await(handle, timeout)

    async def _stored_result(self, sched: Scheduler, record: Any) -> pb.TaskResult:
        result = pb.TaskResult(id=record.id, status=status_enum(record.status))
        if record.status not in TERMINAL:   # the engine should know a live task: it is being recovered
            raise ServiceError(Code.UNAVAILABLE, "the task is not loaded yet; wait again")
        if record.message:
            result.message = record.message
        if record.status == "succeeded" and record.has_output:
            try:
                data = await sched.store.load_output(record.id)
            except Exception as exc:
                raise from_exception(exc) from None
            if data is not None:
                blob = sched.codec.decode(data)
                result.output = blob.data
                result.content_type = blob.content_type
                result.output_available = True
        return result

    async def cancel(self, caller: Principal, request: pb.CancelRequest) -> pb.CancelResponse:
        caller.require("client")
        sched = self.serving()
        ref = self._ref(request.task)
        info = await self._lookup(caller, sched, ref)
        if hasattr(info, "has_output"):
            return pb.CancelResponse(cancelled=False)   # finished long ago
        try:
            cancelled = await sched.cancel(info.id)
        except UnknownTask:
            return pb.CancelResponse(cancelled=False)
        except Exception as exc:
            raise from_exception(exc) from None
        return pb.CancelResponse(cancelled=cancelled)

    async def list_tasks(self, caller: Principal, request: pb.ListTasksRequest, *, priority: str | None = None,
                         tenant: str | None = None) -> pb.ListTasksResponse:
        """ListTasks; the HTTP gateway also filters by ``priority`` (a class
        name) and ``tenant``. A caller pinned to a tenant lists only its own."""
        if caller.tenant is not None:
            if tenant is not None and tenant != caller.tenant:
                raise ServiceError(Code.PERMISSION_DENIED,
                                   f"the credential sees the tasks of tenant {caller.tenant!r}, not {tenant!r}")
            tenant = caller.tenant
        if priority is not None or tenant is not None:
            return await self._list_filtered(caller, request, priority, tenant)
        return await self._list_page(caller, request)

    async def _list_page(self, caller: Principal, request: pb.ListTasksRequest) -> pb.ListTasksResponse:
        caller.require("client")
        sched = self.serving()
        pools = self._pool_filter(caller, request.pools)
        statuses = None
        if request.statuses:
            if pb.TASK_STATUS_UNSPECIFIED in request.statuses:
                raise ServiceError(Code.INVALID_ARGUMENT, "statuses: TASK_STATUS_UNSPECIFIED is not a status")
            try:
                statuses = sorted({status_name(s) for s in request.statuses})
            except ValueError:
                raise ServiceError(Code.INVALID_ARGUMENT, "statuses: unknown status value") from None
        limit = request.limit or 100
        limit = min(limit, self.limits.max_list)
        response = pb.ListTasksResponse()
        if pools == []:
            return response
        try:
            infos = await sched.list_tasks(pools=pools, statuses=statuses, after=int(request.after),
                                           limit=limit + 1)
        except Exception as exc:
            raise from_exception(exc) from None
        more = len(infos) > limit
        for info in infos[:limit]:
            response.tasks.append(self._info_message(sched, info))
        if more:
            response.next_after = infos[limit - 1].id
        return response

    async def _list_filtered(self, caller: Principal, request: pb.ListTasksRequest, priority: str | None,
                             tenant: str | None) -> pb.ListTasksResponse:
        """A page of the tasks whose class and tenant match, scanning at most
        ``limits.max_list`` tasks per call: a page can hold fewer tasks than
        asked while ``next_after`` still leads on."""
        wanted_class = None if priority is None else CLASSES.index(priority)
        limit = min(request.limit or 100, self.limits.max_list)
        budget = self.limits.max_list
        after = int(request.after)
        response = pb.ListTasksResponse()
        while True:
            scan = pb.ListTasksRequest(pools=request.pools, statuses=request.statuses, after=after,
                                       limit=min(budget, max(limit * 4, 100)))
            page = await self._list_page(caller, scan)
            budget -= len(page.tasks)
            for info in page.tasks:
                after = info.id
                if wanted_class is not None and _PRIORITY_IN[info.priority] != wanted_class:
                    continue
                if tenant is not None and info.tenant != tenant:
                    continue
                response.tasks.append(info)
                if len(response.tasks) == limit:
                    break
            if len(response.tasks) == limit:
                if page.next_after or after != page.tasks[-1].id:
                    response.next_after = after
                return response
            if not page.next_after:
                return response
            if budget <= 0:
                response.next_after = after
                return response

    async def resubmit(self, caller: Principal, ref: int) -> pb.SubmitResponse:
        """Submit a dead-lettered task again (admin): a new task with its
        payload and options, without its key, dependencies or fixed start,
        tagged ``resubmitted_from``. The leader keeps what that needs for the
        last ``DEAD_LETTERS_KEPT`` dead letters it saw."""
        caller.require("admin")
        sched = self.serving()
        info = await self._lookup(caller, sched, ref)
        if info.status != "dead_lettered":
            raise ServiceError(Code.FAILED_PRECONDITION, f"task {ref} is {info.status}: only dead-lettered tasks can "
                                                         f"be submitted again")
        meta = self.info.get(info.id)
        if meta is None or meta.spec is None:
            raise ServiceError(Code.FAILED_PRECONDITION,
                               f"task {ref}: this server no longer holds its payload (the leader keeps those of the "
                               f"last {self.info.dead_letters} dead letters it saw); submit it again yourself")
        spec = copy.copy(meta.spec)
        for name in ("key", "edges", "start_in_ns", "start_at_ns", "deadline_at_ns"):
            spec.__dict__.pop(name, None)
        spec.tags = {**(meta.spec.tags or {}), "resubmitted_from": str(info.id)}
        spec.plain = False
        now = _now_ns()
        try:
            handles = await sched.submit_batch([spec])
        except Exception as exc:
            raise self._single(exc) from None
        self._remember(sched, spec, handles[0].id, handles[0].duplicate, now)
        # An admin's action, rare: worth a line at info (unlike a task's own events).
        log.info("admin %s submitted dead letter %d again as task %d", caller.name, info.id, handles[0].id,
                 extra={"action": "resubmit", "task_id": info.id, "new_task_id": handles[0].id})
        return pb.SubmitResponse(id=handles[0].id, duplicate=False)

    async def watch(self, caller: Principal, request: pb.WatchRequest) -> AsyncIterator[pb.StatusEvent]:
        caller.require("client")
        sched = self.serving()
        pools = self._pool_filter(caller, request.pools)
        wanted = None if pools is None else frozenset(pools)
        if self.watchers >= self.limits.max_watchers:
            raise ServiceError(Code.RESOURCE_EXHAUSTED,
                               f"the server serves at most {self.limits.max_watchers} Watch streams (limits)")
        terminal_only = request.terminal_only
        self.watchers += 1
        stream = sched.events(on_lag="raise")
        try:
            while True:
                try:
                    event = await stream.__anext__()
                except StopAsyncIteration:
                    break
                except EventsLagged as exc:
                    raise ServiceError(Code.DATA_LOSS, f"the stream fell behind and {exc.skipped} events were "
                                                       f"dropped; reconnect and reconcile with Get") from None
                if wanted is not None and event.pool not in wanted:
                    continue
                if not caller.owns(event.tenant):
                    continue
                if terminal_only and event.status not in TERMINAL:
                    continue
                message = pb.StatusEvent(id=event.id, pool=event.pool, status=status_enum(event.status),
                                         attempt=event.attempt, at_unix_ns=int(round(event.at * NS)))
                if event.key is not None:
                    message.key = event.key
                if event.message:
                    message.message = event.message
                if event.stage is not None:
                    message.stage = event.stage
                yield message
        finally:
            self.watchers -= 1
            stream.close()
        raise ServiceError(Code.UNAVAILABLE, "the server stopped serving; reconnect (to the new leader)")

    def open_feed(self, caller: Principal, pools: Iterable[str], *, events: bool = True
                  ) -> tuple[Scheduler, LiveFeed]:
        """A push stream's feed of status events (the limit of Watch, whose
        streams it counts among; without ``events``, a feed that stays empty).
        ``close_feed`` releases it."""
        sched = self.serving()
        chosen = self._pool_filter(caller, pools)
        if self.watchers >= self.limits.max_watchers:
            raise ServiceError(Code.RESOURCE_EXHAUSTED,
                               f"the server serves at most {self.limits.max_watchers} Watch streams (limits)")
        feed = LiveFeed(self.limits.watch_buffer, None if chosen is None else frozenset(chosen), caller.tenant)
        if events:
            try:
                sched.subscribe(feed)
            except Exception as exc:
                raise from_exception(exc) from None
        self.watchers += 1
        return sched, feed

    def close_feed(self, sched: Scheduler, feed: LiveFeed) -> None:
        self.watchers -= 1
        sched.unsubscribe(feed)   # (nothing happens if it was never subscribed)

    def serves(self, sched: Scheduler) -> bool:
        """Whether ``sched`` is still the scheduler this server serves with."""
        return self.state == "leader" and self.scheduler is sched and sched.running

    # -- Admin

    async def list_workers(self, caller: Principal, request: pb.ListWorkersRequest) -> pb.ListWorkersResponse:
        caller.require("metrics")
        self.serving()
        pools = self._pool_filter(caller, request.pools)
        response = pb.ListWorkersResponse()
        for conn in sorted(self.hub.workers.values(), key=lambda c: c.id):
            if pools is not None and conn.pool not in pools:
                continue
            response.workers.add(id=conn.id, name=conn.name, pool=conn.pool, labels=conn.labels, slots=conn.slots,
                                 busy=len(conn.leases), connected_unix_ns=conn.connected_ns,
                                 health=pb.WORKER_HEALTH_SUSPECT if conn.suspect else pb.WORKER_HEALTH_HEALTHY,
                                 lease_expiries=conn.lease_expiries, last_seen_unix_ns=conn.seen_ns)
        return response

    def worker_health(self, caller: Principal) -> list[tuple[str, int, int, int]]:
        """Per visible pool, for /metrics: (pool, lease expiries of its workers
        and times one was found silent, both since start, suspect workers now)."""
        out = []
        for name in self.pools:
            pool = self.hub.pools.get(name)
            if pool is None or not caller.sees(name):
                continue
            suspect = sum(conn.suspect for workers in pool.groups.values() for conn in workers)
            out.append((name, pool.lease_expiries, pool.suspicions, suspect))
        return out

    async def list_recurring(self, caller: Principal, request: pb.ListRecurringRequest
                             ) -> pb.ListRecurringResponse:
        caller.require("metrics")
        sched = self.serving()
        response = pb.ListRecurringResponse()
        for rec in await sched.recurring():
            if not caller.sees(rec.pool):
                continue
            item = response.schedules.add(name=rec.name, cron=rec.cron, pool=rec.pool, kind=rec.kind,
                                          overlap=_OVERLAP_OUT[rec.overlap])
            if rec.tz.upper() != "UTC":
                item.tz = rec.tz
            if rec.next_at is not None:
                item.next_unix_ns = int(round(rec.next_at * NS))
            if rec.last_task_id is not None:
                item.last_task_id = rec.last_task_id
        return response

    async def add_recurring(self, caller: Principal, request: pb.AddRecurringRequest) -> pb.AddRecurringResponse:
        caller.require("admin")
        sched = self.serving()
        name = request.name
        if not name or "\x00" in name:
            raise ServiceError(Code.INVALID_ARGUMENT, "name must be non-empty and without NUL", "InvalidTask")
        self._check_text(name, "name", self.limits.max_key_bytes)
        if request.overlap not in _OVERLAP_IN:
            raise ServiceError(Code.INVALID_ARGUMENT, f"unknown overlap {request.overlap}", "InvalidTask")
        payload, options = self.task_options(caller, request.template, template=True)
        existing = {rec.name: rec for rec in await sched.recurring()}
        if name in existing and not caller.sees(existing[name].pool):
            raise ServiceError(Code.ALREADY_EXISTS,
                               f"the schedule name {name!r} is used in a pool this credential cannot use")
        tolerance = options.pop("tolerance", None)
        on_miss = options.pop("on_miss", None)
        key = options.pop("key", None)
        try:
            await sched.add_recurring(name, request.cron, payload, tz=request.tz or "UTC",
                                      overlap=_OVERLAP_IN[request.overlap], tolerance=tolerance, on_miss=on_miss,
                                      key=key, **options)
        except Exception as exc:
            raise from_exception(exc) from None
        response = pb.AddRecurringResponse()
        for rec in await sched.recurring():
            if rec.name == name and rec.next_at is not None:
                response.next_unix_ns = int(round(rec.next_at * NS))
        return response

    async def remove_recurring(self, caller: Principal, request: pb.RemoveRecurringRequest
                               ) -> pb.RemoveRecurringResponse:
        caller.require("admin")
        sched = self.serving()
        existing = {rec.name: rec for rec in await sched.recurring()}
        rec = existing.get(request.name)
        if rec is None or not caller.sees(rec.pool):
            return pb.RemoveRecurringResponse(removed=False)
        try:
            removed = await sched.remove_recurring(request.name)
        except Exception as exc:
            raise from_exception(exc) from None
        return pb.RemoveRecurringResponse(removed=removed)

    async def snapshot(self, caller: Principal, request: pb.SnapshotRequest) -> pb.SnapshotResponse:
        caller.require("metrics")
        sched = self.serving()
        snap = await sched.snapshot()
        workers: dict[str, int] = {}
        for conn in self.hub.workers.values():
            workers[conn.pool] = workers.get(conn.pool, 0) + 1
        response = pb.SnapshotResponse(live_tasks=snap.live_tasks, running=snap.running, pending=snap.pending,
                                       at_unix_ns=int(round(snap.at * NS)))
        for view in snap.pools:
            pool = view.as_dict()
            name = pool["name"]
            if not caller.sees(name):
                continue
            section = self.pool_sections[name]
            item = response.pools.add(
                name=name, capacity=pool["capacity"], busy=pool["busy"], held=pool["held"],
                desired=max(section.min, pool["desired"]), pending=pool["pending"],
                pending_by_class=[pool["pending_by_class"][c] for c in CLASSES],
                reservations=pool["reservations"], dispatched=pool["dispatched"], succeeded=pool["succeeded"],
                failed=pool["failed"], priority_adherence=pool["priority_adherence"],
                fixed_start_hit_rate=pool["fixed_start_hit_rate"], utilization=pool["utilization"],
                schedule_efficiency=pool["schedule_efficiency"], wait_p50_s=pool["wait_p50"],
                wait_p90_s=pool["wait_p90"], wait_p99_s=pool["wait_p99"], cost=pool["cost"],
                workers_connected=workers.get(name, 0))
            for group in sorted(pool["groups"], key=lambda g: (len(g["labels"]), sorted(g["labels"].items()))):
                item.groups.add(labels=group["labels"], capacity=group["capacity"], busy=group["busy"])
            response.workers_connected += workers.get(name, 0)
        for name, value in snap.totals.items():
            response.totals[name] = value
        return response

    async def metrics(self, caller: Principal) -> Snapshot:
        """The snapshot /metrics renders: the pools the caller may use (each
        ``desired`` at least the pool's ``min``, as in ``snapshot``); totals
        are the server's."""
        caller.require("metrics")
        sched = self.serving()
        snap = await sched.snapshot()
        pools = []
        for pool in snap.pools:
            if caller.sees(pool.name):
                pool.desired = max(self.pool_sections[pool.name].min, pool.desired)
                pools.append(pool)
        snap.pools = pools
        return snap

    # -- recurring schedules from the configuration

    async def add_configured(self, sched: Scheduler, schedules: Iterable[RecurringSection]) -> None:
        for section in schedules:
            options = recurring_options(section)
            tolerance = options.pop("tolerance", None)
            on_miss = options.pop("on_miss", None)
            key = options.pop("key", None)
            await sched.add_recurring(section.name, section.cron,
                                      Blob(section.payload, section.content_type or OCTETS), tz=section.tz,
                                      overlap=section.overlap, tolerance=tolerance, on_miss=on_miss, key=key,
                                      **options)


def recurring_options(section: RecurringSection) -> dict[str, Any]:
    """``cronoq.Task`` options of a configured schedule's template."""
    options: dict[str, Any] = {}
    renames = {"deadline_in_s": "deadline_in", "tolerance_s": "tolerance", "timeout_s": "timeout",
               "duration_hint_s": "duration_hint"}
    for key, value in section.task.items():
        if isinstance(value, RetrySection):
            value = RetryPolicy(max_attempts=value.max_attempts, initial_backoff=value.initial_backoff_s,
                                multiplier=value.multiplier, max_backoff=value.max_backoff_s, jitter=value.jitter)
        options[renames.get(key, key)] = value
    return options

