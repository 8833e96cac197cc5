"""The gRPC side of ``cronoq``: one channel, the Tasks and Admin stubs, and
calls that retry UNAVAILABLE with backoff and raise cronoq's exceptions
(the mapping of ``cronoq.client``)."""

from __future__ import annotations

from typing import Any, AsyncIterator, Awaitable, Callable, TypeVar

import grpc

from .._proto import cronoq_pb2 as pb
from .._proto import cronoq_pb2_grpc as pb_grpc
from ..client import Client, wire
from .connection import Settings, channel_options

__all__ = ["Connection", "client_from"]

T = TypeVar("T")

class Connection:
    """A channel to the server. Every call carries the token; ``call`` retries
    UNAVAILABLE (a standby, a leader change) for ``settings.retry_for`` seconds."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.channel = wire.channel(settings.target, tls=settings.tls, credentials=_credentials(settings),
                                    options=channel_options())
        self.metadata = wire.metadata(settings.token)
        self.tasks = pb_grpc.TasksStub(self.channel)
        self.admin = pb_grpc.AdminStub(self.channel)
        # The shards the last Get, Explain or Wait by key could not ask (a sharded server names them).
        self.missing_shards: list[str] = []

    async def close(self) -> None:
        await self.channel.close()

    async def call(self, make: Callable[[], Awaitable[T]], ref: int | str | None = None, *,
                   retry_for: float | None = None) -> T:
        """Run a unary call; raise the cronoq exception it stands for."""
        return await wire.call(make, self.settings.retry_for if retry_for is None else retry_for, ref)

    async def _noted(self, start: Callable[[], Any], ref: int | str) -> Any:
        """A unary call whose answer may name shards it could not ask."""
        answer, missing = await wire.noted_call(start, self.settings.retry_for, ref)
        self.missing_shards = list(missing)
        return answer

    async def watch(self, pools: list[str], terminal_only: bool, recent: int = 0, *,
                    opened: Callable[[list[str]], None] | None = None) -> AsyncIterator[pb.StatusEvent]:
        """The Watch stream, as raw events (first up to ``recent`` of those the
        leader kept); its errors as cronoq exceptions. ``opened`` is told, once
        the stream is open, which shards it leaves out (a sharded server's)."""
        request = pb.WatchRequest(pools=pools, terminal_only=terminal_only, recent=recent)
        call = self.tasks.Watch(request, metadata=self.metadata)
        try:
            if opened is not None:
                headers = await call.initial_metadata()
                if not call.done():
                    opened(list(wire.shards_named(headers)))
            async for event in call:
                yield event
        except grpc.aio.AioRpcError as exc:
            raise wire.error_from(exc) from None
        finally:
            call.cancel()

    # -- the calls, as the commands use them

    def ref(self, ref: int | str) -> pb.TaskRef:
        return wire.ref_message(ref)

    async def submit(self, spec: pb.TaskSpec) -> pb.SubmitResponse:
        request = pb.SubmitRequest(task=spec)
        return await self.call(lambda: self.tasks.Submit(request, metadata=self.metadata))

    async def get(self, ref: int | str) -> pb.TaskInfo:
        request = pb.GetRequest(task=wire.ref_message(ref))
        info: pb.TaskInfo = await self._noted(lambda: self.tasks.Get(request, metadata=self.metadata), ref)
        return info

    async def explain(self, ref: int | str) -> pb.Explanation:
        request = pb.ExplainRequest(task=wire.ref_message(ref))
        explanation: pb.Explanation = await self._noted(
            lambda: self.tasks.Explain(request, metadata=self.metadata), ref)
        return explanation

    async def dependents(self, ref: int | str, depth: int, limit: int) -> pb.DependentsResponse:
        request = pb.DependentsRequest(task=wire.ref_message(ref), depth=depth, limit=limit)
        response: pb.DependentsResponse = await self._noted(
            lambda: self.tasks.Dependents(request, metadata=self.metadata), ref)
        return response

    async def wait_once(self, ref: int | str, timeout: float | None) -> pb.TaskResult:
        request = pb.WaitRequest(task=wire.ref_message(ref))
        if timeout is not None:
            request.timeout_s = timeout
        result: pb.TaskResult = await self._noted(lambda: self.tasks.Wait(request, metadata=self.metadata), ref)
        return result

    async def cancel(self, ref: int | str) -> bool:
        request = pb.CancelRequest(task=wire.ref_message(ref))
        response = await self.call(lambda: self.tasks.Cancel(request, metadata=self.metadata), ref)
        return bool(response.cancelled)

    async def list_tasks(self, pools: list[str], statuses: list[pb.TaskStatus], after: int, limit: int, *,
                         retry_for: float | None = None) -> pb.ListTasksResponse:
        request = pb.ListTasksRequest(pools=pools, statuses=statuses, after=after, limit=limit)
        return await self.call(lambda: self.tasks.ListTasks(request, metadata=self.metadata), retry_for=retry_for)

    async def workers(self, pools: list[str], *, retry_for: float | None = None) -> pb.ListWorkersResponse:
        request = pb.ListWorkersRequest(pools=pools)
        return await self.call(lambda: self.admin.ListWorkers(request, metadata=self.metadata), retry_for=retry_for)

    async def recurring(self, *, retry_for: float | None = None) -> pb.ListRecurringResponse:
        return await self.call(lambda: self.admin.ListRecurring(pb.ListRecurringRequest(), metadata=self.metadata),
                               retry_for=retry_for)

    async def add_recurring(self, request: pb.AddRecurringRequest) -> pb.AddRecurringResponse:
        return await self.call(lambda: self.admin.AddRecurring(request, metadata=self.metadata))

    async def remove_recurring(self, name: str) -> bool:
        request = pb.RemoveRecurringRequest(name=name)
        response = await self.call(lambda: self.admin.RemoveRecurring(request, metadata=self.metadata))
        return bool(response.removed)

    async def snapshot(self, *, retry_for: float | None = None) -> pb.SnapshotResponse:
        return await self.call(lambda: self.admin.Snapshot(pb.SnapshotRequest(), metadata=self.metadata),
                               retry_for=retry_for)


def client_from(settings: Settings) -> Client:
    """A ``cronoq.client.Client`` with these settings (for subcommands that
    prefer the client's typed results)."""
    return Client(settings.target, token=settings.token, credentials=_credentials(settings), options=channel_options(),
                  retry_for=settings.retry_for)


def _credentials(settings: Settings) -> grpc.ChannelCredentials | None:
    if not settings.tls:
        return None
    return grpc.ssl_channel_credentials(root_certificates=settings.ca, private_key=settings.key,
                                        certificate_chain=settings.cert)
