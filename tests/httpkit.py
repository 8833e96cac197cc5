"""HTTP by hand for the gateway's tests: a raw connection that sends exactly
the bytes given and reads responses one at a time (keep-alive, pipelining,
framing errors), and httpx clients with a role's token."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import httpx


def client(server, token: str | None = None, *, port: int | None = None, **options: Any) -> httpx.AsyncClient:
    """An httpx client of the server's HTTP listener (or ``port``), with ``token`` as bearer."""
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return httpx.AsyncClient(base_url=f"http://127.0.0.1:{port or server.http_port}", headers=headers,
                             timeout=60, **options)


def error_of(response: httpx.Response) -> tuple[int, str, str]:
    """(status, code, error) of an error answer, checking the body's shape."""
    body = response.json()
    assert set(body) == {"error", "code"}, body
    assert response.headers["content-type"] == "application/json"
    return response.status_code, body["code"], body["error"]


class Raw:
    """One TCP connection, written to and read from by hand."""

    def __init__(self, port: int, timeout: float = 30.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buffer = b""
        self.last_headers: dict[str, str] = {}

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> bool:
        chunk = self.sock.recv(65536)
        if not chunk:
            return False
        self.buffer += chunk
        return True

    def response(self, head_only: bool = False) -> tuple[int, dict[str, str], bytes]:
        """The next response: (status, headers with lower-case names, body);
        ``head_only``: the answer to a HEAD request (no body follows)."""
        while b"\r\n\r\n" not in self.buffer:
            if not self._fill():
                raise ConnectionError(f"the connection closed before a response (got {self.buffer!r})")
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        self.last_headers = headers
        if status == 100 or head_only:
            return status, headers, b""
        length = int(headers.get("content-length", "0"))
        while len(self.buffer) < length:
            if not self._fill():
                raise ConnectionError("the connection closed inside a body")
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return status, headers, body

    def closed_by_peer(self, timeout: float = 30.0) -> bool:
        """Whether the server closes the connection (within ``timeout``) without sending more."""
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1) == b""
        except (ConnectionResetError, BrokenPipeError):
            return True
        except socket.timeout:
            return False

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Raw:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def request_bytes(method: str, path: str, body: Any = None, *, token: str | None = None,
                  headers: dict[str, str] | None = None, host: str = "localhost") -> bytes:
    """A request with ``content-length``; ``body``: bytes as they are, anything else as JSON."""
    fields = {"host": host}
    if token:
        fields["authorization"] = f"Bearer {token}"
    data = b""
    if body is not None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        fields["content-type"] = "application/json"
        fields["content-length"] = str(len(data))
    fields.update(headers or {})
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields.items()) + "\r\n"
    return head.encode("latin-1") + data


async def until(predicate, timeout: float = 30.0, interval: float = 0.05, what: str = "the condition"):
    """Await ``predicate()`` (a coroutine function) until it returns something true."""
    import asyncio
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout} s (last: {value!r})")
        await asyncio.sleep(interval)
