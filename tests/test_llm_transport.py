"""cronoq.llm.transport, the provider's HTTP/1.1 client, against small
asyncio servers on free ports of 127.0.0.1 that answer byte for byte what
each test scripts: the three body framings, keep-alive reuse and its
limits, a stale reused connection retried once (and only once), timeouts,
the size cap, malformed answers, server-sent event lines, TLS, and a cancel
closing the socket. Provider-level tests check the mapping to cronoq's
outcomes."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import socket
import ssl
import zlib
from typing import AsyncIterator, Awaitable, Callable

import pytest

from certkit import CA
from cronoq.core.errors import Permanent, Retryable
from cronoq.llm.provider import Provider
from cronoq.llm.transport import (ConnectFailed, ConnectionLost, HTTPClient, Malformed, Streamed, TimedOut,
                                  TooLarge)

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]

Handler = Callable[["Peer", asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Peer:
    """What the server saw: connections accepted, requests read (head, body),
    and connections whose client went away (EOF or reset)."""

    def __init__(self) -> None:
        self.connections = 0
        self.requests: list[tuple[bytes, bytes]] = []
        self.gone = 0
        self.changed = asyncio.Condition()

    async def note(self, what: str) -> None:
        async with self.changed:
            if what == "gone":
                self.gone += 1
            self.changed.notify_all()

    async def until(self, test: Callable[[], bool]) -> None:
        async with self.changed:
            await asyncio.wait_for(self.changed.wait_for(test), 20)

    async def request(self, reader: asyncio.StreamReader) -> tuple[bytes, bytes] | None:
        """One request (None at the connection's end)."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        body = await reader.readexactly(length)
        self.requests.append((head, body))
        await self.note("request")
        return head, body

    async def until_gone(self, reader: asyncio.StreamReader) -> None:
        """Wait for the client to close (what a provider sees when a stream is abandoned)."""
        try:
            while await reader.read(1024):
                pass
        except ConnectionError:
            pass
        await self.note("gone")


@contextlib.asynccontextmanager
async def serving(handler: Handler, *, tls: ssl.SSLContext | None = None) -> AsyncIterator[tuple[Peer, int]]:
    peer = Peer()
    tasks: set[asyncio.Task[None]] = set()

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer.connections += 1
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        try:
            await handler(peer, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass   # a handler ended by the test's end returns (asyncio logs a cancelled connection task)
        finally:
            writer.close()

    server = await asyncio.start_server(connection, "127.0.0.1", 0, ssl=tls)
    try:
        yield peer, server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def ok(body: bytes, *headers: str) -> bytes:
    extra = "".join(f"{h}\r\n" for h in headers)
    return f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


async def keep_answering(peer: Peer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Echo each request's body back, keep-alive, until the client closes."""
    while (request := await peer.request(reader)) is not None:
        writer.write(ok(request[1], "Content-Type: application/json"))
        await writer.drain()


def client(port: int, **options: object) -> HTTPClient:
    return HTTPClient(f"http://127.0.0.1:{port}/v1", {"Authorization": "Bearer k"}, **options)  # type: ignore[arg-type]


async def test_content_length_answers_reuse_one_keep_alive_connection():
    async with serving(keep_answering) as (peer, port):
        http = client(port)
        answers = [await http.request("POST", "/chat/completions", b'{"n":%d}' % i) for i in range(3)]
        await http.close()
    assert [a.content for a in answers] == [b'{"n":0}', b'{"n":1}', b'{"n":2}']
    assert answers[0].status_code == 200 and answers[0].headers["content-type"] == "application/json"
    assert answers[0].json() == {"n": 0}
    assert peer.connections == 1 and len(peer.requests) == 3
    head = peer.requests[0][0].decode()
    assert head.startswith("POST /v1/chat/completions HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{port}\r\n" in head and "Authorization: Bearer k\r\n" in head
    assert "Content-Length: 7\r\n" in head and "Content-Type: application/json\r\n" in head


async def test_chunked_bodies_with_extensions_and_trailers_and_interim_answers():
    async def chunked(peer: Peer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await peer.request(reader) is not None:
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;name=value\r\nhel")
            await writer.drain()
            writer.write(b"lo\r\n7\r\n, world\r\n0\r\nX-Trailer: t\r\n\r\n")
            await writer.drain()

    async with serving(chunked) as (peer, port):
        http = client(port)
        first = await http.request("POST", "/x", b"{}")
        second = await http.request("POST", "/x", b"{}")
        await http.close()
    assert first.content == second.content == b"hello, world"
    assert peer.connections == 1   # the chunked body's end was found: the connection was reused


async def test_a_body_until_the_close_and_connection_close_are_not_reused():
    async def until_close(peer: Peer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await peer.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nall of ")
        await writer.drain()
        writer.write(b"this")
        writer.close()

    async def close_asked(peer: Peer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await peer.request(reader)
        writer.write(ok(b"bye", "Connection: close"))
        await writer.drain()
        await peer.until_gone(reader)   # the server leaves the closing to the client

    async with serving(until_close) as (peer, port):
        http = client(port)
        answers = [await http.request("GET", "/stats") for _ in range(2)]
        await http.close()
    assert [a.content for a in answers] == [b"all of this"] * 2 and peer.connections == 2
    async with serving(close_asked) as (peer, port):
        http = client(port)
        answers = [await http.request("POST", "/x", b"{}") for _ in range(2)]
        await peer.until(lambda: peer.gone == 2)   # the client closed both itself
        await http.close()
    assert [a.content for a in answers] == [b"bye"] * 2 and peer.connections == 2


def stale_after(answers: list[int], *, reset: bool = False) -> Handler:
    """A server whose n-th connection answers answers[n] requests (the last
    count for the later ones), then reads the next request and closes
    without a byte (an idle timeout racing the request), by a reset if asked."""
    opened = [0]

    async def handler(peer: Peer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        count = answers[min(opened[0], len(answers) - 1)]
        opened[0] += 1
        for _ in range(count):
            if await peer.request(reader) is None:
                return
            writer.write(ok(b"fine"))
            await writer.drain()
        await peer.request(reader)
        if reset:
            writer.transport.abort()

    return handler


async def test_a_stale_reused_connection_is_retried_once_on_a_new_one():
    async with serving(stale_after([1, 100])) as (peer, port):
        http = client(port)
        first = await http.request("POST", "/x", b"{}")
        second = await http.request("POST", "/x", b"{}")
        await http.close()
    assert first.content == second.content == b"fine"
    assert peer.connections == 2 and len(peer.requests) == 3   # the second request sent twice


async def test_a_408_on_a_reused_connection_is_its_idle_timeout_and_retried():
    async def says_its_timeout(peer: Peer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if peer.connections == 1:
            await peer.request(reader)
            writer.write(ok(b"fine"))
            await peer.request(reader)
            # What some servers send when they drop an idle connection (here as the request came).
            writer.write(b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            return
        while await peer.request(reader) is not None:
            writer.write(ok(b"fine"))
            await writer.drain()

    async with serving(says_its_timeout) as (peer, port):
        http = client(port)
        answers = [await http.request("POST", "/x", b"{}") for _ in range(2)]
        await http.close()
    assert [a.status_code for a in answers] == [200, 200] and peer.connections == 2


async def test_bytes_beyond_the_answer_keep_a_connection_out_of_the_pool():
    async def says_too_much(peer: Peer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await peer.request(reader) is not None:
            writer.write(ok(b"fine") + b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstale")   # one write
            await writer.drain()

    async with serving(says_too_much) as (peer, port):
        http = client(port)
        answers = [await http.request("POST", "/x", b"{}") for _ in range(2)]
        await http.close()
    assert [a.content for a in answers] == [b"fine", b"fine"] and peer.connections == 2


async def test_only_a_reused_connection_is_retried_and_only_once():
    async with serving(stale_after([1, 0], reset=True)) as (peer, port):
        http = client(port)
        assert (await http.request("POST", "/x", b"{}")).content == b"fine"
        with pytest.raises(ConnectionLost):
            await http.request("POST", "/x", b"{}")   # the reused one closes, then the new one does
        await http.close()
    assert peer.connections == 2 and len(peer.requests) == 3
    async with serving(stale_after([0])) as (peer, port):
        http = client(port)
        with pytest.raises(ConnectionLost, match="before the answer's head"):
            await http.request("POST", "/x", b"{}")   # a new connection: the server may have acted on it
        await http.close()
    assert peer.connections == 1 and len(peer.requests) == 1


async def test_at_most_max_connections_at_once():
    release = asyncio.Event()
    in_flight = [0]

    async def held(peer: Peer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await peer.request(reader) is not None:
            in_flight[0] += 1
            await peer.note("in flight")
            await release.wait()
            writer.write(ok(b"{}"))
            await writer.drain()

    async with serving(held) as (peer, port):
        http = client(port, max_connections=2)
        requests = asyncio.gather(*(http.request("POST", "/x", b"{}") for _ in range(5)))
        await peer.until(lambda: in_flight[0] >= 2)
        for _ in range(20):   # room for more connections to arrive, were they not held back
            await asyncio.sleep(0.01)
        assert peer.connections == 2 and in_flight[0] == 2
        release.set()
        answers = await asyncio.wait_for(requests, 20)
        await http.close()
    assert len(answers) == 5 and peer.connections == 2


async def test_read_and_connect_timeouts():
    async def silent(peer: Peer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await peer.request(reader)
        await peer.until_gone(reader)

    async with serving(silent) as (peer, port):
        http = client(port, read_timeout=0.2)
        with pytest.raises(TimedOut, match="no bytes from the server"):
            await http.request("POST", "/x", b"{}")
        await peer.until(lambda: peer.gone == 1)   # the timed-out connection was closed
        await http.close()
        provider = Provider(f"http://127.0.0.1:{port}/v1", timeout=0.2)
        with pytest.raises(Retryable, match="TimedOut talking to the provider"):
            await provider.chat({"model": "m"})
    # A listener whose backlog is full: the kernel drops the next SYNs, the connect hangs.
    with socket.socket() as full:
        full.bind(("127.0.0.1", 0))
        full.listen(0)
        port = full.getsockname()[1]
        fillers = []
        try:
            for _ in range(8):
                filler = socket.socket()
                filler.setblocking(False)
                fillers.append(filler)
                with contextlib.suppress(BlockingIOError):
                    filler.connect(("127.0.0.1", port))
            http = client(port, connect_timeout=0.3)
            with pytest.raises(TimedOut, match="connecting to http://127.0.0.1"):
                await http.request("POST", "/x", b"{}")
        finally:
            for filler in fillers:
                filler.close()


async def test_a_refused_connection_is_a_retryable_failure():
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]   # closed again before the request: nobody listens there
    with pytest.raises(ConnectFailed, match="cannot connect"):
        await client(port).request("POST", "/x", b"{}")
    provider = Provider(f"http://127.0.0.1:{port}/v1")
    with pytest.raises(Retryable, match="ConnectFailed talking to the provider"):
        await provider.chat({"model": "m"})


@pytest.mark.parametrize("answer, size, closes", [
    (ok(b"x" * 2000), 2000, False),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
     + b"".join(b"200\r\n" + b"x" * 512 + b"\r\n" for _ in range(4)) + b"0\r\n\r\n", 2048, False),
    (b"HTTP/1.1 200 OK\r\n\r\n" + b"x" * 2000, 2000, True),
], ids=["content-length", "chunked", "until-close"])
async def test_an_answer_over_the_size_limit(answer, size, closes):
    async def large(peer: Peer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await peer.request(reader)
        writer.write(answer)
        await writer.drain()
        if not closes:
            await peer.until_gone(reader)

    async with serving(large) as (peer, port):
        http = client(port, max_response_bytes=1000)
        with pytest.raises(TooLarge, match="over the limit of 1000 bytes"):
            await http.request("POST", "/x", b"{}")
        assert http._idle == []
        provider = Provider(f"http://127.0.0.1:{port}/v1", max_response_bytes=1000)
        with pytest.raises(Permanent, match="TooLarge talking to the provider"):
            await provider.chat({"model": "m"})
        if not closes:
            await peer.until(lambda: peer.gone == 2)   # both clients closed their connection
        assert (await client(port).request("POST", "/x", b"{}")).content == b"x" * size   # the default: 256 MiB


@pytest.mark.parametrize("head, message", [
    (b"HTTP/1.1 2OO OK\r\n\r\n", "not an HTTP/1.x status line"),
    (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "not an HTTP/1.x status line"),
    (b"HTTP/2 200\r\n\r\n", "not an HTTP/1.x status line"),
    (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "malformed header line"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n folded: x\r\n\r\nok", "malformed header line"),
    (b"HTTP/1.1 200 OK\r\nBad Name: x\r\n\r\n", "malformed header line"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2, 3\r\n\r\nok", "malformed Content-Length"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: -2\r\n\r\nok", "malformed Content-Length"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nok\r\n0\r\n\r\n", "malformed chunk size"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nokay\r\n0\r\n\r\n", "not followed by CRLF"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", "transfer coding"),
    (b"HTTP/1.1 200 OK\r\nContent-Encoding: br\r\nContent-Length: 2\r\n\r\nok", "content coding"),
    (b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 2\r\n\r\nok", "Error -3"),
])
async def test_malformed_answers_are_clear_retryable_errors(head, message):
    async def malformed(peer: Peer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await peer.request(reader) is not None:
            writer.write(head)
            await writer.drain()

    async with serving(malformed) as (peer, port):
        with pytest.raises(Malformed, match=message):
            await client(port).request("POST", "/x", b"{}")
        provider = Provider(f"http://127.0.0.1:{port}/v1")
        with pytest.raises(Retryable, match=f"Malformed talking to the provider: .*{message}"):
            await provider.chat({"model": "m"})
        await provider.close()


async def test_compressed_answers_are_decoded_within_the_limit():
    text = b'{"text": "' + b"la " * 300 + b'"}'
    packed = gzip.compress(text)
    deflated = zlib.compress(text)
    bomb = gzip.compress(b" " * 100_000)

    async def compressed(peer: Peer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (request := await peer.request(reader)) is not None:
            if request[0].startswith(b"POST /v1/gzip "):
                writer.write(ok(packed, "Content-Encoding: gzip"))
            elif request[0].startswith(b"POST /v1/deflate "):
                writer.write(ok(deflated, "Content-Encoding: deflate"))
            elif request[0].startswith(b"POST /v1/chunked "):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n")
                for start in range(0, len(packed), 10):
                    piece = packed[start:start + 10]
                    writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                writer.write(b"0\r\n\r\n")
            else:
                writer.write(ok(bomb, "Content-Encoding: gzip"))
            await writer.drain()

    async with serving(compressed) as (peer, port):
        http = client(port, max_response_bytes=10_000)
        assert (await http.request("POST", "/gzip", b"{}")).content == text
        assert (await http.request("POST", "/deflate", b"{}")).content == text
        assert (await http.request("POST", "/chunked", b"{}")).content == text
        with pytest.raises(TooLarge, match="decompressed"):
            await http.request("POST", "/bomb", b"{}")   # 100 kB from 150 bytes: stopped at the limit
        assert (await http.request("POST", "/gzip", b"{}")).content == text
        await http.close()
    assert peer.connections == 2   # the bomb's connection closed; the others reused one
    assert b"Accept-Encoding: gzip, deflate\r\n" in peer.requests[0][0]


async def test_an_endless_head_is_refused():
    async def endless(peer: Peer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await peer.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n")
        for _ in range(100):
            writer.write(b"X-Filler: " + b"y" * 1000 + b"\r\n")
        await writer.drain()
        await peer.until_gone(reader)

    async with serving(endless) as (peer, port):
        with pytest.raises(Malformed, match="head is over 65536 bytes"):
            await client(port).request("POST", "/x", b"{}")


class ScriptedBody:
    """A body handing out exactly these pieces, one per read (what TCP
    segments would do, without relying on how the kernel cuts them)."""

    limit = 10**6

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = list(pieces)

    async def piece(self) -> bytes | None:
        return self.pieces.pop(0) if self.pieces else None


async def test_event_lines_across_piece_boundaries():
    snowman = "☃".encode()
    pieces = [b"data: {\"a\"", b":1}\r", b"\n\r\ndata: x" + snowman[:1], snowman[1:] + b"\n", b"\n: comment\n",
              b"data: [DONE]"]
    streamed = Streamed(client(1), "POST", "/x", b"")
    streamed._body = ScriptedBody(pieces)   # type: ignore[assignment]
    lines = [line async for line in streamed.lines()]
    assert lines == ['data: {"a":1}', "", "data: x☃", "", ": comment", "data: [DONE]"]


async def test_server_sent_events_over_a_chunked_answer():
    events = [f'data: {{"n": {i}}}\n\n'.encode() for i in range(5)] + [b"data: [DONE]\n\n"]
    stream = b"".join(events)

    async def sse(peer: Peer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await peer.request(reader) is not None:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            for start in range(0, len(stream), 7):   # chunks cut mid-line
                piece = stream[start:start + 7]
                writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    async with serving(sse) as (peer, port):
        provider = Provider(f"http://127.0.0.1:{port}/v1")
        chunks = [chunk async for chunk in provider.stream("/chat/completions", {"model": "m"})]
        assert chunks == [{"n": i} for i in range(5)]
        http = client(port)
        async with http.stream("POST", "/x", b"{}") as answer:
            lines = [line async for line in answer.lines()]
        assert lines == [line for e in events for line in (e.decode().rstrip("\n"), "")]
        async with http.stream("POST", "/x", b"{}") as answer:
            assert (await answer.read()).content == stream
        await http.close()
        await provider.close()
    assert peer.connections == 2   # the provider's connection closed at [DONE]; the client's one reused


async def test_leaving_a_stream_closes_its_connection():
    async def forever(peer: Peer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await peer.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
        gone = asyncio.create_task(peer.until_gone(reader))
        n = 0
        while not gone.done():
            writer.write(b'data: {"n": %d}\n\n' % n)
            n += 1
            await writer.drain()
            await asyncio.sleep(0.005)

    async with serving(forever) as (peer, port):
        provider = Provider(f"http://127.0.0.1:{port}/v1", max_connections=1)
        seen = asyncio.Event()

        async def consume() -> None:
            async for chunk in provider.stream("/chat/completions", {"model": "m"}):
                if chunk["n"] == 3:
                    seen.set()

        task = asyncio.create_task(consume())
        await asyncio.wait_for(seen.wait(), 20)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await peer.until(lambda: peer.gone == 1)
        assert provider._http._idle == []   # closed, not pooled
        # The slot came back: the next stream (max_connections=1) starts, and a break closes it too.
        stream = provider.stream("/chat/completions", {"model": "m"})
        async with contextlib.aclosing(stream):
            async for chunk in stream:
                break
        await peer.until(lambda: peer.gone == 2)
        await provider.close()
    assert peer.connections == 2


async def test_https_with_the_servers_certificate_checked(tmp_path):
    ca = CA()
    cert, key = ca.write(tmp_path, "server", ca.issue(["localhost"], ips=["127.0.0.1"], server=True))
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    async with serving(keep_answering, tls=tls) as (peer, port):
        trusting = ssl.create_default_context(cadata=ca.pem.decode())
        http = HTTPClient(f"https://127.0.0.1:{port}/v1", ssl_context=trusting)
        answers = [await http.request("POST", "/x", b'{"tls":true}') for _ in range(2)]
        await http.close()
        assert [a.json() for a in answers] == [{"tls": True}] * 2 and peer.connections == 1
        with pytest.raises(ConnectFailed, match="CERTIFICATE_VERIFY_FAILED"):
            await HTTPClient(f"https://127.0.0.1:{port}/v1").request("POST", "/x", b"{}")   # the system's CAs
