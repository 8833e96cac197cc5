"""The HTTP listener against hostile and careless clients, over sockets to
real server processes: request-smuggling inputs (each a 400 and the end of
the connection, at once, never a traceback), the dashboard's files served
from a fixed list, credentials judged on the head before a body is read,
cross-site requests refused, the deadlines (head, keep-alive, body, write),
the connection cap, accept failures kept to one log line, and failed
authentications logged, limited and counted."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from httpkit import Raw, request_bytes
from serverkit import ADMIN, AUTH, CLIENT, LISTEN, METRICS

# The head deadline is far longer than a socket read waits (Raw: 30 s): an
# answer that only came at the deadline fails the test.
PATIENT = LISTEN + AUTH + """
[limits]
http_head_timeout_s = 120
http_keepalive_timeout_s = 120
[[pools]]
name = "default"
"""


@pytest.fixture(scope="module")
def server(module_servers):
    return module_servers(PATIENT, name="edge")


def head(method: str = "POST", path: str = "/v1/tasks", *fields: bytes, token: str | None = CLIENT) -> bytes:
    lines = [b"%s %s HTTP/1.1" % (method.encode(), path.encode()), b"host: localhost"]
    if token:
        lines.append(b"authorization: Bearer " + token.encode())
    lines += fields
    return b"\r\n".join(lines) + b"\r\n\r\n"


CHUNKED = (b"content-type: application/json", b"transfer-encoding: chunked")
JSON = b"content-type: application/json"

# (name, bytes): each must be refused with 400 and the connection closed.
SMUGGLING = [
    ("chunk size 0x5", head("POST", "/v1/tasks", *CHUNKED) + b"0x2\r\n{}\r\n0\r\n\r\n"),
    ("chunk size +5", head("POST", "/v1/tasks", *CHUNKED) + b"+2\r\n{}\r\n0\r\n\r\n"),
    ("chunk size 0_5", head("POST", "/v1/tasks", *CHUNKED) + b"0_2\r\n{}\r\n0\r\n\r\n"),
    ("chunk size -0", head("POST", "/v1/tasks", *CHUNKED) + b"-0\r\n\r\n"),
    ("bare LF in a chunk extension", head("POST", "/v1/tasks", *CHUNKED) + b"2;a=b\nc\r\n{}\r\n0\r\n\r\n"),
    ("bare LF ending a chunk size line", head("POST", "/v1/tasks", *CHUNKED) + b"2\n{}\r\n0\r\n\r\n"),
    ("bare LF after chunk data", head("POST", "/v1/tasks", *CHUNKED) + b"2\r\n{}\n0\r\n\r\n"),
    ("CR inside a header value", head("POST", "/v1/tasks", JSON, b"x-a: b\rc", b"content-length: 2") + b"{}"),
    ("LF inside a header value smuggling a content-length",
     head("POST", "/v1/tasks", JSON, b"x-a: b\ncontent-length: 2") + b"{}"),
    ("NUL inside a header value", head("POST", "/v1/tasks", JSON, b"x-a: b\x00c", b"content-length: 2") + b"{}"),
    ("a non-token header name", head("GET", "/healthz", b"x(a): b")),
    ("a space inside a header name", head("GET", "/healthz", b"x a: b")),
    ("whitespace before the colon", head("GET", "/healthz", b"x-a : b")),
    ("obsolete line folding", head("GET", "/healthz", b"x-a: b", b" folded")),
    ("content-length with a superscript digit", head("POST", "/v1/tasks", JSON, "content-length: \u00b2".encode())),
    ("content-length with a sign", head("POST", "/v1/tasks", JSON, b"content-length: +2") + b"{}"),
    ("content-length as a list", head("POST", "/v1/tasks", JSON, b"content-length: 2, 2") + b"{}"),
    ("transfer-encoding twice", head("POST", "/v1/tasks", JSON, b"transfer-encoding: chunked",
                                     b"transfer-encoding: chunked") + b"0\r\n\r\n"),
    ("a head with bare LF line endings", b"GET /healthz HTTP/1.1\nhost: localhost\n\n"),
    ("an empty request line", b"\r\n\r\n"),
    ("a bare LF before the request line", b"\n" + head("GET", "/healthz")),
    ("HTTP/1.1 without Host", b"GET /healthz HTTP/1.1\r\n\r\n"),
    ("two Host fields", b"GET /healthz HTTP/1.1\r\nhost: localhost\r\nhost: evil.example\r\n\r\n"),
    ("an unknown method", b"FROB /healthz HTTP/1.1\r\nhost: localhost\r\n\r\n"),
]


@pytest.mark.parametrize("data", [d for _, d in SMUGGLING], ids=[n for n, _ in SMUGGLING])
def test_request_smuggling_inputs_get_400_at_once_and_the_connection_closed(server, data):
    with Raw(server.http_port) as raw:
        raw.send(data)
        status, headers, body = raw.response()
        assert (status, headers["connection"]) == (400, "close"), body
        assert json.loads(body)["code"] == "bad_request"
        assert raw.closed_by_peer()


def test_nothing_of_the_refused_requests_was_admitted_nor_logged_as_a_failure(server):
    for _, data in SMUGGLING:   # (again, in case this test runs alone)
        with Raw(server.http_port) as raw:
            raw.send(data)
            assert raw.response()[0] == 400
    with Raw(server.http_port) as raw:
        raw.send(request_bytes("GET", "/v1/tasks", token=CLIENT))
        status, _, body = raw.response()
        assert status == 200 and json.loads(body)["tasks"] == []
    assert "Traceback" not in server.log and " ERROR " not in server.log


def test_a_blank_line_before_a_request_is_still_allowed(server):
    with Raw(server.http_port) as raw:
        raw.send(b"\r\n")
        raw.send(head("GET", "/healthz"))
        assert raw.response()[0] == 200


@pytest.mark.parametrize("path", ["/ui/" + "a" * 300 + ".js", "/ui/../cronoq/server/http.py", "/ui/%2e%2e/app.py",
                                  "/ui/.hidden.css", "/ui/ui/app.js", "/ui/" + "x/" * 100 + "index.html"])
def test_dashboard_files_come_from_a_fixed_list(server, path):
    with Raw(server.http_port) as raw:
        raw.send(head("GET", path, token=None))
        status, _, body = raw.response()
        assert status == 404 and "app.js" in json.loads(body)["error"]   # the message lists the files
        raw.send(head("GET", "/ui/app.js", token=None))
        assert raw.response()[0] == 200
    assert "Traceback" not in server.log


# ---------------------------------------------------------------- credentials on the head


@pytest.mark.parametrize("token, status", [("not-a-valid-token-0123456789", 401), (None, 401)])
def test_credentials_are_judged_before_the_body_is_read(server, token, status):
    with Raw(server.http_port) as raw:
        raw.send(head("POST", "/v1/tasks", JSON, b"content-length: 16000000", token=token))   # the body never comes
        got, headers, body = raw.response()
        assert got == status and headers["connection"] == "close" and raw.closed_by_peer()


def test_routes_and_roles_are_judged_before_the_body_is_read(server):
    with Raw(server.http_port) as raw:
        raw.send(head("POST", "/v1/nothing-here", JSON, b"content-length: 16000000"))
        assert raw.response()[0] == 404 and raw.closed_by_peer()
    with Raw(server.http_port) as raw:   # a metrics token may not submit
        raw.send(head("POST", "/v1/tasks", JSON, b"content-length: 16000000", token=METRICS))
        assert raw.response()[0] == 403 and raw.closed_by_peer()


def test_a_valid_head_waits_for_its_body(server):
    with Raw(server.http_port) as raw:
        raw.send(head("POST", "/v1/tasks", JSON, b"content-length: 17"))
        assert not raw.closed_by_peer(timeout=0.3)   # nothing answered yet: the body is due
        raw.send(b'{"key": "edge-1"}')
        status, _, body = raw.response()
        assert status == 200 and json.loads(body)["duplicate"] is False


def test_a_refusal_without_a_body_keeps_the_connection(server):
    with Raw(server.http_port) as raw:
        raw.send(head("GET", "/v1/tasks", token="not-a-valid-token-0123456789") + head("GET", "/healthz"))
        assert raw.response()[0] == 401
        assert raw.response()[0] == 200
        assert not raw.closed_by_peer(timeout=0.2)


# ---------------------------------------------------------------- cross-site requests

OPEN = LISTEN + """
[[pools]]
name = "default"
"""


def test_state_changing_requests_from_another_site_are_refused(server):
    with Raw(server.http_port) as raw:
        raw.send(request_bytes("POST", "/v1/tasks", {"key": "cross-1"}, token=ADMIN))
        status, _, body = raw.response()
        assert status == 200
        task = json.loads(body)["id"]
        attempts = [
            request_bytes("POST", f"/v1/tasks/{task}:resubmit", token=ADMIN, headers={"origin": "http://evil.example"}),
            request_bytes("POST", f"/v1/tasks/{task}:resubmit", token=ADMIN, headers={"sec-fetch-site": "cross-site"}),
            request_bytes("DELETE", f"/v1/tasks/{task}", token=ADMIN, headers={"origin": "http://evil.example"}),
            request_bytes("DELETE", "/v1/tasks/by-key/cross-1", token=ADMIN, headers={"sec-fetch-site": "same-site"}),
            request_bytes("POST", "/v1/tasks", {"key": "cross-2"}, token=ADMIN, headers={"origin": "null"}),
            request_bytes("DELETE", "/v1/recurring/any", token=ADMIN,
                          headers={"origin": "http://localhost.evil.example"}),
        ]
    for data in attempts:
        with Raw(server.http_port) as refused:   # (one refused with a body ends its connection)
            refused.send(data)
            status, _, body = refused.response()
            assert status == 403 and "another site" in json.loads(body)["error"], body
    with Raw(server.http_port) as raw:
        # Its own origin (as the dashboard sends), a proxy's forwarded host, and non-browser clients pass.
        raw.send(request_bytes("DELETE", f"/v1/tasks/{task}", token=ADMIN,
                               headers={"origin": "http://localhost", "sec-fetch-site": "same-origin"}))
        assert raw.response()[0] == 200
        raw.send(request_bytes("POST", "/v1/tasks", {"key": "cross-3"}, token=ADMIN,
                               headers={"origin": "https://sched.example", "x-forwarded-host": "sched.example"}))
        assert raw.response()[0] == 200
        # Reads are not refused (a page cannot read the answer without CORS, which is never granted).
        raw.send(request_bytes("GET", f"/v1/tasks/{task}", token=ADMIN, headers={"origin": "http://evil.example"}))
        status, headers, _ = raw.response()
        assert status == 200 and "access-control-allow-origin" not in headers


def test_with_authentication_off_a_page_of_another_site_cannot_change_the_scheduler(servers):
    server = servers(OPEN)
    with Raw(server.http_port) as raw:
        raw.send(request_bytes("POST", "/v1/tasks", {"key": "open-1"}, host=f"127.0.0.1:{server.http_port}",
                               headers={"origin": "http://evil.example", "sec-fetch-site": "cross-site"}))
        assert raw.response()[0] == 403 and raw.closed_by_peer()   # (its body was never read)
    with Raw(server.http_port) as raw:
        raw.send(request_bytes("POST", "/v1/tasks", {"key": "open-1"}, host=f"127.0.0.1:{server.http_port}"))
        assert raw.response()[0] == 200


# ---------------------------------------------------------------- deadlines

TIGHT = LISTEN + AUTH + """
[limits]
http_head_timeout_s = 1
http_keepalive_timeout_s = 1
http_write_timeout_s = 1
request_timeout_s = 2
[[pools]]
name = "default"
"""


@pytest.fixture(scope="module")
def tight(module_servers):
    return module_servers(TIGHT, name="tight")


def test_a_silent_connection_is_closed_after_the_head_deadline(tight):
    with Raw(tight.http_port) as raw:
        assert raw.closed_by_peer(timeout=30) and raw.buffer == b""


def test_a_head_that_does_not_finish_in_time_gets_408(tight):
    with Raw(tight.http_port) as raw:
        raw.send(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\n")
        status, headers, body = raw.response()
        assert status == 408 and json.loads(body)["code"] == "request_timeout" and raw.closed_by_peer()


def test_a_head_sent_a_byte_at_a_time_still_meets_its_deadline(tight):
    with Raw(tight.http_port) as raw:
        raw.send(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\nx-slow: ")
        for _ in range(300):   # a byte every 0.1 s, for far longer than the deadline
            try:
                raw.send(b"a")
            except (BrokenPipeError, ConnectionResetError):
                break
            raw.sock.settimeout(0.1)
            try:
                data = raw.sock.recv(65536)
            except socket.timeout:
                continue
            raw.buffer += data
            break
        raw.sock.settimeout(30)
        assert raw.response()[0] == 408


def test_an_idle_keep_alive_connection_is_closed(tight):
    with Raw(tight.http_port) as raw:
        raw.send(request_bytes("GET", "/healthz"))
        assert raw.response()[0] == 200
        assert raw.closed_by_peer(timeout=30)


def test_a_body_that_does_not_arrive_in_time_gets_408(tight):
    with Raw(tight.http_port) as raw:
        raw.send(head("POST", "/v1/tasks", JSON, b"content-length: 10") + b'{"k')
        status, _, body = raw.response()
        assert status == 408 and "body" in json.loads(body)["error"] and raw.closed_by_peer()


def scrape(server, name: str, **labels: str) -> float:
    response = httpx.get(f"http://127.0.0.1:{server.http_port}/metrics",
                         headers={"authorization": f"Bearer {METRICS}"}, timeout=30)
    assert response.status_code == 200, response.text
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    raise AssertionError(f"no sample {name} {labels} in /metrics")


def test_a_client_that_does_not_read_its_answers_is_dropped(tight):
    before = scrape(tight, "cronoq_http_write_timeouts_total")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", tight.http_port))
    try:
        # Large answers, pipelined, never read: they pile up in the server's buffer.
        request = request_bytes("GET", "/v1/openapi.json")
        sock.sendall(request * 64)
        deadline = time.monotonic() + 60
        while scrape(tight, "cronoq_http_write_timeouts_total") == before:
            assert time.monotonic() < deadline, "the server kept the connection of a client that does not read"
            time.sleep(0.2)
        # The connection is gone: what was buffered for it was dropped, not sent.
        received = 0
        sock.settimeout(30)
        try:
            while chunk := sock.recv(1 << 20):
                received += len(chunk)
        except ConnectionResetError:
            pass
        assert received < 64 * len(httpx.get(f"http://127.0.0.1:{tight.http_port}/v1/openapi.json").content)
    finally:
        sock.close()


# ---------------------------------------------------------------- the connection cap

CAPPED = LISTEN + AUTH + """
[limits]
max_http_connections = 4
http_head_timeout_s = 120
http_keepalive_timeout_s = 120
[[pools]]
name = "default"
"""


def test_connections_beyond_the_cap_get_503_and_idle_ones_make_room(servers):
    server = servers(CAPPED)
    busy = [Raw(server.http_port) for _ in range(4)]
    try:
        for raw in busy:   # each has begun a head: none is idle
            raw.send(b"GET /healthz HTTP/1.1\r\n")
        with Raw(server.http_port) as extra:
            status, headers, body = extra.response()
            assert status == 503 and headers["connection"] == "close" and headers["retry-after"] == "1"
            assert "limits.max_http_connections" in json.loads(body)["error"]
        busy.pop().close()
        with Raw(server.http_port) as extra:   # room again (once the server saw the close)
            for _ in range(50):
                extra.send(request_bytes("GET", "/healthz"))
                try:
                    status = extra.response()[0]
                except ConnectionError:
                    status = 503
                if status == 200:
                    break
                extra.close()
                time.sleep(0.1)
                extra.__init__(server.http_port)
            assert status == 200
    finally:
        for raw in busy:
            raw.close()
    # Idle keep-alive connections give way, the longest idle first.
    idle = [Raw(server.http_port) for _ in range(4)]
    try:
        for raw in idle:
            raw.send(request_bytes("GET", "/healthz"))
            assert raw.response()[0] == 200
        with Raw(server.http_port) as extra:
            extra.send(request_bytes("GET", "/healthz"))
            assert extra.response()[0] == 200
        assert idle[0].closed_by_peer(timeout=30)
        assert not idle[3].closed_by_peer(timeout=0.2)
    finally:
        for raw in idle:
            raw.close()
    assert scrape(server, "cronoq_http_connections_refused_total") >= 1


def test_failed_accepts_are_one_log_line_an_interval_and_the_server_recovers(servers):
    # An open-file limit below the connection cap: accepts fail before the cap answers.
    server = servers(LISTEN + AUTH + '[[pools]]\nname = "default"\n', max_files=128)
    assert "the process may open 128 files" in server.log
    held = []
    try:
        for _ in range(160):
            held.append(socket.create_connection(("127.0.0.1", server.http_port), timeout=30))
        server.wait_for("cannot accept new connections", timeout=30)
        time.sleep(2.5)   # more failed accepts (one a second), which must stay quiet
    finally:
        for sock in held:
            sock.close()
    assert server.count("cannot accept new connections") == 1
    assert "Traceback" not in server.log and "socket.accept() out of system resource" not in server.log
    for _ in range(100):   # the freed descriptors let it serve again
        try:
            if httpx.get(f"http://127.0.0.1:{server.http_port}/healthz", timeout=5).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    assert scrape(server, "cronoq_accept_errors_total") >= 2


# ---------------------------------------------------------------- failed authentication


def test_failed_authentications_are_logged_limited_and_counted(servers):
    server = servers(LISTEN + AUTH + '[[pools]]\nname = "default"\n')
    bad = "bad-token-" + "z" * 30
    statuses = []
    with Raw(server.http_port) as raw:
        for _ in range(25):
            raw.send(request_bytes("GET", "/v1/tasks", token=bad))
            status, headers, _ = raw.response()
            statuses.append(status)
            if status == 429:
                assert int(headers["retry-after"]) >= 1
        # A valid credential from the same address is never refused by the limit.
        raw.send(request_bytes("GET", "/v1/tasks", token=CLIENT))
        assert raw.response()[0] == 200
    assert statuses[:20] == [401] * 20 and set(statuses[20:]) == {429}
    assert server.count("authentication failed from 127.0.0.1 (http): the token is not valid") == 1
    assert bad not in server.log and "WARNING" in server.log
    assert scrape(server, "cronoq_auth_failures_total", transport="http", reason="invalid_token") == 20
    assert scrape(server, "cronoq_auth_failures_total", transport="http", reason="rate_limited") >= 5


@pytest.mark.asyncio
async def test_failed_authentications_over_grpc_are_limited_too(servers):
    import grpc

    from cronoq._proto import cronoq_pb2 as pb
    from cronoq._proto import cronoq_pb2_grpc as pb_grpc

    server = servers(LISTEN + AUTH + '[[pools]]\nname = "default"\n')
    codes = []
    async with grpc.aio.insecure_channel(server.target) as channel:
        stub = pb_grpc.TasksStub(channel)
        for _ in range(25):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.ListTasks(pb.ListTasksRequest(), metadata=(("authorization", "Bearer wrong-" + "q" * 30),))
            codes.append(caught.value.code())
        ok = await stub.ListTasks(pb.ListTasksRequest(), metadata=(("authorization", f"Bearer {CLIENT}"),))
        assert list(ok.tasks) == []
    assert codes[:20] == [grpc.StatusCode.UNAUTHENTICATED] * 20
    assert set(codes[20:]) == {grpc.StatusCode.RESOURCE_EXHAUSTED}
    assert server.count("authentication failed from 127.0.0.1 (grpc)") == 1
    assert scrape(server, "cronoq_auth_failures_total", transport="grpc", reason="invalid_token") == 20
