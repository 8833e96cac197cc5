"""The gateway's HTTP/1.1, by hand over sockets to a real server process:
keep-alive, pipelining, chunked bodies, expect: 100-continue, framing
errors, HEAD, connection: close, HTTP/1.0; the loopback Host rule when
authentication is off (on every route, on both listeners); HTTPS with a
bearer token and with a client certificate mapped to a role."""

from __future__ import annotations

import json
import ssl

import httpx
import pytest

from certkit import CA
from httpkit import Raw, request_bytes
from serverkit import AUTH, CLIENT, LISTEN



CONFIG = LISTEN + AUTH + """
[limits]
max_http_body_bytes = 8192
[[pools]]
name = "default"
"""


@pytest.fixture(scope="module")
def server(module_servers):
    return module_servers(CONFIG, name="wire")


def submit(body: object = None, **headers: str) -> bytes:
    return request_bytes("POST", "/v1/tasks", {} if body is None else body, token=CLIENT, headers=headers)


def ok_json(response: tuple[int, dict[str, str], bytes]) -> dict:
    status, headers, body = response
    assert status == 200, body
    return json.loads(body)


def test_keep_alive_and_pipelined_requests_are_answered_in_order(server):
    with Raw(server.http_port) as raw:
        first = ok_json((raw.send(submit({"key": "w-1"})), raw.response())[1])
        second = ok_json((raw.send(submit({"key": "w-1"})), raw.response())[1])   # the same connection
        assert second == {"id": first["id"], "duplicate": True}
        # Three requests in one write: three answers, in order.
        raw.send(submit({"key": "w-2"}) + request_bytes("GET", f"/v1/tasks/{first['id']}", token=CLIENT)
                 + request_bytes("GET", "/healthz"))
        two = ok_json(raw.response())
        assert two["duplicate"] is False and int(two["id"]) > int(first["id"])
        assert ok_json(raw.response())["key"] == "w-1"
        assert raw.response()[2] == b"ok\n"
        # Blank lines between requests are ignored.
        raw.send(b"\r\n" + request_bytes("GET", "/healthz"))
        assert raw.response()[0] == 200
        assert not raw.closed_by_peer(timeout=0.2)


def test_connection_close_and_http_1_0(server):
    with Raw(server.http_port) as raw:
        raw.send(request_bytes("GET", "/healthz", headers={"connection": "close"}))
        status, headers, _ = raw.response()
        assert status == 200 and headers["connection"] == "close" and raw.closed_by_peer()
    with Raw(server.http_port) as raw:
        raw.send(b"GET /healthz HTTP/1.0\r\n\r\n")
        assert raw.response()[0] == 200 and raw.closed_by_peer()
    with Raw(server.http_port) as raw:
        raw.send(b"GET /healthz HTTP/1.0\r\nconnection: keep-alive\r\n\r\n")
        assert raw.response()[0] == 200 and not raw.closed_by_peer(timeout=0.2)


def test_chunked_bodies_and_expect_continue(server):
    with Raw(server.http_port) as raw:
        body = json.dumps({"key": "w-chunked", "tags": {"a": "b"}}).encode()
        chunks = b"%x\r\n%s\r\n%x;ext=1\r\n%s\r\n0\r\nx-trailer: 1\r\n\r\n" % (5, body[:5], len(body) - 5, body[5:])
        raw.send(request_bytes("POST", "/v1/tasks", token=CLIENT,
                               headers={"content-type": "application/json", "transfer-encoding": "chunked"}) + chunks)
        sub = ok_json(raw.response())
        raw.send(request_bytes("GET", f"/v1/tasks/{sub['id']}", token=CLIENT))
        assert ok_json(raw.response())["tags"] == {"a": "b"}
        # expect: 100-continue gets the interim answer before the body is sent.
        body = json.dumps({"key": "w-expect"}).encode()
        raw.send(request_bytes("POST", "/v1/tasks", token=CLIENT, headers={
            "content-type": "application/json", "content-length": str(len(body)), "expect": "100-continue"}))
        assert raw.response()[0] == 100
        raw.send(body)
        assert ok_json(raw.response())["duplicate"] is False
    # Too large: refused before reading it (no 100), or once the chunks pass the limit.
    with Raw(server.http_port) as raw:
        raw.send(request_bytes("POST", "/v1/tasks", token=CLIENT, headers={
            "content-type": "application/json", "content-length": "9000", "expect": "100-continue"}))
        status, headers, body = raw.response()
        assert status == 413 and json.loads(body)["code"] == "content_too_large" and raw.closed_by_peer()
    with Raw(server.http_port) as raw:
        raw.send(request_bytes("POST", "/v1/tasks", token=CLIENT, headers={
            "content-type": "application/json", "transfer-encoding": "chunked"}) + b"1000\r\n" + b" " * 4096
            + b"\r\n1000\r\n" + b" " * 4096 + b"\r\n1\r\n ")   # its 8,193rd byte
        assert raw.response()[0] == 413 and raw.closed_by_peer()


@pytest.mark.parametrize("data, status", [
    (b"GARBAGE\r\n\r\n", 400),
    (b"GET /healthz HTTP/1.1 extra\r\n\r\n", 400),
    (b"GET http://example/healthz HTTP/1.1\r\nhost: x\r\n\r\n", 400),
    (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505),
    (b"GET /healthz HTTP/1.1\r\nbad header\r\n\r\n", 400),
    (b"POST /v1/tasks HTTP/1.1\r\ncontent-length: 2\r\ntransfer-encoding: chunked\r\n\r\n{}", 400),
    (b"POST /v1/tasks HTTP/1.1\r\ncontent-length: 2\r\ncontent-length: 2\r\n\r\n{}", 400),
    (b"POST /v1/tasks HTTP/1.1\r\ncontent-length: -2\r\n\r\n{}", 400),
    (b"POST /v1/tasks HTTP/1.1\r\ntransfer-encoding: gzip\r\n\r\n", 501),
    (b"POST /v1/tasks HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n", 400),
    (b"GET /healthz HTTP/1.1\r\n" + b"x-filler: " + b"a" * 20000 + b"\r\n\r\n", 431),
    (b"GET /healthz HTTP/1.1\r\n" + b"x: y\r\n" * 101 + b"\r\n", 431),
], ids=["garbage", "request-line", "absolute-form", "http2", "header", "length-and-chunked", "two-lengths",
        "negative-length", "gzip", "bad-chunk", "huge-head", "many-headers"])
def test_requests_that_cannot_be_framed_are_refused_and_the_connection_closed(server, data, status):
    with Raw(server.http_port) as raw:
        raw.send(data)
        got, headers, body = raw.response()
        assert got == status and headers["connection"] == "close"
        assert set(json.loads(body)) == {"error", "code"}
        assert raw.closed_by_peer()


def test_head_answers_without_a_body(server):
    with Raw(server.http_port) as raw:
        raw.send(request_bytes("HEAD", "/healthz") + request_bytes("GET", "/healthz"))
        status, headers, body = raw.response(head_only=True)
        assert (status, headers["content-length"]) == (200, "3")   # the length of the GET's body, not sent
        assert raw.response()[::2] == (200, b"ok\n")


# ---------------------------------------------------------------- authentication off

OPEN = LISTEN + 'metrics_addr = "127.0.0.1:0"\n'


def test_without_credentials_every_route_of_both_listeners_needs_a_loopback_host(servers):
    server = servers(OPEN)
    for port in (server.http_port, server.metrics_port):
        with Raw(port) as raw:
            for path in ("/metrics", "/healthz") + (("/v1/tasks", "/v1/snapshot") if port == server.http_port else ()):
                raw.send(request_bytes("GET", path, host="attacker.example:7071"))
                status, _, body = raw.response()
                assert status == 403 and "loopback" in json.loads(body)["error"], (port, path)
    with Raw(server.http_port) as raw:
        for host in ("localhost:7071", "127.0.0.2", "[::1]:7071", "app.localhost"):
            raw.send(request_bytes("POST", "/v1/tasks", {"key": f"open-{host}"}, host=host))
            assert ok_json(raw.response())["duplicate"] is False   # every caller is an admin
    relaxed = servers(OPEN, args=("--insecure-no-auth",))
    with Raw(relaxed.http_port) as raw:
        raw.send(request_bytes("POST", "/v1/tasks", {}, host="attacker.example"))
        assert raw.response()[0] == 200


# ---------------------------------------------------------------- TLS


@pytest.mark.asyncio
async def test_https_with_a_bearer_token_or_a_mapped_client_certificate(servers, tmp_path):
    ca = CA()
    (tmp_path / "ca.pem").write_bytes(ca.pem)
    cert, key = ca.write(tmp_path, "server", ca.issue(["localhost"], ips=["127.0.0.1"], server=True))
    client_cert, client_key = ca.write(tmp_path, "client", ca.issue(["batch-1.internal"]))
    server = servers(LISTEN + AUTH + f"""
[server.tls]
cert = "{cert}"
key = "{key}"
client_ca = "{tmp_path / 'ca.pem'}"
[[auth.certs]]
dns_name = "batch-1.internal"
role = "client"
""")
    context = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
    base = f"https://127.0.0.1:{server.http_port}"
    async with httpx.AsyncClient(base_url=base, verify=context, timeout=30) as http:
        assert (await http.get("/readyz")).text == "ready\n"                     # no certificate needed
        assert (await http.post("/v1/tasks", json={})).status_code == 401
        r = await http.post("/v1/tasks", json={}, headers={"authorization": f"Bearer {CLIENT}"})
        assert r.status_code == 200 and r.json()["duplicate"] is False
    context.load_cert_chain(str(client_cert), str(client_key))
    async with httpx.AsyncClient(base_url=base, verify=context, timeout=30) as http:
        r = await http.post("/v1/tasks", json={"key": "by-certificate"})           # the certificate is a client
        assert r.status_code == 200, r.text
        assert (await http.get("/v1/snapshot")).status_code == 403
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}", timeout=30) as plain:
        with pytest.raises(httpx.HTTPError):
            await plain.get("/readyz")
