"""A local HTTP server speaking the OpenAI API subset cronoq.llm uses, for
its tests and bench/llm_worker.py: POST /v1/chat/completions (plain and
streamed as server-sent events, with a usage chunk), /v1/completions and
/v1/embeddings, on a free port of 127.0.0.1, on a thread of its own.

Answers are scripted: ``fake.script`` is a list of ``Reply`` taken one per
request (first to last); with none left, ``fake.default`` answers. A reply
may delay, fail with a status and headers (429 with Retry-After), send a
malformed body, or stream ``chunks`` pieces ``chunk_delay`` apart.
``fake.requests`` records every request (path, body, monotonic time), and
``fake.disconnects`` counts streams the client closed before their end.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Reply:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0                 # seconds before the answer starts
    body: bytes | None = None          # sent as it is (a malformed answer, an error body)
    text: str = "hello from the fake"  # the completion's text (split into chunks when streamed)
    chunks: int = 0                    # streamed: pieces (0: one per word)
    chunk_delay: float = 0.0
    usage: bool = True                 # streamed: send the usage chunk


@dataclass
class Request:
    path: str
    body: Any
    at: float


class FakeOpenAI:
    def __init__(self) -> None:
        self.script: list[Reply] = []
        self.default = Reply()
        self.requests: list[Request] = []
        self.disconnects = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.port = 0
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._changed = threading.Condition(self._lock)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> FakeOpenAI:
        self._thread = threading.Thread(target=self._main, daemon=True, name="openai-fake")
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the fake OpenAI server did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._loop.is_running():
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_requests(self, count: int, timeout: float = 30.0) -> None:
        """Block until ``count`` requests arrived."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while len(self.requests) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{len(self.requests)} requests arrived, not {count}")
                self._changed.wait(left)

    def wait_disconnects(self, count: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        with self._changed:
            while self.disconnects < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{self.disconnects} streams were closed, not {count}")
                self._changed.wait(left)

    # -- the server's thread

    async def _shutdown(self) -> None:
        """Close the listener and end the connections still open, then the loop."""
        assert self._server is not None and self._loop is not None
        self._server.close()
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
        self._loop.stop()

    def _main(self) -> None:
        loop = self._loop = asyncio.new_event_loop()
        self._server = loop.run_until_complete(asyncio.start_server(self._connection, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.close()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:   # keep-alive: requests one after another
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:] if x)}
                raw = await reader.readexactly(int(headers.get("content-length", "0")))
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = None
                with self._changed:
                    self.requests.append(Request(path, body, time.monotonic()))
                    reply = self.script.pop(0) if self.script else self.default
                    self.in_flight += 1
                    self.max_in_flight = max(self.max_in_flight, self.in_flight)
                    self._changed.notify_all()
                try:
                    if not await self._answer(writer, method, path, body, reply):
                        return
                finally:
                    with self._changed:
                        self.in_flight -= 1
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _answer(self, writer: asyncio.StreamWriter, method: str, path: str, body: Any, reply: Reply) -> bool:
        if reply.delay:
            await asyncio.sleep(reply.delay)
        if reply.status != 200 or reply.body is not None:
            payload = reply.body if reply.body is not None else json.dumps(
                {"error": {"message": f"scripted {reply.status}", "type": "fake"}}).encode()
            self._head(writer, reply.status, "application/json", reply.headers, len(payload))
            writer.write(payload)
            await writer.drain()
            return True
        if method == "GET" and path == "/stats":   # for a bench in another process
            self._json(writer, 200, {"requests": len(self.requests), "max_in_flight": self.max_in_flight})
            with self._changed:
                self.max_in_flight = 0
            return True
        if method != "POST" or not isinstance(body, dict):
            self._json(writer, 400, {"error": {"message": "a JSON body is required"}})
            return True
        model = body.get("model", "fake-model")
        prompt_tokens = len(json.dumps(body.get("messages") or body.get("prompt") or body.get("input"))) // 4 or 1
        if path.endswith("/embeddings"):
            inputs = body["input"] if isinstance(body.get("input"), list) else [body.get("input")]
            data = [{"object": "embedding", "index": i, "embedding": [float(len(str(x))), 0.5, float(i)]}
                    for i, x in enumerate(inputs)]
            self._json(writer, 200, {"object": "list", "data": data, "model": model,
                                     "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}})
            return True
        chat = path.endswith("/chat/completions")
        words = reply.text.split(" ")
        if reply.chunks:
            words = [f"t{i}" for i in range(reply.chunks)]
        completion_tokens = len(words)
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                 "total_tokens": prompt_tokens + completion_tokens}
        if not body.get("stream"):
            choice: dict[str, Any] = {"index": 0, "finish_reason": "stop"}
            if chat:
                choice["message"] = {"role": "assistant", "content": " ".join(words)}
            else:
                choice["text"] = " ".join(words)
            self._json(writer, 200, {"id": "fake", "object": "chat.completion" if chat else "text_completion",
                                     "model": model, "choices": [choice], "usage": usage})
            return True
        # Streamed: no Content-Length, the connection closes after [DONE].
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
        try:
            for i, word in enumerate(words):
                piece = word if i == 0 else " " + word
                delta = {"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece}
                if i == len(words) - 1:
                    delta["finish_reason"] = "stop"
                writer.write(b"data: " + json.dumps({"id": "fake", "model": model, "choices": [delta]}).encode()
                             + b"\n\n")
                await writer.drain()
                if reply.chunk_delay:
                    await asyncio.sleep(reply.chunk_delay)
                    if reader_closed(writer):
                        raise ConnectionResetError
            if reply.usage:
                writer.write(b"data: " + json.dumps({"id": "fake", "choices": [], "usage": usage}).encode() + b"\n\n")
            writer.write(b"data: [DONE]\n\n")
            await writer.drain()
        except ConnectionError:
            with self._changed:
                self.disconnects += 1
                self._changed.notify_all()
        return False

    def _head(self, writer: asyncio.StreamWriter, status: int, ctype: str, headers: dict[str, str],
              length: int) -> None:
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        writer.write(f"HTTP/1.1 {status} X\r\nContent-Type: {ctype}\r\nContent-Length: {length}\r\n{extra}\r\n"
                     .encode())

    def _json(self, writer: asyncio.StreamWriter, status: int, value: Any) -> None:
        data = json.dumps(value).encode()
        self._head(writer, status, "application/json", {}, len(data))
        writer.write(data)


def reader_closed(writer: asyncio.StreamWriter) -> bool:
    """The peer closed (the transport knows once a write failed or EOF arrived)."""
    return writer.is_closing() or writer.transport.is_closing()


if __name__ == "__main__":
    # A process of its own (bench/llm_worker.py): every answer after --delay seconds; prints the port.
    import argparse
    import sys
    parser = argparse.ArgumentParser()
    parser.add_argument("--delay", type=float, default=0.05)
    options = parser.parse_args()
    fake = FakeOpenAI()
    fake.default = Reply(delay=options.delay)
    fake.start()
    print(fake.port, flush=True)
    sys.stdin.read()   # until the parent closes our stdin
    fake.stop()
