"""gRPC-Web on the HTTP listener ([server.grpc_web]), against a real
cronoq-server: binary framing of unary calls and Watch, statuses in
trailers, CORS for listed origins only, roles, and malformed frames."""

from __future__ import annotations

import asyncio
import struct
from urllib.parse import unquote

import httpx
import pytest

from cronoq._proto import cronoq_pb2 as pb
from cronoq.server import grpc_web
from serverkit import ADMIN, AUTH, CLIENT, LISTEN, METRICS

ORIGIN = "https://app.example"
CONFIG = LISTEN + AUTH + f"""
[server.grpc_web]
allowed_origins = ["{ORIGIN}"]

[[pools]]
name = "default"
"""


@pytest.fixture(scope="module")
def server(module_servers):
    return module_servers(CONFIG, name="grpcweb")


def frames(body: bytes) -> list[tuple[int, bytes]]:
    found, at = [], 0
    while at < len(body):
        flag, length = struct.unpack_from(">BI", body, at)
        found.append((flag, body[at + 5:at + 5 + length]))
        at += 5 + length
    assert at == len(body), "a frame runs past the body"
    return found


def trailers(data: bytes) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in data.decode("latin-1").split("\r\n") if line)


async def call(server, name: str, message, *, token: str | None = CLIENT, origin: str | None = None,
               content_type: str = "application/grpc-web+proto", body: bytes | None = None,
               host: str | None = None) -> tuple[httpx.Response, list[tuple[int, bytes]], dict[str, str]]:
    """One unary call: the response, its frames, and its status fields
    (from the trailers frame, or the headers of a trailers-only answer)."""
    headers = {"content-type": content_type, "x-grpc-web": "1"}
    if token:
        headers["authorization"] = f"Bearer {token}"
    if origin:
        headers["origin"] = origin
    if host:
        headers["host"] = host
    if body is None:
        body = grpc_web.frame(0, message.SerializeToString())
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as http:
        response = await http.post(f"/cronoq.v1.{name}", content=body, headers=headers)
    found = frames(response.content) if response.status_code == 200 else []
    status = trailers(found[-1][1]) if found and found[-1][0] == 0x80 else {
        k: v for k, v in response.headers.items() if k.startswith("grpc-")}
    return response, found, status


def test_the_method_table_is_the_protos_services():
    services = pb.DESCRIPTOR.services_by_name
    names = {f"{s}/{m.name}" for s in ("Tasks", "Workers", "Admin") for m in services[s].methods}
    assert set(grpc_web.METHODS) == names
    for name, method in grpc_web.METHODS.items():
        service, _, short = name.partition("/")
        descriptor = services[service].methods_by_name[short]
        assert method.request.DESCRIPTOR is descriptor.input_type
        assert method.streams == descriptor.server_streaming


@pytest.mark.asyncio
async def test_a_unary_submit_and_get_in_binary_framing(server):
    response, found, status = await call(server, "Tasks/Submit", pb.SubmitRequest(task=pb.TaskSpec(pool="default", kind="k")))
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/grpc-web+proto"
    assert [flag for flag, _ in found] == [0x00, 0x80]
    assert status["grpc-status"] == "0"
    task_id = pb.SubmitResponse.FromString(found[0][1]).id
    assert task_id > 0
    _, found, status = await call(server, "Tasks/Get", pb.GetRequest(task=pb.TaskRef(id=task_id)))
    assert status["grpc-status"] == "0"
    info = pb.TaskInfo.FromString(found[0][1])
    assert info.id == task_id and info.kind == "k"


@pytest.mark.asyncio
async def test_errors_are_trailers_only_answers_with_the_native_codes(server):
    response, found, status = await call(server, "Tasks/Get", pb.GetRequest(task=pb.TaskRef(id=987654321)))
    assert response.status_code == 200 and response.content == b""
    assert status["grpc-status"] == str(grpc_web.STATUS_NUMBERS["NOT_FOUND"])
    response, _, status = await call(server, "Tasks/Submit", pb.SubmitRequest(task=pb.TaskSpec(pool="nope", kind="k")))
    assert status["grpc-status"] == str(grpc_web.STATUS_NUMBERS["NOT_FOUND"])
    assert "nope" in unquote(status["grpc-message"])
    assert response.headers["cronoq-error"] == "UnknownPool"
    _, _, status = await call(server, "Tasks/Submit", pb.SubmitRequest(task=pb.TaskSpec(pool="default")), token=None)
    assert status["grpc-status"] == str(grpc_web.STATUS_NUMBERS["UNAUTHENTICATED"])
    _, _, status = await call(server, "Tasks/Submit", pb.SubmitRequest(task=pb.TaskSpec(pool="default")), token=METRICS)
    assert status["grpc-status"] == str(grpc_web.STATUS_NUMBERS["PERMISSION_DENIED"])
    _, _, status = await call(server, "Workers/Work", pb.WorkerMessage())
    assert status["grpc-status"] == str(grpc_web.STATUS_NUMBERS["UNIMPLEMENTED"])
    assert "bidirectional" in unquote(status["grpc-message"])
    _, _, status = await call(server, "Tasks/Nothing", pb.GetRequest())
    assert status["grpc-status"] == str(grpc_web.STATUS_NUMBERS["UNIMPLEMENTED"])


@pytest.mark.asyncio
async def test_admin_calls_need_the_admin_role(server):
    _, found, status = await call(server, "Admin/Snapshot", pb.SnapshotRequest(), token=ADMIN)
    assert status["grpc-status"] == "0"
    pb.SnapshotResponse.FromString(found[0][1])
    _, _, status = await call(server, "Admin/AddRecurring", pb.AddRecurringRequest(), token=CLIENT)
    assert status["grpc-status"] == str(grpc_web.STATUS_NUMBERS["PERMISSION_DENIED"])


@pytest.mark.parametrize("body, words", [
    (b"\x00\x00", "holds no frame"),
    (b"\x80\x00\x00\x00\x00", "trailers frame"),
    (b"\x01\x00\x00\x00\x00", "compressed"),
    (b"\x00\x00\x00\x00\x09abc", "the frame says 9 bytes"),
    (b"\x00\x00\x00\x00\x03\xff\xff\xff", "not a valid cronoq.v1.GetRequest"),
])
@pytest.mark.asyncio
async def test_malformed_frames_are_refused_with_a_reason(server, body, words):
    _, _, status = await call(server, "Tasks/Get", None, body=body)
    assert status["grpc-status"] != "0"
    assert words in unquote(status["grpc-message"])


@pytest.mark.asyncio
async def test_the_text_framing_and_other_media_types_are_refused(server):
    response, _, _ = await call(server, "Tasks/Get", pb.GetRequest(task=pb.TaskRef(id=1)), content_type="application/grpc-web-text")
    assert response.status_code == 415 and b"binary framing" in response.content
    response, _, _ = await call(server, "Tasks/Get", pb.GetRequest(task=pb.TaskRef(id=1)), content_type="application/json")
    assert response.status_code == 415


@pytest.mark.asyncio
async def test_cors_for_listed_origins_only(server):
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}") as http:
        preflight = await http.options("/cronoq.v1.Tasks/Submit", headers={
            "origin": ORIGIN, "access-control-request-method": "POST",
            "access-control-request-headers": "authorization, content-type, x-grpc-web"})
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == ORIGIN
        assert "authorization" in preflight.headers["access-control-allow-headers"]
        refused = await http.options("/cronoq.v1.Tasks/Submit", headers={
            "origin": "https://evil.example", "access-control-request-method": "POST"})
        assert refused.status_code == 403 and "access-control-allow-origin" not in refused.headers
    response, _, status = await call(server, "Tasks/Submit", pb.SubmitRequest(task=pb.TaskSpec(pool="default", kind="k")),
                                     origin=ORIGIN)
    assert status["grpc-status"] == "0"
    assert response.headers["access-control-allow-origin"] == ORIGIN
    assert "grpc-status" in response.headers["access-control-expose-headers"]
    response, found, status = await call(server, "Tasks/Submit", pb.SubmitRequest(task=pb.TaskSpec(pool="default", kind="k")),
                                         origin="https://evil.example")
    assert status["grpc-status"] == str(grpc_web.STATUS_NUMBERS["PERMISSION_DENIED"])
    assert not found and "access-control-allow-origin" not in response.headers


@pytest.mark.asyncio
async def test_watch_streams_a_frame_per_event(server):
    headers = {"content-type": "application/grpc-web+proto", "authorization": f"Bearer {CLIENT}"}
    body = grpc_web.frame(0, pb.WatchRequest(pools=["default"]).SerializeToString())
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}", timeout=30) as http:
        async with http.stream("POST", "/cronoq.v1.Tasks/Watch", content=body, headers=headers) as response:
            assert response.status_code == 200
            assert response.headers.get("transfer-encoding") == "chunked"
            submitted = pb.SubmitResponse.FromString((await call(
                server, "Tasks/Submit", pb.SubmitRequest(task=pb.TaskSpec(pool="default", kind="watched"))))[1][0][1]).id
            buffer = b""

            async def until_seen() -> pb.StatusEvent:
                nonlocal buffer
                async for chunk in response.aiter_raw():
                    buffer += chunk
                    while len(buffer) >= 5:
                        flag, length = struct.unpack_from(">BI", buffer)
                        if len(buffer) < 5 + length:
                            break
                        data, buffer = buffer[5:5 + length], buffer[5 + length:]
                        assert flag == 0x00
                        event = pb.StatusEvent.FromString(data)
                        if event.id == submitted:
                            return event
                raise AssertionError("the stream ended before the task's event")

            event = await asyncio.wait_for(until_seen(), 30)
            assert event.id == submitted


@pytest.mark.asyncio
async def test_without_the_section_the_paths_are_not_served(servers):
    plain = servers(LISTEN + AUTH + '[[pools]]\nname = "default"\n', name="plain")
    response, found, _ = await call(plain, "Tasks/Submit", pb.SubmitRequest(task=pb.TaskSpec(pool="default")))
    assert response.status_code == 404 and not found


@pytest.mark.asyncio
async def test_without_credentials_only_loopback_host_names_are_served(servers):
    open_server = servers(LISTEN + f'[server.grpc_web]\nallowed_origins = ["{ORIGIN}"]\n[[pools]]\nname = "default"\n',
                          name="open")
    request = pb.SubmitRequest(task=pb.TaskSpec(pool="default"))
    _, _, status = await call(open_server, "Tasks/Submit", request, token=None, host="attacker.example:7071")
    assert status["grpc-status"] == str(grpc_web.STATUS_NUMBERS["PERMISSION_DENIED"])
    assert "loopback" in unquote(status["grpc-message"])
    _, found, status = await call(open_server, "Tasks/Submit", request, token=None, host="localhost")
    assert status["grpc-status"] == "0" and pb.SubmitResponse.FromString(found[0][1]).id > 0
