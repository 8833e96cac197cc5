"""cronoq-mcp against a real cronoq-server process with a real worker, driven
by the MCP SDK's own client over stdio and over streamable HTTP: every tool,
every resource and every prompt, the server's roles, the gateway's access
token, errors, and standard output kept for the protocol."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import json
import queue
import subprocess
import sys
import threading
import time
import uuid
from zoneinfo import ZoneInfo

import grpc
import pytest

from cronoq.client import BlockingClient, Client
from mcpkit import (
    ACCESS, Gateway, error_text, http_session, mcp_env, resource_json, start_worker, stdio_session, structured,
)
from serverkit import ADMIN, AUTH, CLIENT, LISTEN, METRICS, ROOT, WORKER

pytest.importorskip("mcp")
from mcp.shared.exceptions import MCPError  # noqa: E402

CONFIG = LISTEN + AUTH + """
[limits]
max_wait_s = 120

[[pools]]
name = "default"
retry = { max_attempts = 2, initial_backoff_s = 0.05, jitter = false }
[[pools]]
name = "idle"

[[resources]]
name = "gpu"
kind = "semaphore"
permits = 1
"""

TOOLS = {"submit_task", "submit_batch", "get_task", "wait_task", "cancel_task", "list_tasks", "explain_task",
         "snapshot", "list_workers", "list_schedules", "add_schedule", "remove_schedule", "run_llm_task"}
RESOURCES = {"cronoq://snapshot", "cronoq://schedules", "cronoq://workers", "cronoq://dead-letters"}
TEMPLATES = {"cronoq://pools/{pool}", "cronoq://tasks/{id}", "cronoq://keys/{key}"}
# Seconds a test waits for what should happen much sooner: it matters only when the test fails (a loaded
# machine may be slow, never this slow). The server's max_wait_s is as long, so it does not cut waits short.
PATIENCE = 120.0

PROMPTS = {"triage_dead_letters", "why_is_pool_slow", "schedule_nightly_job", "drain_pool", "llm_batch"}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="module")
def server(module_servers):
    return module_servers(CONFIG, name="mcp")


@pytest.fixture(scope="module")
def worker(server):
    """One worker process for pool 'default' (4 slots, label zone=eu), registered before the tests use it."""
    process = start_worker(server.target, WORKER, "default", "zone=eu")
    try:
        with BlockingClient(server.target, token=METRICS) as client:
            deadline = time.monotonic() + PATIENCE
            while not client.workers(pools=["default"]):
                assert time.monotonic() < deadline and process.process.poll() is None, process.log
                time.sleep(0.05)
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def gateway(server, worker):
    """``cronoq-mcp --http`` with the admin token upstream and ACCESS for its clients."""
    process = Gateway(server.target, ADMIN)
    yield process
    assert process.stop() == 0, process.log


async def run_task(session, arguments: dict) -> dict:
    """submit_task with wait=true: the answer, which must carry the task's result."""
    answer = structured(await session.call_tool("submit_task", {**arguments, "wait": True,
                                                                "wait_timeout": PATIENCE}))
    assert answer["result"] is not None, answer["note"]
    return answer


async def until_status(session, server, task: int, statuses) -> dict:
    """get_task until the task is in one of ``statuses``, looking again at each status event of the task
    (the server's watch stream), or after a second in case the stream started after the change."""
    changed = asyncio.Event()

    async def follow(client: Client) -> None:
        async for event in client.watch():
            if event.id == task:
                changed.set()

    deadline = time.monotonic() + PATIENCE
    async with Client(server.target, token=ADMIN) as direct:
        following = asyncio.create_task(follow(direct))
        try:
            while True:
                changed.clear()
                info = structured(await session.call_tool("get_task", {"task": task}))
                if info["status"] in statuses:
                    return info
                left = deadline - time.monotonic()
                assert left > 0, f"task {task} stayed {info['status']}, not {statuses}"
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), min(left, 1.0))
        finally:
            following.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await following


# ---------------------------------------------------------------- stdio


@pytest.mark.asyncio
async def test_stdio_lists_every_tool_resource_and_prompt_and_a_task_runs(server, worker):
    async with stdio_session(server.target, ADMIN) as session:
        tools = {t.name: t for t in (await session.list_tools()).tools}
        assert set(tools) == TOOLS
        for tool in tools.values():
            # Typed and described: a model reads these.
            assert tool.description and len(tool.description) > 40, tool.name
            assert tool.output_schema is not None, tool.name
            for name, prop in tool.input_schema.get("properties", {}).items():
                assert prop.get("description") or "$ref" in prop or "anyOf" in prop and any(
                    "$ref" in a for a in prop["anyOf"]), f"{tool.name}.{name} has no description"
        submit = tools["submit_task"].input_schema["properties"]
        assert {"payload", "payload_base64", "content_type", "pool", "kind", "priority", "key", "tenant",
                "deadline_in", "deadline_at", "start_in", "start_at", "tolerance", "on_miss", "timeout",
                "duration_hint", "retry", "resources", "after", "deps", "tags", "labels", "stages", "wait",
                "wait_timeout"} == set(submit)
        assert submit["priority"]["anyOf"][0]["enum"] == ["critical", "high", "normal", "low"]
        assert tools["get_task"].annotations.read_only_hint is True
        assert tools["cancel_task"].annotations.destructive_hint is True

        assert {str(r.uri) for r in (await session.list_resources()).resources} == RESOURCES
        assert {t.uri_template for t in (await session.list_resource_templates()).resource_templates} == TEMPLATES
        prompts = {p.name: p for p in (await session.list_prompts()).prompts}
        assert set(prompts) == PROMPTS
        assert [a.name for a in prompts["why_is_pool_slow"].arguments] == ["pool"]
        assert all(a.description for p in prompts.values() for a in p.arguments)

        answer = await run_task(session, {"payload": {"n": 21}})
        assert answer["duplicate"] is False
        assert answer["result"]["ok"] is True
        assert answer["result"]["output"]["echo"] == {"n": 21}
        result = structured(await session.call_tool("wait_task", {"task": answer["id"]}))
        assert result["status"] == "succeeded" and result["output"]["echo"] == {"n": 21}


@pytest.mark.asyncio
async def test_stdio_with_a_client_token_submits_but_cannot_add_schedules(server, worker):
    async with stdio_session(server.target, CLIENT) as session:
        refused = error_text(await session.call_tool("add_schedule", {"name": unique("nightly"),
                                                                       "cron": "0 2 * * *"}))
        assert "PERMISSION_DENIED" in refused and "admin role" in refused
        assert "PERMISSION_DENIED" in error_text(await session.call_tool("remove_schedule", {"name": "x"}))
        assert "PERMISSION_DENIED" in error_text(await session.call_tool("snapshot", {}))
        with pytest.raises(MCPError, match="PERMISSION_DENIED"):
            await session.read_resource("cronoq://schedules")
        # No pool suggestions without the metrics role, and no error for a hint either.
        from mcp.types import ResourceTemplateReference

        hint = await session.complete(ResourceTemplateReference(uri="cronoq://pools/{pool}"),
                                      {"name": "pool", "value": ""})
        assert hint.completion.values == []
        # What the client role may do still works.
        answer = await run_task(session, {"payload": "hello"})
        assert answer["result"]["output"]["echo"] == "hello"
        # explain_task works too, without the pool's figures the role may not see.
        waiting = structured(await session.call_tool("submit_task", {"pool": "idle"}))
        explanation = structured(await session.call_tool("explain_task", {"task": waiting["id"]}))
        assert explanation["waiting"] is True and explanation["pool"] is None
        assert [r["code"] for r in explanation["reasons"]] == ["pool_full"]
        structured(await session.call_tool("cancel_task", {"task": waiting["id"]}))


class _Unavailable:
    """A gRPC Tasks service that answers every Get with UNAVAILABLE and counts the calls."""

    def __init__(self) -> None:
        self.calls = 0

    async def start(self) -> int:
        from cronoq._proto import cronoq_pb2_grpc as pb_grpc

        outer = self

        class Tasks(pb_grpc.TasksServicer):
            async def Get(self, request, context):
                outer.calls += 1
                await context.abort(grpc.StatusCode.UNAVAILABLE, "not the leader (standby or shutting down)")

        self.server = grpc.aio.server()
        pb_grpc.add_TasksServicer_to_server(Tasks(), self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        return port


@pytest.mark.asyncio
async def test_an_unavailable_server_is_a_clear_tool_error_and_is_not_retried():
    standby = _Unavailable()
    port = await standby.start()
    try:
        async with stdio_session(f"127.0.0.1:{port}", ADMIN) as session:
            text = error_text(await session.call_tool("get_task", {"task": 1}))
            assert "UNAVAILABLE" in text and "not the leader" in text and "does not retry" in text
            assert standby.calls == 1
            with pytest.raises(MCPError, match="UNAVAILABLE"):
                await session.read_resource("cronoq://tasks/1")
            assert standby.calls == 2
    finally:
        await standby.server.stop(None)


def test_stdio_keeps_standard_output_for_the_protocol(tmp_path):
    """Raw pipes: every line on stdout is a JSON-RPC message; the logs (including a failed call's) are
    on stderr; an unreachable server gets a clear message; end of input ends the process with 0."""
    with socket_closed_port() as port:
        messages = [
            {"jsonrpc": "2.0", "id": 1, "method": "initialize",
             "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                        "clientInfo": {"name": "raw", "version": "0"}}},
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
             "params": {"name": "get_task", "arguments": {"task": 7}}},
        ]
        process = subprocess.Popen([sys.executable, "-m", "cronoq.mcp", "--server", f"127.0.0.1:{port}"],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, env=mcp_env(ADMIN), cwd=ROOT)
        try:
            assert process.stdin is not None and process.stdout is not None
            stdout, stderr = Lines(process.stdout), Lines(process.stderr)
            answers = []
            for message in messages:
                process.stdin.write(json.dumps(message) + "\n")
                process.stdin.flush()
                if "id" in message:
                    answers.append(json.loads(stdout.next()))
            process.stdin.close()
            assert process.wait(PATIENCE) == 0, stderr.rest()
            rest, log = stdout.rest(), stderr.rest()
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(10)
    assert [a["id"] for a in answers] == [1, 2]
    assert answers[0]["result"]["serverInfo"]["name"] == "cronoq"
    call = answers[1]["result"]
    assert call["isError"] is True
    assert f"cannot reach cronoq-server at 127.0.0.1:{port}" in call["content"][0]["text"]
    for line in rest:
        assert json.loads(line)["jsonrpc"] == "2.0", line
    assert any("driving cronoq-server at" in line for line in log), log
    assert any("Tool 'get_task' failed" in line for line in log), log


class Lines:
    """A pipe's lines, read on a thread, so that a silent process fails the test instead of hanging it."""

    def __init__(self, pipe) -> None:
        self._lines: queue.Queue[str | None] = queue.Queue()

        def read() -> None:
            for line in pipe:
                self._lines.put(line.rstrip("\n"))
            self._lines.put(None)

        threading.Thread(target=read, daemon=True).start()

    def next(self) -> str:
        try:
            line = self._lines.get(timeout=PATIENCE)
        except queue.Empty:
            raise AssertionError(f"no line within {PATIENCE:g} s") from None
        assert line is not None, "the pipe closed"
        return line

    def rest(self) -> list[str]:
        """The remaining lines, up to the end of the pipe (the process has exited)."""
        lines = []
        while (line := self._lines.get(timeout=PATIENCE)) is not None:
            lines.append(line)
        return lines


class socket_closed_port:
    """A loopback port with nothing listening on it (bound, then closed)."""

    def __enter__(self) -> int:
        import socket
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return sock.getsockname()[1]

    def __exit__(self, *exc: object) -> None:
        pass


# ---------------------------------------------------------------- the HTTP gateway's access token


@pytest.mark.asyncio
async def test_the_http_gateway_answers_401_without_its_own_access_token(gateway):
    import httpx2

    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                  "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                             "clientInfo": {"name": "raw", "version": "0"}}}
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    async with httpx2.AsyncClient() as http:
        for authorization in (None, "Bearer wrong-token-0123456789abcdef", f"Bearer {ADMIN}", ACCESS,
                              f"Basic {ACCESS}"):
            sent = dict(headers, **({"Authorization": authorization} if authorization else {}))
            response = await http.post(gateway.url, json=initialize, headers=sent)
            assert response.status_code == 401, (authorization, response.status_code)
            assert response.headers["www-authenticate"].startswith("Bearer")
            assert "access token" in response.json()["error"]
        response = await http.post(gateway.url + "?access_token=" + ACCESS, json=initialize, headers=headers)
        assert response.status_code == 401   # tokens in URLs are not accepted
        good = dict(headers, Authorization=f"Bearer {ACCESS}")
        response = await http.post(gateway.url, json=initialize, headers=good)
        assert response.status_code == 200
        # With the token, a page that rebinds its name to 127.0.0.1 is still refused (the SDK's protection).
        response = await http.post(gateway.url, json=initialize, headers=dict(good, Host="attacker.example"))
        assert response.status_code == 421
        response = await http.post(gateway.url, json=initialize,
                                   headers=dict(good, Origin="http://attacker.example"))
        assert response.status_code == 403
    # The SDK's client gets the 401 at initialization and gives up with an error.
    with pytest.raises(BaseExceptionGroup) as refused:
        async with http_session(gateway.url, "wrong-token-0123456789abcdef"):
            pass
    assert refused.group_contains(MCPError)
    async with http_session(gateway.url) as session:
        assert {t.name for t in (await session.list_tools()).tools} == TOOLS
        assert {str(r.uri) for r in (await session.list_resources()).resources} == RESOURCES
        assert {t.uri_template for t in (await session.list_resource_templates()).resource_templates} == TEMPLATES
        assert {p.name for p in (await session.list_prompts()).prompts} == PROMPTS


@pytest.mark.asyncio
async def test_the_http_gateway_runs_without_a_token_only_when_told_on_loopback(server, worker):
    process = Gateway(server.target, METRICS, None, "--no-access-token")
    try:
        async with http_session(process.url, None) as session:
            snapshot = structured(await session.call_tool("snapshot", {}))
            assert {p["name"] for p in snapshot["pools"]} == {"default", "idle"}
            # The metrics role may read, not submit.
            assert "PERMISSION_DENIED" in error_text(await session.call_tool("submit_task", {"payload": 1}))
    finally:
        assert process.stop() == 0, process.log


@pytest.mark.parametrize("args,env,message", [
    (["--http", "127.0.0.1:0"], {}, "needs an access token"),
    (["--http", "127.0.0.1:0"], {"CRONOQ_MCP_TOKEN": "short"}, "at least 16 characters"),
    (["--http", "0.0.0.0:0", "--no-access-token"], {}, "only allowed on a loopback address"),   # non-loopback: refused
    (["--http", "127.0.0.1:0", "--no-access-token"], {"CRONOQ_MCP_TOKEN": ACCESS}, "choose one"),
    (["--no-access-token"], {}, "applies to --http only"),
    (["--http", "localhost"], {"CRONOQ_MCP_TOKEN": ACCESS}, "must be HOST:PORT"),
    (["--http", "127.0.0.1:0", "--path", "mcp"], {"CRONOQ_MCP_TOKEN": ACCESS}, "must start with '/'"),
    (["--cert-file", "c.pem"], {}, "--cert-file and --key-file go together"),
    (["--ca-file", "/nonexistent/ca.pem"], {}, "--ca-file: cannot read /nonexistent/ca.pem"),
    (["--server", "http://127.0.0.1:1", "--ca-file", "/nonexistent/ca.pem"], {}, "cannot read"),
])
def test_invalid_options_are_refused_with_exit_2(args, env, message, monkeypatch, capsys):
    from cronoq.mcp import main

    for name in ("CRONOQ_TOKEN", "CRONOQ_MCP_TOKEN", "CRONOQ_SERVER"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_an_address_in_use_exits_1():
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "cronoq.mcp", "--server", "127.0.0.1:1", "--http",
                               f"127.0.0.1:{port}"], capture_output=True, text=True, env=mcp_env(None, ACCESS),
                              cwd=ROOT, timeout=60)
    assert done.returncode == 1, done.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr


# ---------------------------------------------------------------- tools


@pytest.mark.asyncio
async def test_submit_task_sends_every_option_to_the_worker(gateway):
    key = unique("report")
    before = time.time()
    async with http_session(gateway.url) as session:
        answer = await run_task(session, {
            "payload": {"report": "q3"}, "pool": "default", "kind": "resize", "priority": "high", "key": key,
            "tenant": "acme", "deadline_in": 600, "timeout": 30, "duration_hint": 0.5,
            "retry": {"max_attempts": 5, "initial_backoff": 0.1, "jitter": False}, "resources": {"gpu": 1},
            "tags": {"team": "data"}, "labels": {"zone": "eu"}, "stages": ["fetch", "render"]})
        after = time.time()
        output = answer["result"]["output"]
        assert output["echo"] == {"report": "q3"} and output["content_type"] == "application/json"
        assert (output["kind"], output["key"], output["priority"], output["tenant"]) == ("resize", key, "high",
                                                                                          "acme")
        assert output["tags"] == {"team": "data"} and output["labels"] == {"zone": "eu"}
        assert output["timeout"] == 30
        assert before + 600 - 1 <= output["deadline"] <= after + 600 + 1
        info = structured(await session.call_tool("get_task", {"task": key}))
        assert (info["id"], info["status"], info["kind"], info["tenant"]) == (answer["id"], "succeeded", "resize",
                                                                              "acme")
        assert info["max_attempts"] == 5 and info["tags"] == {"team": "data"} and info["priority"] == "high"
        assert output["stages"] == ["fetch", "render"]
        assert info["stages"] == info["completed_stages"] == ["fetch", "render"]

        # Text and binary payloads, with and without a content type.
        text = await run_task(session, {"payload": "plain words"})
        assert text["result"]["output"]["echo"] == "plain words"
        assert text["result"]["output"]["content_type"].startswith("text/plain")
        raw = bytes(range(256))
        binary = await run_task(session, {
            "payload_base64": base64.b64encode(raw).decode(), "content_type": "image/x-test"})
        assert base64.b64decode(binary["result"]["output"]["echo"]) == raw
        assert binary["result"]["output"]["content_type"] == "image/x-test"

        # An absolute deadline and an absolute fixed start (a second away: it runs then).
        soon = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=1)
        fixed = await run_task(session, {
            "payload": {"at": "soon"}, "start_at": soon.isoformat(), "tolerance": 30, "on_miss": "run_late",
            "deadline_at": (soon + dt.timedelta(hours=1)).isoformat()})
        assert fixed["result"]["ok"] is True
        assert abs(fixed["result"]["output"]["deadline"] - (soon.timestamp() + 3600)) < 1e-3

        # The same key again: nothing new.
        again = structured(await session.call_tool("submit_task", {"payload": {"other": 1}, "key": key}))
        assert again == {"id": answer["id"], "duplicate": True, "result": None, "note": None}


@pytest.mark.asyncio
async def test_a_wait_that_times_out_says_so_and_the_task_keeps_its_place(gateway):
    async with http_session(gateway.url) as session:
        answer = structured(await session.call_tool("submit_task", {"pool": "idle", "wait": True,
                                                                    "wait_timeout": 0.2}))
        assert answer["result"] is None and f"task {answer['id']} has not finished" in answer["note"]
        text = error_text(await session.call_tool("wait_task", {"task": answer["id"], "timeout": 0.2}))
        assert "DEADLINE_EXCEEDED" in text
        assert structured(await session.call_tool("get_task", {"task": answer["id"]}))["status"] == "ready"
        cancelled = structured(await session.call_tool("cancel_task", {"task": answer["id"]}))
        assert cancelled == {"task": answer["id"], "cancelled": True}
        assert structured(await session.call_tool("cancel_task", {"task": answer["id"]}))["cancelled"] is False
        result = structured(await session.call_tool("wait_task", {"task": answer["id"], "timeout": 5}))
        assert result["status"] == "cancelled" and result["ok"] is False


@pytest.mark.asyncio
async def test_submit_batch_runs_a_dependency_graph_atomically(gateway):
    extract, transform, load = unique("extract"), unique("transform"), unique("load")
    async with http_session(gateway.url) as session:
        batch = structured(await session.call_tool("submit_batch", {"tasks": [
            {"payload": {"step": "load"}, "key": load, "deps": [{"task": transform, "on": "complete"}]},
            {"payload": {"step": "transform"}, "key": transform, "after": [extract]},
            {"payload": {"step": "extract"}, "key": extract, "priority": "critical"},
        ]}))
        ids = [t["id"] for t in batch["tasks"]]
        assert len(set(ids)) == 3 and not any(t["duplicate"] for t in batch["tasks"])
        last = structured(await session.call_tool("wait_task", {"task": load, "timeout": PATIENCE}))
        assert last["id"] == ids[0] and last["output"]["echo"] == {"step": "load"}
        for key in (extract, transform):
            assert structured(await session.call_tool("get_task", {"task": key}))["status"] == "succeeded"

        # A cycle is refused and nothing of the batch is admitted.
        a, b = unique("a"), unique("b")
        refused = error_text(await session.call_tool("submit_batch", {"tasks": [
            {"key": a, "after": [b]}, {"key": b, "after": [a]}]}))
        assert "INVALID_ARGUMENT" in refused and "cycle" in refused.lower()
        assert "NOT_FOUND" in error_text(await session.call_tool("get_task", {"task": a}))
        bad = error_text(await session.call_tool("submit_batch", {"tasks": [{}, {"payload": 1,
                                                                                 "payload_base64": "AA=="}]}))
        assert "nothing was sent: task 1: give payload or payload_base64, not both" in bad


@pytest.mark.asyncio
async def test_list_tasks_filters_and_pages(gateway):
    tag = unique("listing")
    async with http_session(gateway.url) as session:
        ids = [structured(await session.call_tool("submit_task", {"pool": "idle", "tags": {"t": tag}}))["id"]
               for _ in range(3)]
        page = structured(await session.call_tool("list_tasks", {"pools": ["idle"], "statuses": ["ready"],
                                                                 "after": ids[0] - 1, "limit": 2}))
        assert [t["id"] for t in page["tasks"]] == ids[:2] and page["next_after"] == ids[1]
        rest = structured(await session.call_tool("list_tasks", {"pools": ["idle"], "statuses": ["ready"],
                                                                 "after": page["next_after"], "limit": 100}))
        assert [t["id"] for t in rest["tasks"]][:1] == ids[2:] and rest["next_after"] is None
        assert all(t["pool"] == "idle" and t["status"] == "ready" for t in rest["tasks"])
        for task in ids:
            structured(await session.call_tool("cancel_task", {"task": task}))
        cancelled = structured(await session.call_tool("list_tasks", {"statuses": ["cancelled"],
                                                                      "after": ids[0] - 1}))
        assert {t["id"] for t in cancelled["tasks"]} >= set(ids)
        refused = error_text(await session.call_tool("list_tasks", {"statuses": ["asleep"]}))
        assert refused.startswith("Error executing tool list_tasks: invalid arguments, nothing was sent: ")
        assert "statuses.0 must be one of 'blocked', 'scheduled'" in refused and "got 'asleep'" in refused
        assert "validation error" not in refused and "pydantic" not in refused
        assert "NOT_FOUND" in error_text(await session.call_tool("list_tasks", {"pools": ["nope"]}))


@pytest.mark.asyncio
async def test_failures_come_back_with_their_messages_and_as_dead_letters(gateway):
    async with http_session(gateway.url) as session:
        dead = (await run_task(session, {
            "payload": {"fail": "retryable", "message": "disk full"}, "retry": {"max_attempts": 1}}))["result"]
        assert dead["status"] == "dead_lettered" and "disk full" in dead["message"]
        assert dead["output"] is None and dead["output_available"] is False
        failed = (await run_task(session, {"payload": {"fail": "permanent", "message": "bad input"}}))["result"]
        assert failed["status"] == "failed" and "bad input" in failed["message"]

        letters = resource_json(await session.read_resource("cronoq://dead-letters"))
        assert letters["complete"] is True and letters["scanned"] >= 1
        assert letters["tasks"][0]["id"] == dead["id"] and "disk full" in letters["tasks"][0]["message"]
        assert all(t["status"] == "dead_lettered" for t in letters["tasks"])


@pytest.mark.asyncio
async def test_tool_errors_carry_the_servers_code_and_message(gateway):
    async with http_session(gateway.url) as session:
        text = error_text(await session.call_tool("get_task", {"task": 987654321}))
        assert "NOT_FOUND" in text and "987654321" in text
        assert "NOT_FOUND" in error_text(await session.call_tool("get_task", {"task": unique("no-such-key")}))
        assert "NOT_FOUND" in error_text(await session.call_tool("submit_task", {"pool": "nope"}))
        unknown = error_text(await session.call_tool("submit_task", {"resources": {"tpu": 1}}))
        assert "INVALID_ARGUMENT" in unknown and "tpu" in unknown
        too_many = error_text(await session.call_tool("submit_task", {"resources": {"gpu": 2}}))
        assert "INVALID_ARGUMENT" in too_many
        both = error_text(await session.call_tool("submit_task", {"payload": 1, "payload_base64": "AA=="}))
        assert "nothing was sent" in both
        assert "not valid base64" in error_text(await session.call_tool("submit_task", {"payload_base64": "@@"}))
        # The SDK validates arguments against the input schema first.
        assert "priority" in error_text(await session.call_tool("submit_task", {"priority": "urgent"}))
        assert "task" in error_text(await session.call_tool("wait_task", {}))


@pytest.mark.asyncio
async def test_snapshot_and_workers(gateway):
    async with http_session(gateway.url) as session:
        snapshot = structured(await session.call_tool("snapshot", {}))
        pools = {p["name"]: p for p in snapshot["pools"]}
        assert set(pools) == {"default", "idle"}
        assert pools["default"]["capacity"] == 4 and pools["default"]["workers_connected"] == 1
        (labelled,) = [g for g in pools["default"]["groups"] if g["labels"] == {"zone": "eu"}]
        assert labelled["capacity"] == 4
        assert pools["idle"]["capacity"] == 0 and snapshot["workers_connected"] == 1
        assert snapshot["totals"]["submitted"] >= 0 and "dead_lettered" in snapshot["totals"]

        (worker,) = structured(await session.call_tool("list_workers", {}))["workers"]
        assert (worker["name"], worker["pool"], worker["slots"], worker["labels"]) == (
            "mcp-test-worker", "default", 4, {"zone": "eu"})
        assert (worker["health"], worker["lease_expiries"]) == ("healthy", 0)
        assert structured(await session.call_tool("list_workers", {"pools": ["idle"]}))["workers"] == []


@pytest.mark.asyncio
async def test_recurring_schedules_are_listed_added_replaced_and_removed(gateway):
    name = unique("nightly")
    async with http_session(gateway.url) as session:
        added = structured(await session.call_tool("add_schedule", {
            "name": name, "cron": "30 2 * * *", "tz": "Europe/Paris", "pool": "idle", "priority": "low",
            "payload": {"job": "vacuum"}, "key": name, "deadline_in": 3600, "timeout": 60, "tags": {"k": "v"},
            "retry": {"max_attempts": 2}, "overlap": "queue"}))
        next_at = dt.datetime.fromisoformat(added["next_at"]).astimezone(ZoneInfo("Europe/Paris"))
        assert (next_at.hour, next_at.minute) == (2, 30) and next_at > dt.datetime.now(dt.timezone.utc)
        listed = {s["name"]: s for s in structured(await session.call_tool("list_schedules", {}))["schedules"]}
        assert listed[name]["cron"] == "30 2 * * *" and listed[name]["tz"] == "Europe/Paris"
        assert (listed[name]["pool"], listed[name]["overlap"]) == ("idle", "queue")
        assert listed[name]["next_at"] == added["next_at"] and listed[name]["last_task_id"] is None

        # Same name: replaced (@yearly: no occurrence fires while the test runs).
        structured(await session.call_tool("add_schedule", {"name": name, "cron": "@yearly", "pool": "idle"}))
        listed = [s for s in structured(await session.call_tool("list_schedules", {}))["schedules"]
                  if s["name"] == name]
        assert len(listed) == 1 and listed[0]["cron"] == "@yearly" and listed[0]["overlap"] == "skip"
        resource = resource_json(await session.read_resource("cronoq://schedules"))
        assert name in {s["name"] for s in resource["schedules"]}

        assert structured(await session.call_tool("remove_schedule", {"name": name})) == {"name": name,
                                                                                          "removed": True}
        assert structured(await session.call_tool("remove_schedule", {"name": name}))["removed"] is False
        assert "INVALID_ARGUMENT" in error_text(await session.call_tool("add_schedule", {
            "name": name, "cron": "every night"}))


@pytest.mark.asyncio
async def test_explain_task_says_why_tasks_wait(server, gateway):
    # The explanation is the leader's: as complete for tasks submitted elsewhere (the CLI, a client) as for
    # this gateway's own. Every reason over MCP: tests/test_server_explain.py.
    async with http_session(gateway.url) as session:
        async def submit(**arguments):
            return structured(await session.call_tool("submit_task", arguments))["id"]

        async def explain(task):
            return structured(await session.call_tool("explain_task", {"task": task}))

        def codes(explanation):
            return [r["code"] for r in explanation["reasons"]]

        cleanup = []
        try:
            # A pool without workers: the class decides the order.
            normal, high, critical = [await submit(pool="idle", priority=p) for p in ("normal", "high", "critical")]
            cleanup += [normal, high, critical]
            first, last = await explain(critical), await explain(normal)
            assert last["waiting"] is True and codes(last) == ["pool_full"]
            assert "No worker serves pool idle" in last["reasons"][0]["message"]
            assert first["position"] + 2 <= last["position"] and last["queued"] >= 3
            assert first["score"] >= 10000 and 100 <= last["score"] < 1000
            assert last["pool"]["name"] == "idle" and last["pool"]["capacity"] == 0
            assert last["task"]["id"] == normal and last["task"]["priority"] == "normal"

            async with Client(server.target, token=ADMIN) as direct:
                # Blocked on a dependency that waits in the idle pool, submitted without this gateway.
                parent = unique("parent")
                cleanup.append((await direct.submit(pool="idle", key=parent)).id)
                child = (await direct.submit({"child": True}, after=[parent])).id
                cleanup.append(child)
                # Labels no worker carries, submitted without this gateway too.
                elsewhere = (await direct.submit({"n": 1}, labels={"zone": "us"})).id
                cleanup.append(elsewhere)
            blocked = await explain(child)
            assert blocked["task"]["status"] == "blocked" and codes(blocked) == ["dependencies"]
            assert [(d["key"], d["status"], d["condition"]) for d in blocked["reasons"][0]["detail"]["unmet"]] == [
                (parent, "ready", "success")]
            assert blocked["task"]["dependencies"] == [{"task": parent, "on": "success"}]
            labelled = await explain(elsewhere)
            assert codes(labelled) == ["labels"] and "carries the labels zone=us" in labelled["summary"]
            assert labelled["task"]["labels"] == {"zone": "us"}

            # A fixed start an hour away.
            later = await submit(start_in=3600, tolerance=5, on_miss="skip")
            cleanup.append(later)
            scheduled = await explain(later)
            assert scheduled["task"]["status"] == "scheduled" and codes(scheduled) == ["start_time"]
            assert scheduled["reasons"][0]["detail"]["on_miss"] == "skip"

            # Parked on a resource another task holds, while the pool has free slots.
            holder = await submit(payload={"sleep": 120}, resources={"gpu": 1})
            cleanup.append(holder)
            await until_status(session, server, holder, {"running"})
            running = await explain(holder)
            assert running["waiting"] is False and running["reasons"] == [] and "is running" in running["summary"]
            parked = await submit(payload={"parked": True}, resources={"gpu": 1})
            cleanup.append(parked)
            explanation = await explain(parked)
            assert explanation["task"]["status"] == "ready" and codes(explanation) == ["resource"]
            assert explanation["reasons"][0]["detail"]["resource"] == "gpu"
            assert structured(await session.call_tool("cancel_task", {"task": holder}))["cancelled"] is True
            released = structured(await session.call_tool("wait_task", {"task": parked, "timeout": PATIENCE}))
            assert released["output"]["echo"] == {"parked": True}
            finished = await explain(parked)
            assert finished["waiting"] is False and "ended succeeded" in finished["summary"]
            assert [a["status"] for a in finished["task"]["attempts"]] == ["succeeded"]

            # Waiting out a retry backoff; get_task shows the failed attempt.
            retrying = await submit(payload={"fail": "retryable", "message": "flaky"},
                                    retry={"max_attempts": 3, "initial_backoff": 600, "jitter": False})
            cleanup.append(retrying)
            await until_status(session, server, retrying, {"retrying"})
            backoff = await explain(retrying)
            assert codes(backoff) == ["start_time"] and backoff["reasons"][0]["detail"]["kind"] == "retry"
            attempts = structured(await session.call_tool("get_task", {"task": retrying}))["attempts"]
            assert [(a["attempt"], a["status"], a["message"]) for a in attempts] == [(1, "retrying", "flaky")]

            assert "NOT_FOUND" in error_text(await session.call_tool("explain_task", {"task": 10 ** 12}))
        finally:
            for task in cleanup:
                await session.call_tool("cancel_task", {"task": task})


# ---------------------------------------------------------------- resources


@pytest.mark.asyncio
async def test_resources_are_read_live(gateway):
    key = unique("resource")
    async with http_session(gateway.url) as session:
        before = resource_json(await session.read_resource("cronoq://snapshot"))
        waiting = structured(await session.call_tool("submit_task", {"pool": "idle", "key": key}))["id"]
        after = resource_json(await session.read_resource("cronoq://snapshot"))
        pending = {p["name"]: p["pending"] for p in before["pools"]}, {p["name"]: p["pending"] for p in after["pools"]}
        assert pending[1]["idle"] == pending[0]["idle"] + 1

        pool = resource_json(await session.read_resource("cronoq://pools/default"))
        assert pool["pool"]["name"] == "default" and pool["pool"]["capacity"] == 4
        assert [w["name"] for w in pool["workers"]] == ["mcp-test-worker"]
        assert resource_json(await session.read_resource("cronoq://pools/idle"))["workers"] == []
        with pytest.raises(MCPError, match="no pool named 'nope'"):
            await session.read_resource("cronoq://pools/nope")

        by_id = resource_json(await session.read_resource(f"cronoq://tasks/{waiting}"))
        assert by_id["task"]["key"] == key and by_id["task"]["status"] == "ready" and by_id["result"] is None
        done = await run_task(session, {"payload": {"x": 1}, "key": key + "/done"})
        by_key = resource_json(await session.read_resource(f"cronoq://keys/{key}%2Fdone"))
        assert by_key["task"]["id"] == done["id"] and by_key["result"]["output"]["echo"] == {"x": 1}
        with pytest.raises(MCPError, match="NOT_FOUND"):
            await session.read_resource("cronoq://tasks/987654321")
        with pytest.raises(MCPError, match="not a task id"):
            await session.read_resource("cronoq://tasks/abc")

        workers = resource_json(await session.read_resource("cronoq://workers"))
        assert [(w["pool"], w["slots"]) for w in workers["workers"]] == [("default", 4)]
        schedules = resource_json(await session.read_resource("cronoq://schedules"))
        assert isinstance(schedules["schedules"], list)
        structured(await session.call_tool("cancel_task", {"task": waiting}))
        assert resource_json(await session.read_resource(f"cronoq://tasks/{waiting}"))["result"]["status"] \
            == "cancelled"


# ---------------------------------------------------------------- prompts


@pytest.mark.asyncio
async def test_prompts_are_ready_workflows(gateway):
    async with http_session(gateway.url) as session:
        async def text(name, arguments):
            result = await session.get_prompt(name, arguments)
            (message,) = result.messages
            assert message.role == "user"
            return message.content.text

        triage = await text("triage_dead_letters", {"pool": "default", "limit": "5"})
        assert "cronoq://dead-letters" in triage and 'pools=["default"]' in triage and "5 most recent" in triage
        slow = await text("why_is_pool_slow", {"pool": "default"})
        assert "cronoq://pools/default" in slow and "explain_task" in slow
        nightly = await text("schedule_nightly_job", {"name": "vacuum", "what": "vacuum the database",
                                                      "time": "02:30", "tz": "Europe/Paris", "pool": "idle"})
        assert 'cron="30 2 * * *"' in nightly and "tz='Europe/Paris'" in nightly and "pool='idle'" in nightly
        assert "add_schedule" in nightly and "vacuum the database" in nightly
        drain = await text("drain_pool", {"pool": "default"})
        assert "remove_schedule" in drain and "cronoq://pools/default" in drain and "ask me" in drain
        with pytest.raises(MCPError, match="HH:MM"):
            await session.get_prompt("schedule_nightly_job", {"name": "x", "what": "y", "time": "25:00"})
        with pytest.raises(MCPError):
            await session.get_prompt("why_is_pool_slow", {})


@pytest.mark.asyncio
async def test_pool_and_time_zone_arguments_are_completed(gateway):
    from mcp.types import PromptReference, ResourceTemplateReference

    pool_template = ResourceTemplateReference(uri="cronoq://pools/{pool}")
    async with http_session(gateway.url) as session:
        async def values(ref, name, value):
            return (await session.complete(ref, {"name": name, "value": value})).completion.values

        assert await values(pool_template, "pool", "") == ["default", "idle"]
        assert await values(pool_template, "pool", "i") == ["idle"]
        assert await values(PromptReference(name="drain_pool"), "pool", "de") == ["default"]
        assert await values(PromptReference(name="why_is_pool_slow"), "pool", "x") == []
        zones = await values(PromptReference(name="schedule_nightly_job"), "tz", "Europe/Par")
        assert zones == ["Europe/Paris"]
        many = (await session.complete(PromptReference(name="schedule_nightly_job"),
                                       {"name": "tz", "value": ""})).completion
        assert len(many.values) == 100 and many.has_more is True and many.total > 100
        assert await values(PromptReference(name="schedule_nightly_job"), "name", "") == []


def test_the_client_configuration_snippets_in_the_docs_are_valid():
    import re

    from cronoq.mcp.cli import _parser

    text = (ROOT / "docs" / "mcp.md").read_text()
    snippets = [json.loads(block) for block in re.findall(r"```json\n(.*?)```", text, re.S)]
    assert len(snippets) == 2
    stdio, http = (snippet["mcpServers"]["cronoq"] for snippet in snippets)
    assert stdio["command"] == "cronoq-mcp" and set(stdio["env"]) == {"CRONOQ_TOKEN"}
    assert _parser().parse_args(stdio["args"]).server == "127.0.0.1:7070"
    assert http["url"].endswith("/mcp") and http["headers"]["Authorization"].startswith("Bearer ")


def test_the_console_script_and_the_subcommand_hook(monkeypatch, capsys):
    import argparse
    import importlib.metadata
    from pathlib import Path

    from cronoq.mcp import cli

    (script,) = [e for e in importlib.metadata.entry_points(group="console_scripts") if e.name == "cronoq-mcp"]
    assert script.value == "cronoq.mcp.cli:main"
    installed = Path(sys.executable).parent / "cronoq-mcp"
    if installed.exists():
        done = subprocess.run([str(installed), "--help"], capture_output=True, text=True, env=mcp_env(None),
                              timeout=60)
        assert done.returncode == 0 and "usage: cronoq-mcp" in done.stdout and "CRONOQ_MCP_TOKEN" in done.stdout

    # The `cronoq` command line adds `mcp` to its own parser and runs it.
    parser = argparse.ArgumentParser(prog="cronoq")
    cli.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["mcp", "--server", "127.0.0.1:7070", "--http", "127.0.0.1:0"])
    monkeypatch.delenv("CRONOQ_MCP_TOKEN", raising=False)
    assert args.command == "mcp" and args.run is cli.run
    assert args.run(args) == 2
    assert "needs an access token" in capsys.readouterr().err


# ---------------------------------------------------------------- what-if (cronoq's simulator)


def what_if_trace() -> str:
    """Twenty one-second tasks submitted at once to a pool of one worker: the queue is the whole story."""
    lines: list[dict] = [{"cronoq_trace": 1, "t0": 1_800_000_000.0,
                          "policy": {"pools": {"app": {"min": 1, "max": 1}}}}]
    for i in range(20):
        lines.append({"task": i + 1, "at": 0.0, "pool": "app", "kind": "report", "seconds": 1.0})
    return "\n".join(json.dumps(line) for line in lines) + "\n"


WHAT_IF_POLICIES = """
[[variant]]
name = "as recorded"

[[variant]]
name = "four workers"
pools.app.min = 4
pools.app.max = 4
"""


def replayed(report: dict) -> list[dict]:
    return [{k: v for k, v in variant.items() if k != "wall_seconds"} for variant in report["variants"]]


def test_traces_need_the_simulator(tmp_path, capsys, monkeypatch):
    from cronoq.mcp import main
    from cronoq.mcp.whatif import simulator

    if simulator() is not None:
        pytest.skip("this installation has cronoq.whatif: test_what_if_replays_a_trace_against_variants runs")
    monkeypatch.delenv("CRONOQ_MCP_TOKEN", raising=False)
    assert main(["--traces", str(tmp_path)]) == 2
    assert "--traces needs cronoq's simulator (cronoq.whatif)" in capsys.readouterr().err
    from cronoq.mcp import build_server

    with pytest.raises(ValueError, match="needs cronoq's simulator"):
        build_server(Client("127.0.0.1:1", retry_for=0), traces=tmp_path)


def test_traces_must_be_a_directory(tmp_path, capsys, monkeypatch):
    pytest.importorskip("cronoq.whatif")
    from cronoq.mcp import main

    monkeypatch.delenv("CRONOQ_MCP_TOKEN", raising=False)
    (tmp_path / "reports.jsonl").write_text(what_if_trace())
    assert main(["--traces", str(tmp_path / "reports.jsonl")]) == 2
    assert "is not a directory" in capsys.readouterr().err


@pytest.mark.asyncio
async def test_what_if_replays_a_trace_against_variants(server, tmp_path):
    pytest.importorskip("cronoq.whatif")
    (tmp_path / "reports.jsonl").write_text(what_if_trace())
    (tmp_path.parent / "outside.jsonl").write_text(what_if_trace())
    (tmp_path / "elsewhere.jsonl").symlink_to(tmp_path.parent / "outside.jsonl")
    async with stdio_session(server.target, METRICS, "--traces", str(tmp_path)) as session:
        tools = {t.name: t for t in (await session.list_tools()).tools}
        assert set(tools) == TOOLS | {"what_if"} and tools["what_if"].annotations.read_only_hint is True
        report = structured(await session.call_tool("what_if", {"trace": "reports.jsonl",
                                                                "policies": WHAT_IF_POLICIES, "seed": 1}))
        assert report["trace"]["tasks"] == 20
        recorded, wider = report["variants"]
        assert (recorded["name"], wider["name"]) == ("as recorded", "four workers")
        assert recorded["endings"]["succeeded"] == wider["endings"]["succeeded"] == 20
        # One worker: the last task starts after 19 s; four: after 4 s.
        assert recorded["waits"]["all"]["max"] == pytest.approx(19, abs=0.5)
        assert wider["waits"]["all"]["max"] == pytest.approx(4, abs=0.5)
        assert "timeline" not in wider
        again = structured(await session.call_tool("what_if", {"trace": "reports.jsonl",
                                                               "policies": WHAT_IF_POLICIES, "seed": 1}))
        # Virtual time: the same seed, the same figures (only the real time each replay took differs).
        assert replayed(again) == replayed(report)
        only = structured(await session.call_tool("what_if", {"trace": "reports.jsonl",
                                                              "policies": WHAT_IF_POLICIES,
                                                              "variants": ["four workers"]}))
        assert [v["name"] for v in only["variants"]] == ["four workers"]

        missing = error_text(await session.call_tool("what_if", {"trace": "nope.jsonl"}))
        assert "no trace named 'nope.jsonl'; the traces: reports.jsonl" in missing
        for outside in ("../outside.jsonl", str(tmp_path.parent / "outside.jsonl"), ".hidden"):
            assert "must be a file name in the trace directory" in error_text(
                await session.call_tool("what_if", {"trace": outside}))
        assert "a link leading outside the trace directory" in error_text(
            await session.call_tool("what_if", {"trace": "elsewhere.jsonl"}))
        bad = error_text(await session.call_tool("what_if", {"trace": "reports.jsonl", "policies": "[[variant"}))
        assert "what-if: policies: not valid TOML" in bad, bad
        unknown = error_text(await session.call_tool("what_if", {"trace": "reports.jsonl",
                                                                 "variants": ["nope"]}))
        assert "what-if: no variant named 'nope'" in unknown

    # The instructions point agents at it only when it is there.
    from cronoq.mcp import build_server

    async with Client("127.0.0.1:1", retry_for=0) as plain:
        assert "what_if" in (build_server(plain, traces=tmp_path).instructions or "")
        assert "what_if" not in (build_server(plain).instructions or "")
        with pytest.raises(ValueError, match="does not exist"):
            build_server(plain, traces=tmp_path / "nope")
