"""Shards: any server answers for every shard (docs/server.md, "Sharding").

``ShardedService`` is the service of a server that runs one shard of a
[[shards]] configuration. A call for this shard's pools or tasks goes to the
local service as it is; a call for another shard's goes to that shard's
server over gRPC (``Peers``) with the caller's own bearer token, so the
receiving shard authenticates and authorizes it again. Forwarded calls carry
``cronoq-forwarded`` and are answered by the receiving shard alone, so a call
travels at most one hop. Reads (listings, snapshots, Watch) ask every shard
and name the ones that could not be asked in ``unavailable_shards``.

Which shard a call concerns: a pool's shard ([[shards]] pools), a task id's
shard (its top 8 bits), and for a key every shard (keys are unique only
within a shard). Refused instead of forwarded, with FAILED_PRECONDITION and
the shard's name and endpoint in ``cronoq-shard`` / ``cronoq-shard-endpoint``:
callers without a token (client certificates), plain-http endpoints on other
hosts (unless ``server.insecure_peer_http``), workers (they are redirected),
and calls that were forwarded already.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from typing import TYPE_CHECKING, Any, AsyncGenerator, Awaitable, Callable, Iterable, TypeVar
from urllib.parse import urlsplit

import grpc
from grpc import aio

from .._proto import cronoq_pb2 as pb
from .._proto import cronoq_pb2_grpc as pb_grpc
from ..core.actions import StatusEvent
from ..core.types import TaskSpec, shard_of
from ..loopback import is_loopback
from .auth import Principal
from .config import ServerConfig, ShardSection
from .convert import status_name
from .errors import Code, ServiceError
from .info import LiveFeed
from .service import TIMELINE_MAX_S, EventStream, Service, pool_of

if TYPE_CHECKING:
    from .remote import WorkerHub

__all__ = ["ShardedService", "Peers", "ShardUnavailable", "FORWARDED", "SHARD_METADATA", "ENDPOINT_METADATA",
           "UNAVAILABLE_METADATA", "reply_notes"]

log = logging.getLogger("cronoq.server")

FORWARDED = "cronoq-forwarded"               # set on calls one shard makes to another
SHARD_METADATA = "cronoq-shard"
ENDPOINT_METADATA = "cronoq-shard-endpoint"
UNAVAILABLE_METADATA = "cronoq-unavailable-shards"

PEER_RECONNECT_MAX_S = 2.0   # the longest wait between attempts to reach a shard again

_Answer = TypeVar("_Answer")
_Request = TypeVar("_Request")

# Metadata the transports add to a successful answer (Get/Wait by key naming missing shards).
reply_notes: contextvars.ContextVar[list[tuple[str, str]] | None] = contextvars.ContextVar(
    "cronoq_reply_notes", default=None)


def _note(key: str, value: str) -> None:
    notes = reply_notes.get()
    if notes is not None:
        notes.append((key, value))


class ShardUnavailable(Exception):
    """A shard's servers could not be asked (down, no leader, or too slow)."""

    def __init__(self, shard: ShardSection, reason: str) -> None:
        super().__init__(f"shard {shard.name!r} ({shard.endpoint}) could not be asked: {reason}")
        self.shard = shard


def elsewhere(shard: ShardSection, why: str) -> ServiceError:
    """FAILED_PRECONDITION sending the caller to ``shard``'s endpoint."""
    return ServiceError(Code.FAILED_PRECONDITION, f"{why}: it is served by shard {shard.name!r} at "
                                                  f"{shard.endpoint}; call that endpoint",
                        metadata=((SHARD_METADATA, shard.name), (ENDPOINT_METADATA, shard.endpoint)))


class Peers:
    """One gRPC channel per other shard, opened on first use."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self._channels: dict[str, aio.Channel] = {}
        limit = config.limits.max_message_bytes
        # Reconnect within seconds of a shard's return: gRPC's own backoff grows to two
        # minutes, so after a long outage a shard that is back would stay "unavailable".
        self._options = [("grpc.max_send_message_length", limit), ("grpc.max_receive_message_length", limit),
                         ("grpc.enable_retries", 0), ("grpc.initial_reconnect_backoff_ms", 250),
                         ("grpc.min_reconnect_backoff_ms", 250),
                         ("grpc.max_reconnect_backoff_ms", int(PEER_RECONNECT_MAX_S * 1000))]
        self._credentials: grpc.ChannelCredentials | None = None

    def _secure(self) -> grpc.ChannelCredentials:
        if self._credentials is None:
            tls = self.config.server.peer_tls

            def read(path: str | None) -> bytes | None:
                if path is None:
                    return None
                with open(path, "rb") as f:
                    return f.read()

            self._credentials = grpc.ssl_channel_credentials(
                read(tls.ca) if tls else None, read(tls.key) if tls else None, read(tls.cert) if tls else None)
        return self._credentials

    def channel(self, shard: ShardSection) -> aio.Channel:
        channel = self._channels.get(shard.name)
        if channel is None:
            if shard.secure:
                channel = aio.secure_channel(shard.address, self._secure(), options=self._options)
            else:
                channel = aio.insecure_channel(shard.address, options=self._options)
            self._channels[shard.name] = channel
        return channel

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close()


def _plain_remote(shard: ShardSection) -> bool:
    """Whether calls to ``shard`` would send tokens unencrypted off this host."""
    if shard.secure:
        return False
    host = urlsplit(shard.endpoint).hostname or ""
    return not is_loopback(host)


class ShardedService(Service):
    """The service of one shard's server, answering for every shard (module docstring)."""

    sharded = True

    def __init__(self, config: ServerConfig, hub: WorkerHub, resource_shards: dict[str, str | None],
                 peers: Peers | None = None) -> None:
        """``config``: this shard's (``ServerConfig.for_shard``); ``resource_shards``:
        every resource's shard."""
        super().__init__(config, hub)
        self.resource_shards = resource_shards
        mine = config.shard
        assert mine is not None, "a sharded service needs server.shard"
        self.me = mine
        self.shards = {s.name: s for s in config.shards}
        self.by_number = {s.number: s for s in config.shards}
        self.pool_shard = {pool: s for s in config.shards for pool in s.pools}
        self.my_pools = frozenset(mine.pools)
        # Resources a task of this shard may not use (another shard's); shared ones (no shard) pass routing.
        self.foreign_resources = frozenset(name for name, home in resource_shards.items()
                                           if home is not None and home != mine.name)
        self.all_pools = [p.name for p in (config.all_pools or config.pools)]
        self.home_pool = config.default_pool   # where a task without a pool goes, in every shard
        self.peers = peers if peers is not None else Peers(config)
        self.insecure_peer_http = config.server.insecure_peer_http
        self.request_timeout = config.limits.request_timeout_s
        self._feed_pumps: dict[int, list[asyncio.Task[None]]] = {}

    @property
    def every_pool(self) -> list[str]:
        return self.all_pools

    # -- where a call goes

    def shard_of_pool(self, pool: str) -> ShardSection | None:
        return self.pool_shard.get(pool or self.home_pool)

    def shard_of_task(self, task_id: int) -> ShardSection | None:
        return self.by_number.get(shard_of(task_id))

    def others(self) -> list[ShardSection]:
        return [s for s in self.shards.values() if s is not self.me]

    def worker_elsewhere(self, caller: Principal, pool: str) -> ServiceError | None:
        """The redirect for a worker registering for another shard's pool."""
        shard = self.shard_of_pool(pool)
        if shard is None or shard is self.me or not caller.sees(pool):
            return None
        return elsewhere(shard, f"pool {pool!r} is not served here")

    def _may_forward(self, caller: Principal, shard: ShardSection, what: str) -> None:
        """Refuse (FAILED_PRECONDITION) what must not be forwarded to ``shard``."""
        if caller.forwarded:
            raise elsewhere(shard, f"{what} reached this shard through another one")
        if caller.by_cert:
            raise elsewhere(shard, f"{what} cannot be forwarded for a caller that authenticated by certificate")
        if _plain_remote(shard) and not self.insecure_peer_http:
            raise elsewhere(shard, f"{what} would send the caller's token over plain http to another host "
                                   f"(server.insecure_peer_http allows it)")

    def _as_forwarded(self, caller: Principal) -> list[tuple[str, str]]:
        """A forwarded call's metadata: the mark, and the caller's own token (re-checked there)."""
        metadata = [(FORWARDED, self.me.name)]
        if caller.token is not None:
            metadata.append(("authorization", f"Bearer {caller.token}"))
        return metadata

    async def _call(self, caller: Principal, shard: ShardSection, method: str, request: Any,
                    timeout: float | None = None) -> Any:
        """``method`` of Tasks or Admin on ``shard``'s server, as the caller."""
        service = "Admin" if method in ("ListWorkers", "ListRecurring", "AddRecurring", "RemoveRecurring",
                                        "Snapshot", "History") else "Tasks"
        stub = getattr(pb_grpc, f"{service}Stub")(self.peers.channel(shard))
        try:
            return await getattr(stub, method)(request, metadata=self._as_forwarded(caller),
                                               timeout=timeout if timeout is not None else self.request_timeout)
        except aio.AioRpcError as exc:
            raise _peer_error(shard, exc) from None

    async def _forward(self, caller: Principal, shard: ShardSection, what: str, method: str, request: Any,
                       timeout: float | None = None) -> Any:
        self._may_forward(caller, shard, what)
        try:
            return await self._call(caller, shard, method, request, timeout)
        except ShardUnavailable as exc:
            raise ServiceError(Code.UNAVAILABLE, str(exc)) from None

    async def _ask_all(self, caller: Principal, method: str, request: Callable[[ShardSection], Any | None],
                       local: Callable[[], Awaitable[_Answer]]) -> tuple[list[Any], list[str]]:
        """Every shard's answer (this one's first, then by shard number; not of
        the shards ``request`` gives None for), and the shards that could not
        be asked. Forwarded calls get this shard's answer alone, certificate
        callers too (the others are named missing)."""
        answers: list[Any] = [await local()]
        missing: list[str] = []
        others = sorted(self.others(), key=lambda s: s.number)
        if caller.forwarded:
            return answers, missing
        asked = []
        for shard in others:
            if request(shard) is None:
                continue
            try:
                self._may_forward(caller, shard, "the call")
            except ServiceError:
                missing.append(shard.name)
                continue
            asked.append(shard)
        results = await asyncio.gather(*(self._call(caller, s, method, request(s)) for s in asked),
                                       return_exceptions=True)
        for shard, result in zip(asked, results):
            if isinstance(result, ShardUnavailable):
                missing.append(shard.name)
            elif isinstance(result, BaseException):
                raise result
            else:
                answers.append(result)
        return answers, missing

    def _pools_of(self, requested: Iterable[str], shard: ShardSection) -> list[str] | None:
        """The requested pools that ``shard`` serves (None: all of them asked)."""
        wanted = list(requested)
        if not wanted:
            return None
        for pool in wanted:
            if pool not in self.pool_shard:
                raise ServiceError(Code.NOT_FOUND, f"no pool named {pool!r}", "UnknownPool")
        return [p for p in wanted if self.pool_shard[p] is shard]

    # -- submissions

    def _shard_of_spec(self, spec: pb.TaskSpec) -> ShardSection:
        shard = self.pool_shard.get(spec.pool or self.home_pool)
        if shard is None:
            raise ServiceError(Code.NOT_FOUND, f"no pool named {spec.pool or self.home_pool!r}", "UnknownPool")
        if spec.resources:
            self._check_resources(spec, shard)
        if spec.after or spec.deps:
            self._check_deps(spec, shard)
        return shard

    def _check_resources(self, spec: pb.TaskSpec, shard: ShardSection) -> None:
        for name in spec.resources:
            home = self.resource_shards.get(name)
            if home is not None and home != shard.name:
                raise ServiceError(Code.INVALID_ARGUMENT,
                                   f"resource {name!r} belongs to shard {home!r}, but pool "
                                   f"{spec.pool or self.home_pool!r} is in shard {shard.name!r}: a task may "
                                   f"use only its own shard's resources", "InvalidTask")

    def _check_deps(self, spec: pb.TaskSpec, shard: ShardSection) -> None:
        for ref in list(spec.after) + [d.ref for d in spec.deps]:
            if ref.WhichOneof("ref") == "id" and self.shard_of_task(ref.id) is not shard:
                raise ServiceError(Code.INVALID_ARGUMENT,
                                   f"dependency {ref.id} is a task of another shard than pool "
                                   f"{spec.pool or self.home_pool!r} ({shard.name!r}): a task can wait only "
                                   f"for tasks of its own shard", "InvalidTask")

    async def submit(self, caller: Principal, request: pb.SubmitRequest) -> pb.SubmitResponse:
        caller.require("client")
        shard = self._shard_of_spec(request.task)
        if shard is self.me:
            return await super().submit(caller, request)
        self._check_pool_scope(caller, request.task)
        request = self._named(request, [request.task])
        return await self._forward(caller, shard, "a submission for this pool", "Submit", request)   # type: ignore

    async def submit_batch(self, caller: Principal, request: pb.SubmitBatchRequest) -> pb.SubmitBatchResponse:
        caller.require("client")
        if not request.tasks:
            return await super().submit_batch(caller, request)
        if self._pools_all_mine(request.tasks):
            # The common case, told by the pools alone: reading every spec's resources and
            # dependencies here cost as much again as admitting it. Those are checked on the
            # converted tasks instead (_batch_specs), before anything is admitted, and any error
            # is answered as routing first would have answered it.
            try:
                return await super().submit_batch(caller, request)
            except Exception:
                self._route_batch(request.tasks)
                raise
        first = self._route_batch(request.tasks)
        if first is self.me:
            return await super().submit_batch(caller, request)
        for spec in request.tasks:
            self._check_pool_scope(caller, spec)
        request = self._named(request, list(request.tasks))
        return await self._forward(caller, first, "a batch for these pools", "SubmitBatch",   # type: ignore
                                   request)

    def _route_batch(self, tasks: Iterable[pb.TaskSpec]) -> ShardSection:
        """The one shard a batch is for; the first routing error of its tasks otherwise."""
        of_spec = self._shard_of_spec
        shards = [of_spec(spec) for spec in tasks]
        first = shards[0]
        for index, shard in enumerate(shards):
            if shard is not first:
                raise ServiceError(Code.INVALID_ARGUMENT,
                                   f"tasks[{index}] is for shard {shard.name!r}, tasks[0] for {first.name!r}: a "
                                   f"batch is admitted atomically by one shard; send one batch per shard",
                                   "InvalidTask")
        return first

    def _pools_all_mine(self, tasks: Iterable[pb.TaskSpec]) -> bool:
        """Whether every task names a pool of this shard (or none, with the home pool here)."""
        mine = self.my_pools
        home_here = self.home_pool in mine
        for spec in tasks:
            pool = spec.pool
            if not (pool in mine if pool else home_here):
                return False
        return True

    def _batch_specs(self, caller: Principal, tasks: Iterable[pb.TaskSpec]) -> list[TaskSpec]:
        specs = super()._batch_specs(caller, tasks)
        # What _shard_of_spec refuses of a task in this shard's pools, read off the converted tasks.
        foreign = self.foreign_resources
        by_number, me = self.by_number, self.me
        for spec in specs:
            if (spec.edges and any(isinstance(ref, int) and by_number.get(shard_of(ref)) is not me
                                   for ref, _ in spec.edges)) or \
                    (foreign and spec.resources and not foreign.isdisjoint(spec.resources)):
                self._route_batch(tasks)   # (raises: the first task routing refuses)
                raise AssertionError("routing let through a task of another shard")
        return specs

    def _named(self, request: _Request, specs: list[pb.TaskSpec]) -> _Request:
        """``request`` with the pool of every spec named: "" means another default on another shard."""
        if all(spec.pool for spec in specs):
            return request
        for spec in specs:
            if not spec.pool:
                spec.pool = self.home_pool
        return request

    def _check_pool_scope(self, caller: Principal, spec: pb.TaskSpec) -> None:
        # Credentials first: a caller that may not use a pool learns nothing about where it is served.
        pool = spec.pool or self.home_pool
        if not caller.sees(pool):
            raise ServiceError(Code.PERMISSION_DENIED, f"the credential may not use pool {pool!r}")

    # -- one task

    async def _by_ref(self, caller: Principal, ref: pb.TaskRef, method: str, request: Any,
                      local: Callable[[Any], Awaitable[_Answer]], *, changes: bool = False,
                      timeout: float | None = None) -> _Answer:
        """Answer a call about one task: by id from its shard; by key from the
        one shard holding the key (asked of every shard)."""
        if ref.WhichOneof("ref") == "id":
            shard = self.shard_of_task(ref.id)
            if shard is None:
                raise ServiceError(Code.NOT_FOUND, f"no task {ref.id}", "UnknownTask")
            if shard is self.me:
                return await local(request)
            return await self._forward(caller, shard, f"task {ref.id}", method, request,   # type: ignore
                                       timeout)
        key = ref.key
        found, missing = await self._locate(caller, key)
        if len(found) > 1:
            raise ServiceError(Code.FAILED_PRECONDITION,
                               f"key {key!r} names tasks in shards {', '.join(s.name for s, _ in found)}: keys "
                               f"are unique only within a shard; use the task id")
        if missing and (changes or not found):
            raise ServiceError(Code.UNAVAILABLE, f"key {key!r}: shards {', '.join(missing)} could not be asked, and "
                                                 f"one of them may hold it; retry, or use the task id")
        if not found:
            raise ServiceError(Code.NOT_FOUND, f"no task with key {key!r}", "UnknownTask")
        if missing:
            _note(UNAVAILABLE_METADATA, ",".join(missing))
        shard, task_id = found[0]
        if shard is self.me:
            return await local(request)
        request = type(request).FromString(request.SerializeToString())
        request.task.id = task_id   # the shard holding the key was found: ask it by id
        answer: _Answer = await self._call_or_unavailable(caller, shard, method, request, timeout)
        return answer

    async def _call_or_unavailable(self, caller: Principal, shard: ShardSection, method: str, request: Any,
                                   timeout: float | None) -> Any:
        try:
            return await self._call(caller, shard, method, request, timeout)
        except ShardUnavailable as exc:
            raise ServiceError(Code.UNAVAILABLE, str(exc)) from None

    async def _locate(self, caller: Principal, key: str) -> tuple[list[tuple[ShardSection, int]], list[str]]:
        """The shards holding a task with ``key`` (and its id there), and the
        shards that could not be asked."""
        get = pb.GetRequest(task=pb.TaskRef(key=key))

        async def local() -> int | None:
            try:
                return (await super(ShardedService, self).get(caller, get)).id
            except ServiceError as exc:
                if exc.code is Code.NOT_FOUND:
                    return None
                if exc.code is Code.UNAVAILABLE:
                    raise ShardUnavailable(self.me, exc.message) from None
                raise

        found: list[tuple[ShardSection, int]] = []
        missing: list[str] = []
        try:
            mine = await local()
        except ShardUnavailable:
            missing.append(self.me.name)
            mine = None
        if mine is not None:
            found.append((self.me, mine))
        if caller.forwarded:
            return found, missing
        for shard in sorted(self.others(), key=lambda s: s.number):
            try:
                self._may_forward(caller, shard, "a lookup by key")
            except ServiceError:
                missing.append(shard.name)
                continue
            try:
                info = await self._call(caller, shard, "Get", get)
            except ShardUnavailable:
                missing.append(shard.name)
                continue
            except ServiceError as exc:
                if exc.code is Code.NOT_FOUND:
                    continue
                raise
            found.append((shard, info.id))
        return found, missing

    async def get(self, caller: Principal, request: pb.GetRequest) -> pb.TaskInfo:
        caller.require("client")
        return await self._by_ref(caller, request.task, "Get", request,
                                  lambda r: super(ShardedService, self).get(caller, r))

    async def explain(self, caller: Principal, request: pb.ExplainRequest) -> pb.Explanation:
        caller.require("client")
        return await self._by_ref(caller, request.task, "Explain", request,
                                  lambda r: super(ShardedService, self).explain(caller, r))

    async def dependents(self, caller: Principal, request: pb.DependentsRequest) -> pb.DependentsResponse:
        """From the task's own shard: a dependency never crosses shards (by id
        it is refused, by key it names a key of the task's shard), so neither
        do its dependents. By key, every shard is asked where the key is."""
        caller.require("client")
        notes: list[tuple[str, str]] = []
        token = reply_notes.set(notes)
        try:
            response = await self._by_ref(caller, request.task, "Dependents", request,
                                          lambda r: super(ShardedService, self).dependents(caller, r))
        finally:
            reply_notes.reset(token)
        for key, value in notes:
            if key == UNAVAILABLE_METADATA:
                response.unavailable_shards.extend(name for name in value.split(",")
                                                   if name not in response.unavailable_shards)
        return response

    async def wait(self, caller: Principal, request: pb.WaitRequest) -> pb.TaskResult:
        caller.require("client")
        timeout = self._timeout(request.timeout_s if request.HasField("timeout_s") else None, "timeout_s")
        return await self._by_ref(caller, request.task, "Wait", request,
                                  lambda r: super(ShardedService, self).wait(caller, r),
                                  timeout=timeout + self.request_timeout)

    async def cancel(self, caller: Principal, request: pb.CancelRequest) -> pb.CancelResponse:
        caller.require("client")
        return await self._by_ref(caller, request.task, "Cancel", request,
                                  lambda r: super(ShardedService, self).cancel(caller, r), changes=True)

    async def resubmit(self, caller: Principal, ref: int) -> pb.SubmitResponse:
        shard = self.shard_of_task(ref)
        if shard is None or shard is self.me:
            return await super().resubmit(caller, ref)
        caller.require("admin")
        self._may_forward(caller, shard, f"task {ref}")
        raise elsewhere(shard, f"task {ref} is another shard's; submit it again there")

    # -- reads over every shard

    async def _list_page(self, caller: Principal, request: pb.ListTasksRequest) -> pb.ListTasksResponse:
        caller.require("client")
        limit = min(request.limit or 100, self.limits.max_list)

        def ask(shard: ShardSection) -> pb.ListTasksRequest | None:
            pools = self._pools_of(request.pools, shard)
            if pools == []:
                return None
            return pb.ListTasksRequest(pools=pools or (), statuses=request.statuses, after=request.after,
                                       limit=limit, newest_first=request.newest_first, before=request.before)

        mine = ask(self.me)
        empty = pb.ListTasksResponse()

        async def local() -> pb.ListTasksResponse:
            if mine is None:
                return empty
            return await super(ShardedService, self)._list_page(caller, mine)

        requests = {s.name: ask(s) for s in self.others()}
        pages, missing = await self._ask_all(caller, "ListTasks", lambda s: requests[s.name], local)
        # Every shard's page is in the order asked: merged, the first limit of all of them.
        newest = request.newest_first
        tasks = sorted((t for page in pages for t in page.tasks), key=lambda t: t.id, reverse=newest)
        more = len(tasks) > limit or any(page.next_before if newest else page.next_after for page in pages)
        response = pb.ListTasksResponse(tasks=tasks[:limit], unavailable_shards=missing)
        if more and tasks:
            if newest:
                response.next_before = tasks[:limit][-1].id
            else:
                response.next_after = tasks[:limit][-1].id
        return response

    async def list_workers(self, caller: Principal, request: pb.ListWorkersRequest) -> pb.ListWorkersResponse:
        caller.require("metrics")

        async def local() -> pb.ListWorkersResponse:
            pools = self._pools_of(request.pools, self.me)
            if pools == []:
                return pb.ListWorkersResponse()
            return await super(ShardedService, self).list_workers(caller, pb.ListWorkersRequest(pools=pools or ()))

        def ask(shard: ShardSection) -> pb.ListWorkersRequest | None:
            pools = self._pools_of(request.pools, shard)
            return None if pools == [] else pb.ListWorkersRequest(pools=pools or ())

        answers, missing = await self._ask_all(caller, "ListWorkers", ask, local)
        response = pb.ListWorkersResponse(unavailable_shards=missing)
        for answer in answers:
            response.workers.extend(answer.workers)
        return response

    async def timeline(self, caller: Principal, pools: Iterable[str], range_s: float, ahead_s: float
                       ) -> dict[str, Any]:
        """This shard's timeline alone: shards have no call to ask each other
        for theirs, so the other shards serving a requested pool (every other
        shard, without pools) are named in unavailable_shards."""
        caller.require("client")
        requested = list(pools)
        mine = self._pools_of(requested, self.me)
        if mine == []:
            self.serving()
            answer: dict[str, Any] = {
                "at_unix_ns": str(time.time_ns()), "range_s": min(range_s, TIMELINE_MAX_S),
                "ahead_s": min(ahead_s, TIMELINE_MAX_S), "workers": [], "attempts": [], "reservations": [],
                "holds": []}
        else:
            answer = await super().timeline(caller, mine or (), range_s, ahead_s)
        answer["unavailable_shards"] = sorted(
            shard.name for shard in self.others() if self._pools_of(requested, shard) != [])
        return answer

    async def list_recurring(self, caller: Principal, request: pb.ListRecurringRequest
                             ) -> pb.ListRecurringResponse:
        caller.require("metrics")
        answers, missing = await self._ask_all(
            caller, "ListRecurring", lambda s: request,
            lambda: super(ShardedService, self).list_recurring(caller, request))
        response = pb.ListRecurringResponse(unavailable_shards=missing)
        for answer in answers:
            response.schedules.extend(answer.schedules)
        return response

    async def snapshot(self, caller: Principal, request: pb.SnapshotRequest) -> pb.SnapshotResponse:
        caller.require("metrics")
        answers, missing = await self._ask_all(
            caller, "Snapshot", lambda s: request, lambda: super(ShardedService, self).snapshot(caller, request))
        response: pb.SnapshotResponse = answers[0]
        if caller.forwarded:
            return response   # (the asking shard adds up)
        for other in answers[1:]:
            response.pools.extend(other.pools)
            response.live_tasks += other.live_tasks
            response.running += other.running
            response.pending += other.pending
            response.workers_connected += other.workers_connected
            for name, value in other.totals.items():
                response.totals[name] = response.totals.get(name, 0) + value
        order = {name: i for i, name in enumerate(self.all_pools)}
        pools = sorted(response.pools, key=lambda p: order.get(p.name, len(order)))
        del response.pools[:]
        response.pools.extend(pools)
        del response.unavailable_shards[:]
        response.unavailable_shards.extend(missing)
        return response

    async def history_of(self, caller: Principal, request: pb.HistoryRequest) -> pb.HistoryResponse:
        """Every shard's history of its pools asked for, in the order of the pools' configuration."""
        caller.require("metrics")

        def ask(shard: ShardSection) -> pb.HistoryRequest | None:
            pools = self._pools_of(request.pools, shard)
            return None if pools == [] else pb.HistoryRequest(pools=pools or (), range_s=request.range_s,
                                                              points=request.points)

        async def local() -> pb.HistoryResponse:
            mine = ask(self.me)
            if mine is None:   # (none of this shard's pools asked: its frame only)
                self.serving()
                mine = pb.HistoryRequest(range_s=request.range_s, points=request.points)
                answer = await super(ShardedService, self).history_of(caller, mine)
                del answer.pools[:]
                return answer
            return await super(ShardedService, self).history_of(caller, mine)

        answers, missing = await self._ask_all(caller, "History", ask, local)
        response: pb.HistoryResponse = answers[0]
        if caller.forwarded:
            return response
        for other in answers[1:]:
            response.pools.extend(p for p in other.pools if caller.sees(p.name))
        order = {name: i for i, name in enumerate(self.all_pools)}
        pools = sorted(response.pools, key=lambda p: order.get(p.name, len(order)))
        del response.pools[:]
        response.pools.extend(pools)
        del response.unavailable_shards[:]
        response.unavailable_shards.extend(missing)
        return response

    async def pool_snapshot(self, caller: Principal, name: str) -> pb.PoolSnapshot:
        # Another shard's pool: that shard's own snapshot, not every shard's.
        shard = self.shard_of_pool(name)
        if shard is None or shard is self.me or name not in self.pool_shard:
            return await super().pool_snapshot(caller, name)
        caller.require("metrics")
        if not caller.sees(name):
            raise ServiceError(Code.PERMISSION_DENIED, f"the credential may not use pool {name!r}")
        answer = await self._forward(caller, shard, f"the snapshot of pool {name!r}", "Snapshot",
                                     pb.SnapshotRequest())
        return pool_of(answer, name, f"shard {shard.name!r}")

    # -- schedules

    async def add_recurring(self, caller: Principal, request: pb.AddRecurringRequest) -> pb.AddRecurringResponse:
        caller.require("admin")
        shard = self.shard_of_pool(request.template.pool)
        if shard is None:
            raise ServiceError(Code.NOT_FOUND, f"no pool named {request.template.pool!r}", "UnknownPool")
        if shard is self.me:
            return await super().add_recurring(caller, request)
        self._check_pool_scope(caller, request.template)
        request = self._named(request, [request.template])
        return await self._forward(caller, shard, "a schedule for this pool", "AddRecurring",   # type: ignore
                                   request)

    async def remove_recurring(self, caller: Principal, request: pb.RemoveRecurringRequest
                               ) -> pb.RemoveRecurringResponse:
        caller.require("admin")
        answer = await super().remove_recurring(caller, request)
        if answer.removed or caller.forwarded:
            return answer
        for shard in sorted(self.others(), key=lambda s: s.number):
            answer = await self._forward(caller, shard, "removing a schedule", "RemoveRecurring", request)
            assert isinstance(answer, pb.RemoveRecurringResponse)
            if answer.removed:
                return answer
        return answer

    # -- Watch over every shard

    async def watch(self, caller: Principal, request: pb.WatchRequest) -> tuple[EventStream, list[str]]:
        """Every shard's stream, merged; the shards that could not be asked are
        left out and named (a shard's stream that ends later ends the merge)."""
        caller.require("client")
        if caller.forwarded:
            return await super().watch(caller, request)
        streams: list[EventStream] = []
        missing: list[str] = []
        mine = self._pools_of(request.pools, self.me)
        if mine != []:
            local, _ = await super().watch(caller, pb.WatchRequest(
                pools=mine or (), terminal_only=request.terminal_only, recent=request.recent))
            streams.append(local)
        wanted: list[tuple[ShardSection, pb.WatchRequest]] = []
        for shard in sorted(self.others(), key=lambda s: s.number):
            pools = self._pools_of(request.pools, shard)
            if pools == []:
                continue
            try:
                self._may_forward(caller, shard, "a Watch")
            except ServiceError:
                missing.append(shard.name)   # (a certificate caller streams this shard's events only)
                continue
            wanted.append((shard, pb.WatchRequest(pools=pools or (), terminal_only=request.terminal_only,
                                                  recent=request.recent)))
        opened = await asyncio.gather(*(self._open_remote_watch(caller, shard, r) for shard, r in wanted),
                                      return_exceptions=True)
        failure: BaseException | None = None
        for (shard, _), result in zip(wanted, opened):
            if isinstance(result, ShardUnavailable):
                missing.append(shard.name)
            elif isinstance(result, BaseException):
                failure = failure or result
            else:
                streams.append(result)
        if failure is not None or not streams:
            for stream in streams:
                await stream.aclose()
            raise failure or ServiceError(Code.UNAVAILABLE, f"no shard serving these pools could be asked "
                                                            f"(unavailable: {', '.join(missing)}); reconnect")
        return MergedWatch(streams, self.limits.watch_buffer), missing

    async def _open_remote_watch(self, caller: Principal, shard: ShardSection, request: pb.WatchRequest
                                 ) -> EventStream:
        """``shard``'s Watch, once its server has accepted it (its headers came):
        ShardUnavailable if it could not be reached in time."""
        call = pb_grpc.TasksStub(self.peers.channel(shard)).Watch(request, metadata=self._as_forwarded(caller))
        try:
            await asyncio.wait_for(call.initial_metadata(), self.request_timeout)
        except asyncio.TimeoutError:
            call.cancel()
            raise ShardUnavailable(shard, f"its Watch did not open within {self.request_timeout:g} s") from None
        except aio.AioRpcError as exc:
            raise _peer_error(shard, exc) from None
        if call.done():   # refused, or ended at once
            code = await call.code()
            raise _peer_failure(shard, code, await call.details(), await call.trailing_metadata())
        return _remote_events(shard, call)

    # -- the HTTP event stream over every shard

    def open_feed(self, caller: Principal, pools: Iterable[str], *, events: bool = True, recent: int = 0
                  ) -> tuple[Any, LiveFeed]:
        """This shard's feed, with the status events of the other shards'
        pools fed in from their Watch streams. A shard whose stream cannot be
        opened, or ends, is retried with backoff and named in the feed's
        ``unavailable`` meanwhile; its return counts as a lag."""
        if caller.forwarded:
            return super().open_feed(caller, pools, events=events, recent=recent)
        requested = list(pools)
        mine = self._pools_of(requested, self.me)
        for pool in requested:
            if not caller.sees(pool):
                raise ServiceError(Code.PERMISSION_DENIED, f"the credential may not use pool {pool!r}")
        sched, feed = super().open_feed(caller, mine or (), events=events and mine != [], recent=recent)
        # The feed's own filter covers every shard's pools asked for (the local feed knows its shard's only).
        if requested:
            feed.pools = frozenset(requested)
        elif caller.pools is not None:
            feed.pools = frozenset(p for p in self.all_pools if caller.sees(p))
        else:
            feed.pools = None
        pumps: list[asyncio.Task[None]] = []
        if events:
            for shard in sorted(self.others(), key=lambda s: s.number):
                asked = self._pools_of(requested, shard)
                if asked == []:
                    continue
                try:
                    self._may_forward(caller, shard, "the event stream")
                except ServiceError:
                    feed.shard_missing(shard.name, True)
                    continue
                request = pb.WatchRequest(pools=asked or (), recent=recent)
                pumps.append(asyncio.ensure_future(self._feed_from(caller, shard, request, feed)))
        self._feed_pumps[id(feed)] = pumps
        return sched, feed

    def close_feed(self, sched: Any, feed: LiveFeed) -> None:
        for pump in self._feed_pumps.pop(id(feed), ()):
            pump.cancel()
        super().close_feed(sched, feed)

    async def _feed_from(self, caller: Principal, shard: ShardSection, request: pb.WatchRequest,
                         feed: LiveFeed) -> None:
        delay = 0.5
        while not feed.ended:
            try:
                stream = await self._open_remote_watch(caller, shard, request)
            except ShardUnavailable:
                feed.shard_missing(shard.name, True)
            except ServiceError as exc:   # refused there (its answer does not change by retrying)
                log.warning("the event stream leaves out shard %r: %s", shard.name, exc.message)
                feed.shard_missing(shard.name, True)
                return
            else:
                feed.shard_missing(shard.name, False)
                request.recent = 0   # (a reconnection replays nothing: the lag makes readers re-read)
                delay = 0.5
                try:
                    async for message in stream:
                        feed.deliver(_core_event(message, caller.tenant))
                except ServiceError:
                    pass
                finally:
                    await stream.aclose()
                feed.shard_missing(shard.name, True)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)


def _core_event(message: pb.StatusEvent, tenant: str | None) -> StatusEvent:
    """Another shard's event as the feed holds events (its shard already kept
    to the caller's tenant)."""
    return StatusEvent(message.id, message.pool, message.key or None, status_name(message.status),
                       message.attempt, message.at_unix_ns / 1e9, message.message or None, message.stage or None,
                       tenant, message.max_attempts or None)


class MergedWatch:
    """Several Watch streams as one, in arrival order. It ends, with its
    reason, when any of them ends; ``aclose`` stops them all."""

    def __init__(self, streams: list[EventStream], buffer: int) -> None:
        self._queue: asyncio.Queue[pb.StatusEvent | BaseException | None] = asyncio.Queue(buffer)
        self._streams = streams
        self._pumps = [asyncio.ensure_future(self._pump(stream)) for stream in streams]

    async def _pump(self, events: EventStream) -> None:
        try:
            async for event in events:
                await self._queue.put(event)
            await self._queue.put(None)
        except BaseException as exc:   # (ends the merged stream, with its reason)
            await self._queue.put(exc)

    def __aiter__(self) -> MergedWatch:
        return self

    async def __anext__(self) -> pb.StatusEvent:
        item = await self._queue.get()
        if item is None:
            await self.aclose()
            raise ServiceError(Code.UNAVAILABLE, "a shard's stream ended; reconnect")
        if isinstance(item, BaseException):
            await self.aclose()
            raise item
        return item

    async def aclose(self) -> None:
        for pump in self._pumps:
            pump.cancel()
        # (a stream cannot be closed while its pump is still inside it)
        await asyncio.gather(*self._pumps, return_exceptions=True)
        for stream in self._streams:
            try:
                await stream.aclose()
            except Exception:   # (a stream that already failed has nothing left to close)
                pass


async def _remote_events(shard: ShardSection, call: Any) -> AsyncGenerator[pb.StatusEvent, None]:
    try:
        async for event in call:
            yield event
    except aio.AioRpcError as exc:
        error = _peer_error(shard, exc)
        if isinstance(error, ShardUnavailable):
            raise ServiceError(Code.UNAVAILABLE, str(error)) from None
        raise error from None
    finally:
        call.cancel()


def _peer_error(shard: ShardSection, exc: aio.AioRpcError) -> Exception:
    """What a peer's failed call means here: the shard was out of reach, or
    its answer (an error with its code, message and exception kind)."""
    return _peer_failure(shard, exc.code(), exc.details(), exc.trailing_metadata())


def _peer_failure(shard: ShardSection, code: grpc.StatusCode, details: str | None, trailing_metadata: Any
                  ) -> Exception:
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return ShardUnavailable(shard, details or code.name)
    trailing = dict((k, v) for k, v in (trailing_metadata or ()) if isinstance(v, str))
    kind = trailing.get("cronoq-error")
    extra = tuple((k, v) for k, v in trailing.items() if k in (SHARD_METADATA, ENDPOINT_METADATA))
    ours = getattr(Code, code.name, Code.INTERNAL)
    return ServiceError(ours, details or code.name, kind, metadata=extra)
