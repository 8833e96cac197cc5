"""cronoq.client's conversions, without a server: values to payloads,
cronoq.Task objects to TaskSpec messages, gRPC errors to cronoq exceptions."""

from __future__ import annotations

import datetime

import grpc
import pytest

import cronoq
from cronoq._proto import cronoq_pb2 as pb
from cronoq.client import AccessDenied, ServerError
from cronoq.client.wire import encode, error_from, from_task, task_message


def test_payloads_keep_bytes_text_and_json_apart():
    assert encode(b"\x00raw") == (b"\x00raw", "application/octet-stream")
    assert encode("h\u00e9") == ("h\u00e9".encode(), "text/plain; charset=utf-8")
    assert encode({"a": [1, None]}) == (b'{"a":[1,null]}', "application/json")
    assert encode(None) == (b"null", "application/json")
    assert encode(b"x", "image/png") == (b"x", "image/png")
    with pytest.raises(TypeError, match="cannot send a set as JSON"):
        encode({1, 2})
    with pytest.raises(TypeError):
        encode(float("nan"))


def test_a_task_object_becomes_the_same_message_as_keyword_options():
    retry = cronoq.RetryPolicy(max_attempts=5, initial_backoff=0.5, multiplier=3, max_backoff=9, jitter=False)
    at = datetime.datetime(2030, 1, 1, tzinfo=datetime.timezone.utc)
    task = cronoq.Task({"doc": 1}, pool="llm", kind="summarize", priority="high", key="k", tenant="acme",
                       deadline_at=at, timeout=60, duration_hint=2, retry=retry, resources={"gpu": 1},
                       after=["a", 7], deps=[cronoq.Dep("b", on="failure")], tags={"t": "1"},
                       labels={"gpu": "a100"})
    message = from_task(task)
    assert (message.pool, message.kind, message.priority, message.key, message.tenant) == (
        "llm", "summarize", pb.PRIORITY_HIGH, "k", "acme")
    assert message.payload == b'{"doc":1}' and message.content_type == "application/json"
    assert message.deadline_unix_ns == 1_893_456_000 * 10 ** 9
    assert (message.timeout_s, message.duration_hint_s) == (60.0, 2.0)
    assert (message.retry.max_attempts, message.retry.initial_backoff_s, message.retry.multiplier,
            message.retry.max_backoff_s, message.retry.jitter) == (5, 0.5, 3, 9, False)
    assert dict(message.resources) == {"gpu": 1} and dict(message.labels) == {"gpu": "a100"}
    refs = [(d.ref.WhichOneof("ref"), d.ref.key or d.ref.id, d.cond) for d in message.deps]
    assert refs == [("key", "a", pb.EDGE_COND_ON_SUCCESS), ("id", 7, pb.EDGE_COND_ON_SUCCESS),
                    ("key", "b", pb.EDGE_COND_ON_FAILURE)]
    keywords = task_message({"doc": 1}, start_in=5, tolerance=2, on_miss="skip", deadline_in=30, after="a")
    assert (keywords.start_in_s, keywords.tolerance_s, keywords.on_miss, keywords.deadline_in_s) == (
        5, 2, pb.MISS_POLICY_SKIP, 30)
    assert [r.key for r in keywords.after] == ["a"]
    assert task_message().payload == b"" and task_message().content_type == ""
    with pytest.raises(ValueError, match="priority"):
        task_message(priority="urgent")


def rpc_error(code: grpc.StatusCode, details: str, kind: str | None = None) -> grpc.aio.AioRpcError:
    trailing = grpc.aio.Metadata(("cronoq-error", kind)) if kind else grpc.aio.Metadata()
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), trailing, details)


@pytest.mark.parametrize("code,kind,expected", [
    (grpc.StatusCode.NOT_FOUND, "UnknownTask", cronoq.UnknownTask),
    (grpc.StatusCode.NOT_FOUND, "UnknownPool", cronoq.UnknownPool),
    (grpc.StatusCode.INVALID_ARGUMENT, "Cycle", cronoq.Cycle),
    (grpc.StatusCode.INVALID_ARGUMENT, "UnknownDependency", cronoq.UnknownDependency),
    (grpc.StatusCode.INVALID_ARGUMENT, None, cronoq.InvalidTask),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, "QueueFull", cronoq.QueueFull),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, "ReservationConflict", cronoq.ReservationConflict),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, None, ServerError),
    (grpc.StatusCode.UNAVAILABLE, "SchedulerError", cronoq.SchedulerError),
    (grpc.StatusCode.DEADLINE_EXCEEDED, None, TimeoutError),
    (grpc.StatusCode.UNAUTHENTICATED, None, AccessDenied),
    (grpc.StatusCode.PERMISSION_DENIED, None, AccessDenied),
    (grpc.StatusCode.ALREADY_EXISTS, None, ServerError),
])
def test_status_codes_become_cronoq_exceptions(code, kind, expected):
    error = error_from(rpc_error(code, "the server's words", kind), ref=5)
    assert type(error) is expected
    assert "the server's words" in str(error)
    if isinstance(error, ServerError):
        assert error.code == code.name
