"""The service layer: one admission path and one authorization check for
every transport (the gRPC services and the HTTP/JSON gateway).

Requests and responses are the cronoq.v1 protobuf messages, which is the
data model both transports share (the gateway maps JSON onto them). Each
call takes the authenticated ``Principal``, checks its role and pool scope,
converts the wire task into a ``cronoq.Task`` within the configured
[limits] (``convert.TaskReader``), calls the scheduler, and maps what it
raises to a ``ServiceError``; the answers are built by ``convert.py`` and
the leader's records of recent tasks kept in ``info.py``. Nothing here
knows about gRPC.

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
import dataclasses
import logging
import math
import time
from typing import TYPE_CHECKING, Any, AsyncGenerator, AsyncIterator, Iterable, Protocol

from .._proto import cronoq_pb2 as pb
from ..core.actions import StatusEvent
from ..core.errors import EventsLagged, TaskFailed, UnknownTask
from ..core.snapshot import POOL_FIELDS
from ..core.types import CLASSES, NS, TERMINAL, TaskSpec
from ..runtime.listing import stored_max_attempts
from .auth import Principal
from .codec import OCTETS, Blob
from .config import RecurringSection, ServerConfig
from .convert import (
    OVERLAP_IN, OVERLAP_OUT, PRIORITY_IN, TaskReader, check_text, dep_messages, event_message, explanation_message, info_message,
    recurring_options, result_message, status_enum, status_name, task_ref,
)
from .errors import Code, ServiceError, from_exception
from .history import DEFAULT_POINTS, MAX_POINTS, History
from .info import InfoCache, LiveFeed, RecentEvents, TaskMeta

if TYPE_CHECKING:
    from ..core.snapshot import Snapshot
    from ..runtime.scheduler import Scheduler
    from .remote import WorkerHub

__all__ = ["Service", "EventStream", "pool_of", "TIMELINE_MAX_S", "DEPENDENTS_MAX_DEPTH"]

# How many levels down a Dependents call may look.
DEPENDENTS_MAX_DEPTH = 5

log = logging.getLogger("cronoq.server")


class EventStream(Protocol):
    """A Watch stream: status events until it ends; ``aclose`` lets go of it."""

    def __aiter__(self) -> AsyncIterator[pb.StatusEvent]: ...

    async def __anext__(self) -> pb.StatusEvent: ...

    async def aclose(self) -> None: ...

# The snapshot's fields taken from the engine's pools as they are.
_POOL_NUMBERS = tuple((field.wire, field.attr) for field in POOL_FIELDS
                      if field.attr is not None and field.kind != "classes")


# The longest span GET /v1/timeline draws, back and ahead.
TIMELINE_MAX_S = 3600.0


def _holds(info: pb.TaskInfo, text: str) -> bool:
    """Whether a task's key, kind, tenant, message or a tag value holds
    ``text`` (already casefolded)."""
    fields = (info.key, info.kind, info.tenant, info.message, *info.tags.values())
    return any(text in field.casefold() for field in fields if field)


def _now_ns() -> int:
    return time.time_ns()


def pool_of(snapshot: pb.SnapshotResponse, name: str, source: str = "this server") -> pb.PoolSnapshot:
    """``name``'s entry of ``snapshot``; UNAVAILABLE (retry) when ``source`` did not report it."""
    for pool in snapshot.pools:
        if pool.name == name:
            return pool
    raise ServiceError(Code.UNAVAILABLE, f"{source} did not report pool {name!r}; retry")


# ---------------------------------------------------------------- the service


class Service:
    """The calls of the Tasks and Admin services (see the module docstring)."""

    sharded = False   # (cronoq.server.shards.ShardedService answers for every shard)

    def __init__(self, config: ServerConfig, hub: WorkerHub) -> None:
        self.config = config
        self.limits = config.limits
        self.hub = hub
        self.pools = [p.name for p in config.pools]
        self.pool_sections = {p.name: p for p in config.pools}
        self.default_pool = "default" if "default" in self.pool_sections else self.pools[0]
        self.tasks = TaskReader(config.limits, self.pool_sections, self.default_pool)
        self.scheduler: Scheduler | None = None
        self.state = "standby"           # standby, leader, stopping
        self.info = InfoCache(config.outputs.info_entries, preview_bytes=config.outputs.payload_preview_bytes)
        hub.tracebacks = self._traceback
        hub.on_lease = self._leased
        self.watchers = 0
        self.recent = RecentEvents(config.history.events)
        self.history: History | None = None   # the leader's, from the moment it leads
        self._events: asyncio.Task[None] | None = None

    def _leased(self, task_id: int, attempt: int, worker_id: int, worker_name: str) -> None:
        self.info.leased(task_id, attempt, worker_id, worker_name)

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
        self.recent = RecentEvents(self.config.history.events)   # (a new leader's own: its engine's events)
        sched.subscribe(self.recent)
        self.history = History(self.config.history, self.config.pools)   # (empty: none is handed over)
        self.history.start(sched)
        self._events = asyncio.get_running_loop().create_task(self._follow(sched))

    def step_down(self, state: str = "standby") -> None:
        self.state = state
        if state == "standby":
            if self.scheduler is not None:
                self.scheduler.unsubscribe(self.recent)
            if self.history is not None:
                self.history.stop(self.scheduler)
                self.history = None
            self.scheduler = None
            self.info.clear()
            self.recent = RecentEvents(self.config.history.events)
            if self._events is not None:
                self._events.cancel()
                self._events = None

    def _traceback(self, task_id: int, attempt: int, traceback: str) -> None:
        """A worker's traceback of a failed attempt, for Get (the leader's memory only)."""
        self.info.failed_with(task_id, attempt, traceback)

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
                known = ", ".join(caller.visible(self.pools)) or "none the credential may use"
                raise ServiceError(Code.NOT_FOUND, f"no pool named {name!r} (pools: {known})", "UnknownPool")
            if not caller.sees(name):
                raise ServiceError(Code.PERMISSION_DENIED, f"the credential may not use pool {name!r}")
        return sorted(set(names))

    def _not_found(self, ref: int | str) -> ServiceError:
        return ServiceError(Code.NOT_FOUND, str(UnknownTask(ref)), "UnknownTask")

    def task_options(self, caller: Principal, spec: pb.TaskSpec, *, template: bool = False
                     ) -> tuple[Blob, dict[str, Any]]:
        """The payload and ``cronoq.Task`` options of a wire task (``TaskReader.options``)."""
        return self.tasks.options(caller, spec, template=template)

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
        self.info.put(task_id, TaskMeta(spec, pool, max_attempts, now, self.info.preview_bytes))

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
        specs = self._batch_specs(caller, request.tasks)
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

    def _batch_specs(self, caller: Principal, tasks: Iterable[pb.TaskSpec]) -> list[TaskSpec]:
        """A batch's wire tasks as ``cronoq.Task`` specs, before anything is admitted."""
        return [self._make(caller, task, i) for i, task in enumerate(tasks)]

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
            try:
                async with asyncio.timeout(timeout):
                    try:
                        await handle
                    except TaskFailed:
                        pass
            except TimeoutError:
                raise ServiceError(Code.DEADLINE_EXCEEDED,
                                   f"task {handle.id} is still running after {timeout:g} s; wait again or poll") from None
        return result_message(handle)

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
                if info is not None and info.max_attempts is None:   # its pool's policy applied
                    config = next((p.config for p in sched.pools if p.name == info.pool), None)
                    info = dataclasses.replace(info, max_attempts=stored_max_attempts(info, config))
        if info is None or not caller.sees(info.pool) or not caller.owns(info.tenant):
            raise self._not_found(ref)
        return info

    async def get(self, caller: Principal, request: pb.GetRequest) -> pb.TaskInfo:
        caller.require("client")
        sched = self.serving()
        info = await self._lookup(caller, sched, task_ref(request.task))
        return info_message(info, self.info.get(info.id), details=True)

    async def explain(self, caller: Principal, request: pb.ExplainRequest) -> pb.Explanation:
        caller.require("client")
        sched = self.serving()
        info = await self._lookup(caller, sched, task_ref(request.task))
        try:
            explanation = await sched.explain(info.id)
        except UnknownTask:
            # Only the store remembers it now: it ended, so nothing holds it back.
            return explanation_message(None, info, self.info.get(info.id))
        except Exception as exc:
            raise from_exception(exc) from None
        return explanation_message(explanation, info, self.info.get(info.id))

    async def dependents(self, caller: Principal, request: pb.DependentsRequest) -> pb.DependentsResponse:
        """The tasks that depend on a task, level by level up to ``depth``:
        from the engine's live edges (a task that has not ended) and from the
        info cache's reverse index of the remembered tasks' dependencies (which
        still names them once it ended). Dependents the caller cannot see are
        left out."""
        caller.require("client")
        sched = self.serving()
        depth = request.depth or 1
        if depth > DEPENDENTS_MAX_DEPTH:
            raise ServiceError(Code.INVALID_ARGUMENT, f"depth must be at most {DEPENDENTS_MAX_DEPTH}, got {depth}")
        limit = min(request.limit or 100, self.limits.max_list)
        root = await self._lookup(caller, sched, task_ref(request.task))
        response = pb.DependentsResponse(id=root.id, status=status_enum(root.status))
        if root.key:
            response.key = root.key
        found: dict[int, pb.Dependent] = {}
        frontier: list[tuple[int, str | None]] = [(root.id, root.key)]
        for level in range(1, depth + 1):
            following: list[tuple[int, str | None]] = []
            for parent_id, parent_key in frontier:
                for child_id in await self._children(sched, parent_id, parent_key):
                    if child_id == root.id:
                        continue
                    known = found.get(child_id)
                    if known is not None:
                        if parent_id not in known.depends_on:
                            known.depends_on.append(parent_id)
                        continue
                    if len(found) == limit:
                        response.truncated = True
                        continue
                    try:
                        info = await self._lookup(caller, sched, child_id)
                    except ServiceError as exc:
                        if exc.code is Code.NOT_FOUND:
                            continue   # forgotten, or not the caller's to see
                        raise
                    item = found[child_id] = pb.Dependent(id=child_id, status=status_enum(info.status),
                                                          pool=info.pool, depth=level, depends_on=[parent_id])
                    if info.key:
                        item.key = info.key
                    meta = self.info.get(child_id)
                    if meta is not None:
                        item.deps.extend(dep_messages(meta.edges))
                    following.append((child_id, info.key))
            frontier = following
            if not frontier:
                break
        response.dependents.extend(sorted(found.values(), key=lambda d: (d.depth, d.id)))
        return response

    async def _children(self, sched: Scheduler, task_id: int, key: str | None) -> list[int]:
        """The ids of the tasks that declared a dependency on this one: live
        edges first, then the info cache's, without repeats."""
        try:
            live = [child for child, _ in await sched.dependents(task_id)]
        except UnknownTask:
            live = []
        except Exception as exc:
            raise from_exception(exc) from None
        remembered = [child for child, _ in self.info.dependents_of(task_id, key)]
        return list(dict.fromkeys(live + remembered))

    async def wait(self, caller: Principal, request: pb.WaitRequest) -> pb.TaskResult:
        caller.require("client")
        sched = self.serving()
        timeout = self._timeout(request.timeout_s if request.HasField("timeout_s") else None, "timeout_s")
        ref = task_ref(request.task)
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
        ref = task_ref(request.task)
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
        query = request.query
        if query and query.isascii() and query.isdigit():
            return await self._list_by_id(caller, request, int(query), priority, tenant)
        if priority is not None or tenant is not None or query:
            return await self._list_filtered(caller, request, priority, tenant, query.casefold())
        return await self._list_page(caller, request)

    async def _list_by_id(self, caller: Principal, request: pb.ListTasksRequest, task_id: int,
                          priority: str | None, tenant: str | None) -> pb.ListTasksResponse:
        """The answer to an all-digit query: the task of that id, if the
        caller sees it and it passes the other filters."""
        caller.require("client")
        pools = self._pool_filter(caller, request.pools)
        response = pb.ListTasksResponse()
        if not 0 < task_id < 2 ** 64:
            return response
        try:
            info = await self.get(caller, pb.GetRequest(task=pb.TaskRef(id=task_id)))
        except ServiceError as exc:
            if exc.code == Code.NOT_FOUND:
                return response
            raise
        if pools is not None and info.pool not in pools:
            return response
        if request.statuses and info.status not in request.statuses:
            return response
        if priority is not None and PRIORITY_IN[info.priority] != CLASSES.index(priority):
            return response
        if tenant is not None and info.tenant != tenant:
            return response
        if info.id <= request.after or (request.newest_first and request.before and info.id >= request.before):
            return response
        response.tasks.append(info)
        return response

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
                                           limit=limit + 1, newest_first=request.newest_first,
                                           before=int(request.before) if request.newest_first else 0)
        except Exception as exc:
            raise from_exception(exc) from None
        more = len(infos) > limit
        for info in infos[:limit]:
            response.tasks.append(info_message(info, self.info.get(info.id)))
        if more:
            if request.newest_first:
                response.next_before = infos[limit - 1].id
            else:
                response.next_after = infos[limit - 1].id
        return response

    async def _list_filtered(self, caller: Principal, request: pb.ListTasksRequest, priority: str | None,
                             tenant: str | None, text: str = "") -> pb.ListTasksResponse:
        """A page of the tasks whose class and tenant match (and whose key,
        kind, tenant, message or a tag value holds ``text``, casefolded),
        scanning at most ``limits.max_list`` tasks per call: a page can hold
        fewer tasks than asked while its cursor still leads on."""
        wanted_class = None if priority is None else CLASSES.index(priority)
        limit = min(request.limit or 100, self.limits.max_list)
        budget = self.limits.max_list
        newest = request.newest_first
        cursor = int(request.before if newest else request.after)
        response = pb.ListTasksResponse()

        def lead_on(at: int) -> None:
            if newest:
                response.next_before = at
            else:
                response.next_after = at

        while True:
            scan = pb.ListTasksRequest(pools=request.pools, statuses=request.statuses,
                                       after=request.after if newest else cursor, newest_first=newest,
                                       before=cursor if newest else 0, limit=min(budget, max(limit * 4, 100)))
            page = await self._list_page(caller, scan)
            response.unavailable_shards[:] = sorted({*response.unavailable_shards, *page.unavailable_shards})
            budget -= len(page.tasks)
            for info in page.tasks:
                cursor = info.id
                if wanted_class is not None and PRIORITY_IN[info.priority] != wanted_class:
                    continue
                if tenant is not None and info.tenant != tenant:
                    continue
                if text and not _holds(info, text):
                    continue
                response.tasks.append(info)
                if len(response.tasks) == limit:
                    break
            more = page.next_before if newest else page.next_after
            if len(response.tasks) == limit:
                if more or cursor != page.tasks[-1].id:
                    lead_on(cursor)
                return response
            if not more:
                return response
            if budget <= 0:
                lead_on(cursor)
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

    async def watch(self, caller: Principal, request: pb.WatchRequest) -> tuple[EventStream, list[str]]:
        """The Watch stream and the shards it leaves out (none here). Who may
        watch what is checked now, before the first event: a refusal is an
        answer, not a stream that fails later."""
        caller.require("client")
        sched = self.serving()
        pools = self._pool_filter(caller, request.pools)
        if self.watchers >= self.limits.max_watchers:
            raise ServiceError(Code.RESOURCE_EXHAUSTED,
                               f"the server serves at most {self.limits.max_watchers} Watch streams (limits)")
        return self._watch_events(caller, sched, None if pools is None else frozenset(pools), request), []

    async def _watch_events(self, caller: Principal, sched: Scheduler, wanted: frozenset[str] | None,
                            request: pb.WatchRequest) -> AsyncGenerator[pb.StatusEvent, None]:
        terminal_only = request.terminal_only

        def wanted_event(event: StatusEvent) -> bool:
            return (wanted is None or event.pool in wanted) and caller.owns(event.tenant) and (
                not terminal_only or event.status in TERMINAL)

        self.watchers += 1
        # The copy and the subscription in one step: each event comes once, replayed or live.
        replay = [event for event in self.recent.events if wanted_event(event)][-request.recent:] \
            if request.recent else []
        stream = sched.events(on_lag="raise")
        try:
            for event in replay:
                yield event_message(event)
            while True:
                try:
                    event = await stream.__anext__()
                except StopAsyncIteration:
                    break
                except EventsLagged as exc:
                    raise ServiceError(Code.DATA_LOSS, f"the stream fell behind and {exc.skipped} events were "
                                                       f"dropped; reconnect and reconcile with Get") from None
                if wanted_event(event):
                    yield event_message(event)
        finally:
            self.watchers -= 1
            stream.close()
        raise ServiceError(Code.UNAVAILABLE, "the server stopped serving; reconnect (to the new leader)")

    def open_feed(self, caller: Principal, pools: Iterable[str], *, events: bool = True, recent: int = 0
                  ) -> tuple[Scheduler, LiveFeed]:
        """A push stream's feed of status events (the limit of Watch, whose
        streams it counts among; without ``events``, a feed that stays empty),
        starting with up to ``recent`` of the latest events the leader kept.
        ``close_feed`` releases it."""
        sched = self.serving()
        chosen = self._pool_filter(caller, pools)
        if self.watchers >= self.limits.max_watchers:
            raise ServiceError(Code.RESOURCE_EXHAUSTED,
                               f"the server serves at most {self.limits.max_watchers} Watch streams (limits)")
        feed = LiveFeed(self.limits.watch_buffer, None if chosen is None else frozenset(chosen), caller.tenant)
        if events:
            # The copy and the subscription in one step: each event comes once, replayed or live.
            if recent:
                wanted = [event for event in self.recent.events
                          if (feed.pools is None or event.pool in feed.pools) and caller.owns(event.tenant)]
                for event in wanted[-recent:]:
                    feed.deliver(event)
            try:
                sched.subscribe(feed)
            except Exception as exc:
                raise from_exception(exc) from None
        self.watchers += 1
        return sched, feed

    def close_feed(self, sched: Scheduler, feed: LiveFeed) -> None:
        self.watchers -= 1
        sched.unsubscribe(feed)   # (nothing happens if it was never subscribed)

    def worker_elsewhere(self, caller: Principal, pool: str) -> ServiceError | None:
        """Where a worker of ``pool`` should register instead, if another shard serves it."""
        return None

    @property
    def every_pool(self) -> list[str]:
        """The pools this server answers for (with shards, every shard's)."""
        return self.pools

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

    async def timeline(self, caller: Principal, pools: Iterable[str], range_s: float, ahead_s: float
                       ) -> dict[str, Any]:
        """The scheduling of the last ``range_s`` seconds and the next
        ``ahead_s`` (both capped at TIMELINE_MAX_S), as GET /v1/timeline
        answers it: the connected workers, the attempts the leader's info
        cache saw in the window (running ones too; at most limits.max_list
        tasks', the latest), the fixed starts not started yet from the
        engine's reservation calendars, and the slots held for them."""
        caller.require("client")
        sched = self.serving()
        chosen = self._pool_filter(caller, pools)
        wanted = set(self.pools if chosen is None else chosen)
        range_ns = int(min(range_s, TIMELINE_MAX_S) * NS)
        ahead = min(ahead_s, TIMELINE_MAX_S)
        now = _now_ns()
        since = now - range_ns
        workers = [{"id": str(conn.id), "name": conn.name, "pool": conn.pool, "slots": conn.slots}
                   for conn in sorted(self.hub.workers.values(), key=lambda c: c.id) if conn.pool in wanted]
        attempts: list[dict[str, Any]] = []
        for task_id, meta in self.info.active_since(since, self.limits.max_list):
            if meta.pool not in wanted or not caller.owns(meta.tenant):
                continue
            deadline = meta.deadline_ns
            for number, status, message, started, ended, _, worker_id, worker_name in meta.attempts or ():
                if ended is not None and ended < since:
                    continue
                item: dict[str, Any] = {
                    "id": str(task_id), "kind": meta.kind, "pool": meta.pool,
                    "priority": CLASSES[meta.priority], "attempt": number, "max_attempts": meta.max_attempts,
                    "started_unix_ns": str(started),
                    "missed_deadline": deadline is not None and (now if ended is None else ended) > deadline}
                if meta.key is not None:
                    item["key"] = meta.key
                if status is not None:
                    item["status"] = status
                if message:
                    item["message"] = message
                if ended is not None:
                    item["ended_unix_ns"] = str(ended)
                if worker_id is not None:
                    item["worker_id"] = str(worker_id)
                    item["worker_name"] = worker_name
                if deadline is not None:
                    item["deadline_unix_ns"] = str(deadline)
                attempts.append(item)
        attempts.sort(key=lambda a: (int(a["started_unix_ns"]), int(a["id"]), a["attempt"]))
        try:
            booked = await sched.reservations(ahead, sorted(wanted))
        except Exception as exc:
            raise from_exception(exc) from None
        reservations: list[dict[str, Any]] = []
        holds: dict[str, list[str]] = {}
        for r in booked:
            known = self.info.get(r.id)
            if caller.tenant is not None and (known is None or known.tenant != caller.tenant):
                continue
            item = {"id": str(r.id), "kind": r.kind, "pool": r.pool, "start_unix_ns": str(r.start),
                    "tolerance_s": r.tolerance / NS, "held": r.held}
            if r.key is not None:
                item["key"] = r.key
            if r.deadline is not None:
                item["deadline_unix_ns"] = str(r.deadline)
            reservations.append(item)
            if r.held:
                holds.setdefault(r.pool, []).append(str(r.id))
        return {"at_unix_ns": str(now), "range_s": range_ns / NS, "ahead_s": ahead, "workers": workers,
                "attempts": attempts, "reservations": reservations,
                "holds": [{"pool": pool, "held": len(ids), "task_ids": ids}
                          for pool, ids in sorted(holds.items())],
                "unavailable_shards": []}

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
                                          overlap=OVERLAP_OUT[rec.overlap])
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
        check_text(name, "name", self.limits.max_key_bytes)
        if request.overlap not in OVERLAP_IN:
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
                                      overlap=OVERLAP_IN[request.overlap], tolerance=tolerance, on_miss=on_miss,
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
                                       at_unix_ns=int(round(snap.at * NS)), metrics_window_s=snap.window,
                                       environment=self.config.server.environment or "",
                                       region=self.config.server.region or "")
        for view in snap.pools:
            pool = view.as_dict()
            name = pool["name"]
            if not caller.sees(name):
                continue
            section = self.pool_sections[name]
            item = response.pools.add(name=name, **{wire: pool[attr] for wire, attr in _POOL_NUMBERS})
            item.desired = max(section.min, pool["desired"])
            item.pending_by_class.extend(pool["pending_by_class"][c] for c in CLASSES)
            item.workers_connected = workers.get(name, 0)
            for group in sorted(pool["groups"], key=lambda g: (len(g["labels"]), sorted(g["labels"].items()))):
                item.groups.add(labels=group["labels"], capacity=group["capacity"], busy=group["busy"])
            response.workers_connected += workers.get(name, 0)
        for name, value in snap.totals.items():
            response.totals[name] = value
        return response

    async def history_of(self, caller: Principal, request: pb.HistoryRequest) -> pb.HistoryResponse:
        """The leader's history of the pools asked for (each known and
        visible; none asked: every visible pool), downsampled (history.py)."""
        caller.require("metrics")
        self.serving()
        history = self.history
        if history is None:
            raise ServiceError(Code.UNAVAILABLE, "not the leader (standby or shutting down): retry with backoff")
        if not math.isfinite(request.range_s) or request.range_s < 0:
            raise ServiceError(Code.INVALID_ARGUMENT, f"range_s must be a finite number of seconds >= 0, got "
                                                      f"{request.range_s!r}")
        if request.points > MAX_POINTS:
            raise ServiceError(Code.INVALID_ARGUMENT, f"points must be at most {MAX_POINTS}, got {request.points}")
        pools = self._pool_filter(caller, request.pools)
        return history.answer(self.pools if pools is None else pools, request.range_s,
                              request.points or DEFAULT_POINTS)

    async def pool_snapshot(self, caller: Principal, name: str) -> pb.PoolSnapshot:
        """One pool's entry of ``snapshot`` (KEDA's external scaler asks for
        one pool at a time); NOT_FOUND naming the pools the caller may use."""
        caller.require("metrics")
        if name not in self.every_pool:
            known = ", ".join(caller.visible(self.every_pool)) or "none the credential may use"
            raise ServiceError(Code.NOT_FOUND, f"no pool named {name!r} (pools: {known})", "UnknownPool")
        if not caller.sees(name):
            raise ServiceError(Code.PERMISSION_DENIED, f"the credential may not use pool {name!r}")
        return pool_of(await Service.snapshot(self, caller, pb.SnapshotRequest()), name)

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

