"""The gRPC transport: the cronoq.v1 services on grpcio's asyncio server,
and KEDA's external scaler (externalscaler.ExternalScaler, cronoq.server.keda).

Each method authenticates the caller (bearer token in the ``authorization``
metadata, or the DNS names of a verified client certificate), hands the
request to the service layer, and turns a ``ServiceError`` into a status
with the ``cronoq-error`` trailing metadata naming the cronoq exception.
Unary calls are bounded by limits.max_wait_s + limits.request_timeout_s.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import AsyncIterator, Awaitable, Callable, NoReturn, TypeVar

import grpc
from grpc import aio

from .._proto import cronoq_pb2 as pb
from .._proto import cronoq_pb2_grpc as pb_grpc
from .._proto import externalscaler_pb2 as es
from .._proto import externalscaler_pb2_grpc as es_grpc
from .auth import Authenticator, Principal
from .errors import Code, ServiceError
from .keda import STREAM_POLL_S, Trigger, active, trigger_token
from .remote import WorkerHub, WorkerSession
from .service import Service
from .shards import FORWARDED, UNAVAILABLE_METADATA, reply_notes

__all__ = ["add_services", "ERROR_METADATA"]

ERROR_METADATA = "cronoq-error"

log = logging.getLogger("cronoq.server")


def _status(code: Code) -> grpc.StatusCode:
    return getattr(grpc.StatusCode, code.grpc_name)


Request = TypeVar("Request")
Answer = TypeVar("Answer")


async def _abort(context: aio.ServicerContext, error: ServiceError) -> NoReturn:
    trailing = (((ERROR_METADATA, error.kind),) if error.kind else ()) + error.metadata
    await context.abort(_status(error.code), error.message, trailing_metadata=trailing)
    raise RuntimeError("grpc's ServicerContext.abort returned")   # (it raises, always)


def peer_address(context: aio.ServicerContext) -> str:
    """The caller's address without its port ("ipv4:10.0.0.7:51234" -> "10.0.0.7")."""
    try:
        peer = context.peer() or ""
    except Exception:   # (grpcio raises for a call that already ended)
        return ""
    kind, _, rest = peer.partition(":")
    if kind == "ipv6" and rest.startswith("["):
        return rest[1:].partition("]")[0]
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    return peer


class _Base:
    def __init__(self, service: Service, auth: Authenticator) -> None:
        self.service = service
        self.auth = auth
        limits = service.limits
        self.deadline = limits.max_wait_s + limits.request_timeout_s

    def caller(self, context: aio.ServicerContext, token: str | None = None) -> Principal:
        """Who calls; ``token``: a bearer token carried in the request itself
        (KEDA's trigger metadata), used when no authorization metadata came."""
        # One pass over the metadata: the first authorization entry counts, and (sharded) the forwarded mark.
        sharded = self.service.sharded
        authorization = None
        authorized = forwarded = False
        for key, value in context.invocation_metadata() or ():
            if key == "authorization":
                if not authorized:
                    authorization = value if isinstance(value, str) else None
                    authorized = True
                    if not sharded:
                        break
            elif key == FORWARDED:
                forwarded = sharded
        if authorization is None and token:
            authorization = f"Bearer {token}"
        names: list[str] = []
        if self.auth.enabled and not authorization:
            auth_context = context.auth_context() or {}
            for raw in auth_context.get("x509_subject_alternative_name", ()):
                names.append(raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw))
        caller = self.auth.authenticate(authorization, names, peer=peer_address(context), transport="grpc")
        if forwarded:
            caller = dataclasses.replace(caller, forwarded=True)
        return caller

    async def unary(self, context: aio.ServicerContext,
                    call: Callable[[Principal, Request], Awaitable[Answer]], request: Request, *,
                    token: str | None = None) -> Answer:
        try:
            caller = self.caller(context, token)
            # asyncio.timeout, not wait_for: the call runs in this task, not in
            # one more task with its own loop steps (every unary call pays it).
            if not self.service.sharded:
                async with asyncio.timeout(self.deadline):
                    return await call(caller, request)
            notes: list[tuple[str, str]] = []
            reply_notes.set(notes)
            async with asyncio.timeout(self.deadline):
                answer = await call(caller, request)
            if notes:
                context.set_trailing_metadata(tuple(notes))
            return answer
        except ServiceError as exc:
            await _abort(context, exc)
        except asyncio.TimeoutError:
            await _abort(context, ServiceError(Code.CANCELLED, f"the call ran longer than {self.deadline:g} s"))
        except Exception:
            log.exception("internal error in %s", getattr(call, "__name__", "a call"))
            await _abort(context, ServiceError(Code.INTERNAL, "internal error (logged by the server)"))


class TasksServicer(_Base, pb_grpc.TasksServicer):
    async def Submit(self, request: pb.SubmitRequest, context: aio.ServicerContext) -> pb.SubmitResponse:
        return await self.unary(context, self.service.submit, request)

    async def SubmitBatch(self, request: pb.SubmitBatchRequest, context: aio.ServicerContext
                          ) -> pb.SubmitBatchResponse:
        return await self.unary(context, self.service.submit_batch, request)

    async def Get(self, request: pb.GetRequest, context: aio.ServicerContext) -> pb.TaskInfo:
        return await self.unary(context, self.service.get, request)

    async def Explain(self, request: pb.ExplainRequest, context: aio.ServicerContext) -> pb.Explanation:
        return await self.unary(context, self.service.explain, request)

    async def Dependents(self, request: pb.DependentsRequest, context: aio.ServicerContext
                         ) -> pb.DependentsResponse:
        return await self.unary(context, self.service.dependents, request)

    async def Wait(self, request: pb.WaitRequest, context: aio.ServicerContext) -> pb.TaskResult:
        return await self.unary(context, self.service.wait, request)

    async def Cancel(self, request: pb.CancelRequest, context: aio.ServicerContext) -> pb.CancelResponse:
        return await self.unary(context, self.service.cancel, request)

    async def ListTasks(self, request: pb.ListTasksRequest, context: aio.ServicerContext
                        ) -> pb.ListTasksResponse:
        return await self.unary(context, self.service.list_tasks, request)

    async def Watch(self, request: pb.WatchRequest, context: aio.ServicerContext
                    ) -> AsyncIterator[pb.StatusEvent]:
        try:
            caller = self.caller(context)
            events, missing = await self.service.watch(caller, request)
        except ServiceError as exc:
            await _abort(context, exc)
        try:
            # Headers at once, not with the first event: the caller knows the stream is
            # open (a sharded server waits for this from each shard) and what it leaves out.
            await context.send_initial_metadata(((UNAVAILABLE_METADATA, ",".join(missing)),) if missing else ())
            async for event in events:
                yield event
        except ServiceError as exc:
            await _abort(context, exc)
        finally:
            await events.aclose()


class AdminServicer(_Base, pb_grpc.AdminServicer):
    async def ListWorkers(self, request: pb.ListWorkersRequest, context: aio.ServicerContext
                          ) -> pb.ListWorkersResponse:
        return await self.unary(context, self.service.list_workers, request)

    async def ListRecurring(self, request: pb.ListRecurringRequest, context: aio.ServicerContext
                            ) -> pb.ListRecurringResponse:
        return await self.unary(context, self.service.list_recurring, request)

    async def AddRecurring(self, request: pb.AddRecurringRequest, context: aio.ServicerContext
                           ) -> pb.AddRecurringResponse:
        return await self.unary(context, self.service.add_recurring, request)

    async def RemoveRecurring(self, request: pb.RemoveRecurringRequest, context: aio.ServicerContext
                              ) -> pb.RemoveRecurringResponse:
        return await self.unary(context, self.service.remove_recurring, request)

    async def Snapshot(self, request: pb.SnapshotRequest, context: aio.ServicerContext) -> pb.SnapshotResponse:
        return await self.unary(context, self.service.snapshot, request)

    async def History(self, request: pb.HistoryRequest, context: aio.ServicerContext) -> pb.HistoryResponse:
        return await self.unary(context, self.service.history_of, request)


class WorkersServicer(_Base, pb_grpc.WorkersServicer):
    def __init__(self, service: Service, auth: Authenticator, hub: WorkerHub) -> None:
        super().__init__(service, auth)
        self.hub = hub

    async def Work(self, request_iterator: AsyncIterator[pb.WorkerMessage],
                   context: aio.ServicerContext) -> None:
        iterator = request_iterator.__aiter__()

        async def read() -> pb.WorkerMessage | None:
            try:
                return await iterator.__anext__()
            except StopAsyncIteration:
                return None

        async def write(message: pb.ServerMessage) -> None:
            await context.write(message)

        try:
            try:
                caller = self.caller(context)
            except ServiceError as exc:
                # Refused: still read the Register first (see WorkerSession.run).
                caller = None
                refusal = exc
            if caller is None:
                try:
                    await self.hub.first_message(read, valid=False)
                except Exception:   # timed out, too many waiting, or the stream broke: the refusal says why
                    pass
                raise refusal
            session = WorkerSession(self.hub, caller, self.service.check_serving, self.service.pools,
                                    self.service.worker_elsewhere)
            await session.run(read, write)
        except ServiceError as exc:
            await _abort(context, exc)


class ExternalScalerServicer(_Base, es_grpc.ExternalScalerServicer):
    """KEDA's external scaler for the pools (cronoq.server.keda)."""

    async def _trigger_call(self, context: aio.ServicerContext, ref: es.ScaledObjectRef,
                            answer: Callable[[Principal, Trigger], Awaitable[Answer]]) -> Answer:
        # The trigger is read first: a missing pool is the caller's mistake whatever the credential.
        try:
            trigger = Trigger(ref)
        except ServiceError as exc:
            await _abort(context, exc)
        return await self.unary(context, answer, trigger, token=trigger_token(ref))

    async def IsActive(self, request: es.ScaledObjectRef, context: aio.ServicerContext) -> es.IsActiveResponse:
        async def answer(caller: Principal, trigger: Trigger) -> es.IsActiveResponse:
            return es.IsActiveResponse(result=active(await self.service.pool_snapshot(caller, trigger.pool)))

        return await self._trigger_call(context, request, answer)

    async def GetMetricSpec(self, request: es.ScaledObjectRef, context: aio.ServicerContext
                            ) -> es.GetMetricSpecResponse:
        async def answer(caller: Principal, trigger: Trigger) -> es.GetMetricSpecResponse:
            await self.service.pool_snapshot(caller, trigger.pool)   # the pool exists, the caller may see it
            response = es.GetMetricSpecResponse()
            response.metricSpecs.add(metricName=trigger.metric, targetSize=trigger.slots_per_replica,
                                     targetSizeFloat=float(trigger.slots_per_replica))
            return response

        return await self._trigger_call(context, request, answer)

    async def GetMetrics(self, request: es.GetMetricsRequest, context: aio.ServicerContext
                         ) -> es.GetMetricsResponse:
        async def answer(caller: Principal, trigger: Trigger) -> es.GetMetricsResponse:
            asked = request.metricName
            # KEDA strips its "sN-" prefix before asking; an older release may not.
            if asked and asked != trigger.metric and not asked.endswith("-" + trigger.metric):
                raise ServiceError(Code.NOT_FOUND,
                                   f"no metric named {asked!r}: this trigger's metric is {trigger.metric!r}")
            pool = await self.service.pool_snapshot(caller, trigger.pool)
            response = es.GetMetricsResponse()
            response.metricValues.add(metricName=trigger.metric, metricValue=pool.desired,
                                      metricValueFloat=float(pool.desired))
            return response

        return await self._trigger_call(context, request.scaledObjectRef, answer)

    async def StreamIsActive(self, request: es.ScaledObjectRef, context: aio.ServicerContext
                             ) -> AsyncIterator[es.IsActiveResponse]:
        try:
            trigger = Trigger(request)
            caller = self.caller(context, trigger_token(request))
            pool = await self.service.pool_snapshot(caller, trigger.pool)
        except ServiceError as exc:
            await _abort(context, exc)
        moved = asyncio.Event()
        stop = self._wake_on_desired(trigger.pool, moved)
        try:
            last = active(pool)
            yield es.IsActiveResponse(result=last)
            while True:
                try:
                    await asyncio.wait_for(moved.wait(), STREAM_POLL_S)
                except asyncio.TimeoutError:
                    pass
                moved.clear()
                try:
                    now = active(await self.service.pool_snapshot(caller, trigger.pool))
                except ServiceError as exc:
                    if exc.code is Code.UNAVAILABLE:
                        # This server stopped leading (or the pool's shard is out of reach): end
                        # cleanly, KEDA opens the stream again in 2 s, where an error backs it off.
                        return
                    raise
                if now != last:
                    last = now
                    yield es.IsActiveResponse(result=now)
        except ServiceError as exc:
            await _abort(context, exc)
        finally:
            stop()

    def _wake_on_desired(self, pool: str, moved: asyncio.Event) -> Callable[[], None]:
        """Set ``moved`` whenever the local autoscaler moves ``pool``'s target
        (another shard's pool is only polled)."""
        sched = self.service.scheduler
        if sched is None or pool not in self.service.pools:
            return lambda: None
        loop = asyncio.get_running_loop()

        def listener(name: str, desired: int) -> None:
            if name == pool:
                loop.call_soon_threadsafe(moved.set)   # (it runs under the scheduler's lock: no waiting here)

        return sched.on_desired(listener)


def add_services(server: aio.Server, service: Service, auth: Authenticator, hub: WorkerHub) -> None:
    pb_grpc.add_TasksServicer_to_server(TasksServicer(service, auth), server)
    pb_grpc.add_AdminServicer_to_server(AdminServicer(service, auth), server)
    pb_grpc.add_WorkersServicer_to_server(WorkersServicer(service, auth, hub), server)
    es_grpc.add_ExternalScalerServicer_to_server(ExternalScalerServicer(service, auth), server)
