"""The gRPC servicers' unary wrapper (cronoq.server.grpc_api): its deadline,
its errors, and that a call runs in the RPC's own task."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from cronoq.server.errors import Code, ServiceError
from cronoq.server.grpc_api import _Base

pytestmark = pytest.mark.asyncio


class Aborted(Exception):
    pass


class Context:
    """The parts of grpc.aio.ServicerContext the wrapper touches."""

    def __init__(self) -> None:
        self.aborted: tuple[Any, str] | None = None

    def invocation_metadata(self) -> tuple[()]:
        return ()

    def peer(self) -> str:
        return "ipv4:127.0.0.1:50000"

    async def abort(self, code: Any, message: str, trailing_metadata: Any = ()) -> None:
        self.aborted = (code, message)
        raise Aborted


def servicer(deadline: float) -> _Base:
    service = SimpleNamespace(sharded=False, limits=SimpleNamespace(max_wait_s=deadline, request_timeout_s=0.0))
    auth = SimpleNamespace(enabled=False, authenticate=lambda *args, **kwargs: "caller")
    return _Base(service, auth)  # type: ignore[arg-type]


async def test_a_call_past_the_deadline_is_cancelled_with_the_reason():
    context = Context()

    async def slow(caller: Any, request: Any) -> None:
        await asyncio.sleep(30)

    with pytest.raises(Aborted):
        await servicer(0.05).unary(context, slow, None)  # type: ignore[arg-type]
    assert context.aborted == (grpc.StatusCode.CANCELLED, "the call ran longer than 0.05 s")


async def test_a_call_runs_in_the_rpcs_own_task_and_its_answer_comes_back():
    # No task of its own per call (asyncio.wait_for made one): fewer loop steps on every RPC.
    outer = asyncio.current_task()

    async def call(caller: Any, request: Any) -> tuple[Any, Any, bool]:
        return caller, request, asyncio.current_task() is outer

    assert await servicer(5.0).unary(Context(), call, "request") == ("caller", "request", True)  # type: ignore[arg-type]


async def test_a_service_error_becomes_its_status_and_the_deadline_stays_out_of_it():
    context = Context()

    async def refused(caller: Any, request: Any) -> None:
        raise ServiceError(Code.NOT_FOUND, "no task 7")

    with pytest.raises(Aborted):
        await servicer(5.0).unary(context, refused, None)  # type: ignore[arg-type]
    assert context.aborted == (grpc.StatusCode.NOT_FOUND, "no task 7")
    await asyncio.sleep(0)   # the deadline's timer was cancelled with its block: nothing fires later
    assert asyncio.current_task() is not None and not asyncio.current_task().cancelling()  # type: ignore[union-attr]
