"""The routes the dashboard adds to the HTTP gateway, without a browser:
GET /v1/events (Server-Sent Events), the class and tenant filters of
GET /v1/tasks, POST /v1/tasks/{id}:resubmit, DELETE /v1/recurring/{name},
and the static files of /ui with their switch (server.ui)."""

from __future__ import annotations

import asyncio
import json
import signal

import httpx
import pytest
import pytest_asyncio

import cronoq
import cronoq.server
from cronoq.client import Worker
from cronoq.server.info import InfoCache, LiveFeed, TaskMeta
from cronoq.core.types import TaskSpec
from httpkit import Raw
from serverkit import ADMIN, AUTH, CLIENT, LISTEN, METRICS, WORKER, run_cli

CONFIG = LISTEN + AUTH + """
[[pools]]
name = "default"
[[pools]]
name = "idle"
[[auth.tokens]]
token = "scoped-client-token-0123456789abc"
role = "client"
pools = ["idle"]
[[recurring]]
name = "nightly/report"
cron = "0 3 * * *"
pool = "idle"
"""
SCOPED = "scoped-client-token-0123456789abc"


async def handle(lease):
    order = lease.json() or {}
    if order.get("fail"):
        raise cronoq.Retryable("failed as asked")
    await asyncio.sleep(order.get("sleep", 0))
    return {"echo": order}


def http(server, token: str | None = None) -> httpx.AsyncClient:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}", headers=headers, timeout=60)


class Events:
    """Reads a text/event-stream: ``next()`` is the next (event, data) pair."""

    def __init__(self, response: httpx.Response) -> None:
        self.lines = response.aiter_lines()

    async def next(self, timeout: float = 30.0) -> tuple[str, object]:
        async def read() -> tuple[str, object]:
            event, data = "message", ""
            async for line in self.lines:
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    data += line[5:].strip()
                elif line == "" and data:
                    return event, json.loads(data)
            raise EOFError("the stream ended")
        return await asyncio.wait_for(read(), timeout)

    async def until(self, event: str, predicate=lambda data: True, timeout: float = 30.0) -> object:
        while True:
            kind, data = await self.next(timeout)
            if kind == event and predicate(data):
                return data


@pytest_asyncio.fixture
async def server():
    async with cronoq.server.serve(CONFIG) as running:
        worker = Worker(running.target, "default", handle, slots=2, token=WORKER)
        task = asyncio.create_task(worker.run())
        yield running
        worker.stop()
        await asyncio.wait_for(task, 30)


@pytest.mark.asyncio
async def test_the_stream_says_hello_then_pushes_every_transition_and_snapshots(server):
    async with http(server, ADMIN) as api, api.stream("GET", "/v1/events", params={"snapshot_s": "0.2"}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
        assert r.headers["cache-control"] == "no-store" and r.headers["transfer-encoding"] == "chunked"
        events = Events(r)
        kind, hello = await events.next()
        assert kind == "hello"
        assert hello["state"] == "leader" and hello["role"] == "admin" and hello["pools"] == ["default", "idle"]
        assert hello["status_events"] is True and hello["snapshot_s"] == 0.2
        sub = (await api.post("/v1/tasks", json={"payload": {"sleep": 0.05}, "key": "pushed"})).json()
        seen: list[str] = []
        while "succeeded" not in seen:
            batch = await events.until("status")
            for event in batch:
                assert set(event) <= {"id", "pool", "key", "status", "attempt", "max_attempts", "at_unix_ns",
                                      "message"}
                if event["id"] == sub["id"]:
                    assert event["key"] == "pushed" and event["pool"] == "default" and event["max_attempts"] == 3
                    seen.append(event["status"])
        assert seen == ["ready", "running", "succeeded"]
        snap = await events.until("snapshot", lambda s: s["totals"]["succeeded"] >= 1)
        assert [p["name"] for p in snap["pools"]] == ["default", "idle"] and snap["pools"][0]["capacity"] == 2


@pytest.mark.asyncio
async def test_roles_decide_what_the_stream_carries(server):
    async with http(server, CLIENT) as api, api.stream("GET", "/v1/events") as r:
        events = Events(r)
        kind, hello = await events.next()
        assert hello["snapshot_s"] == 0 and hello["status_events"] is True
        await api.post("/v1/tasks", json={"payload": {}})
        kind, batch = await events.next()   # no snapshot for the client role: the status events come first
        assert kind == "status" and batch[0]["status"] == "ready"
    async with http(server, METRICS) as api, api.stream("GET", "/v1/events", params={"snapshot_s": "0.2"}) as r:
        events = Events(r)
        kind, hello = await events.next()
        assert hello["snapshot_s"] == 0.2 and hello["status_events"] is False
        async with http(server, CLIENT) as client:
            await client.post("/v1/tasks", json={"payload": {}, "key": "unseen-by-metrics"})
        for _ in range(3):   # snapshots only: no status event between them
            assert (await events.next())[0] == "snapshot"
    async with http(server, WORKER) as api:
        r = await api.get("/v1/events")
        assert r.status_code == 403 and "client role" in r.json()["error"] and "metrics role" in r.json()["error"]
    async with http(server) as api:
        r = await api.get("/v1/events")
        assert r.status_code == 401


@pytest.mark.asyncio
async def test_the_stream_follows_pool_filters_and_credential_scope(server):
    async with http(server, SCOPED) as scoped:
        r = await scoped.get("/v1/events", params={"pool": "default"})
        assert r.status_code == 403
        async with scoped.stream("GET", "/v1/events") as stream, http(server, CLIENT) as client:
            events = Events(stream)
            assert (await events.next())[1]["pools"] == ["idle"]
            await client.post("/v1/tasks", json={"pool": "default", "key": "elsewhere"})
            mine = (await client.post("/v1/tasks", json={"pool": "idle", "key": "mine"})).json()
            batch = await events.until("status")
            assert {e["id"] for e in batch} == {mine["id"]}   # the default pool's task never shows
    async with http(server, CLIENT) as client:
        assert (await client.get("/v1/events", params={"pool": "nope"})).status_code == 404
        r = await client.get("/v1/events", params={"snapshot_s": "-1"})
        assert r.status_code == 400 and r.json()["error"].startswith("snapshot_s")


@pytest.mark.asyncio
async def test_with_recent_the_stream_starts_with_the_latest_events_it_may_see(server):
    async with http(server, CLIENT) as client:
        done = (await client.post("/v1/tasks", json={"payload": {}, "key": "before-the-stream"})).json()
        assert (await client.get(f"/v1/tasks/{done['id']}/result")).json()["status"] == "succeeded"
        await client.post("/v1/tasks", json={"pool": "idle", "key": "idle-before"})
    async with http(server, ADMIN) as api, api.stream("GET", "/v1/events", params={
            "recent": "2", "pool": "default", "snapshot_s": "0"}) as r:
        events = Events(r)
        assert (await events.next())[0] == "hello"
        kind, first = await events.next()
        assert kind == "status"   # the last two of the default pool's kept events, oldest first, before any new one
        assert [(e["id"], e["status"]) for e in first] == [(done["id"], "running"), (done["id"], "succeeded")]
    async with http(server, SCOPED) as scoped, scoped.stream("GET", "/v1/events", params={"recent": "50"}) as r:
        events = Events(r)
        await events.next()
        kind, first = await events.next()
        assert kind == "status" and first and {e["pool"] for e in first} == {"idle"}   # only what the token sees
    async with http(server, CLIENT) as client:
        r = await client.get("/v1/events", params={"recent": "-1"})
        assert r.status_code == 400 and r.json()["error"].startswith("recent")


@pytest.mark.asyncio
async def test_streams_count_against_max_watchers_and_are_released_on_close():
    async with cronoq.server.serve(LISTEN + "[limits]\nmax_watchers = 1\n") as server:
        async with http(server) as api:
            async with api.stream("GET", "/v1/events", headers={"host": "localhost"}) as first:
                assert (await Events(first).next())[0] == "hello"
                r = await api.get("/v1/events")
                assert r.status_code == 429 and "1 Watch streams" in r.json()["error"]
            for _ in range(200):   # the server sees the close when it next writes or reads
                async with api.stream("GET", "/v1/events") as again:
                    if again.status_code == 200:
                        assert (await Events(again).next())[0] == "hello"
                        break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("the closed stream was never released")


def test_a_stopping_server_ends_its_streams_with_a_state_event(servers):
    server = servers(LISTEN + AUTH + '[[pools]]\nname = "default"\n')
    with Raw(server.http_port) as raw:
        raw.send(b"GET /v1/events?snapshot_s=0 HTTP/1.1\r\nhost: x\r\nauthorization: Bearer " + ADMIN.encode()
                 + b"\r\n\r\n")
        while b"event: hello" not in raw.buffer:
            assert raw._fill()
        server.signal(signal.SIGTERM)
        while raw._fill():
            pass
    text = raw.buffer.decode()
    assert 'event: state\ndata: {"state":"stopping"}' in text
    assert text.endswith("0\r\n\r\n")   # the last chunk: the stream ended cleanly
    assert server.wait(30) == 0


def test_an_http_1_0_client_gets_the_stream_until_the_connection_closes(servers):
    server = servers(LISTEN + AUTH + '[[pools]]\nname = "default"\n')
    with Raw(server.http_port) as raw:
        raw.send(b"GET /v1/events?snapshot_s=0.2 HTTP/1.0\r\nauthorization: Bearer " + ADMIN.encode() + b"\r\n\r\n")
        while raw.buffer.count(b"event: snapshot") < 2:
            assert raw._fill()
        head, _, body = raw.buffer.partition(b"\r\n\r\n")
        assert b"connection: close" in head and b"transfer-encoding" not in head
        assert body.startswith(b"event: hello\n")   # no chunk sizes: the close ends the body


def test_a_standby_refuses_streams_with_503(servers, tmp_path):
    config = LISTEN + f'[store]\nkind = "sqlite"\npath = "{tmp_path / "s.db"}"\nlease_ttl_s = 10\n' \
                      'lease_renew_s = 1\nlock_poll_s = 0.1\n[[pools]]\nname = "default"\n'
    servers(config, name="a")
    standby = servers(config, name="b", wait_for="standing by")
    r = httpx.get(f"http://127.0.0.1:{standby.http_port}/v1/events", headers={"host": "localhost"})
    assert r.status_code == 503 and r.headers["retry-after"] == "1"


def test_a_live_feed_drops_the_oldest_and_counts_them():
    feed = LiveFeed(3, frozenset({"a"}))

    class Event:
        def __init__(self, i: int, pool: str = "a") -> None:
            self.id, self.pool = i, pool

    for i in range(5):
        feed.deliver(Event(i))
    feed.deliver(Event(99, "b"))   # another pool: not this feed's
    events, lagged = feed.take()
    assert [e.id for e in events] == [2, 3, 4] and lagged == 2
    assert feed.take() == ([], 0) and not feed.wake.is_set()


# ---------------------------------------------------------------- the task list's filters


@pytest.mark.asyncio
async def test_class_and_tenant_filters_page_through_every_match(server):
    async with http(server, CLIENT) as api:
        made = []
        for i in range(12):
            body = {"pool": "idle", "priority": ["high", "low", "normal"][i % 3], "tenant": ["acme", "globex"][i % 2]}
            made.append(((await api.post("/v1/tasks", json=body)).json()["id"], body))
        expected = [tid for tid, body in made if body["priority"] == "high" and body["tenant"] == "acme"]
        got, after = [], None
        while True:
            params = {"priority": "high", "tenant": "acme", "limit": "1"}
            if after:
                params["after"] = after
            page = (await api.get("/v1/tasks", params=params)).json()
            got += [t["id"] for t in page["tasks"]]
            assert all(t["priority"] == "high" and t["tenant"] == "acme" for t in page["tasks"])
            after = page.get("next_after")
            if after is None:
                break
        assert got == expected and len(expected) == 2
        low = (await api.get("/v1/tasks", params={"priority": "low", "pool": "idle"})).json()["tasks"]
        assert [t["id"] for t in low] == [tid for tid, body in made if body["priority"] == "low"]
        r = await api.get("/v1/tasks", params={"priority": "urgent"})
        assert r.status_code == 400 and r.json()["error"].startswith("priority")


@pytest.mark.asyncio
async def test_a_filtered_page_scans_at_most_max_list_tasks():
    async with cronoq.server.serve(LISTEN + '[limits]\nmax_list = 5\n[[pools]]\nname = "default"\n') as server:
        async with http(server) as api:
            api.headers["host"] = "localhost"
            ids = [(await api.post("/v1/tasks", json={"tenant": "t" if i == 7 else "u"})).json()["id"]
                   for i in range(9)]
            first = (await api.get("/v1/tasks", params={"tenant": "t"})).json()
            assert first == {"tasks": [], "next_after": ids[4]}   # five scanned, none matched: go on
            second = (await api.get("/v1/tasks", params={"tenant": "t", "after": first["next_after"]})).json()
            assert [t["id"] for t in second["tasks"]] == [ids[7]] and "next_after" not in second


# ---------------------------------------------------------------- a task's attempts and dependencies


@pytest.mark.asyncio
async def test_a_task_reports_its_attempts_and_dependencies(server):
    async with http(server, CLIENT) as api:
        flaky = (await api.post("/v1/tasks", json={"payload": {"fail": True}, "key": "flaky",
                                                   "retry": {"max_attempts": 2, "initial_backoff_s": 0.01},
                                                   "wait": True})).json()
        info = (await api.get(f"/v1/tasks/{flaky['id']}")).json()
        assert [(a["attempt"], a["status"], a["message"]) for a in info["attempts"]] == [
            (1, "retrying", "failed as asked"), (2, "dead_lettered", "gave up after 2 attempts: failed as asked")]
        for a in info["attempts"]:
            assert int(a["started_unix_ns"]) <= int(a["ended_unix_ns"])
        assert "deps" not in info
        later = (await api.post("/v1/tasks", json={"after": ["flaky"], "deps": [{"id": flaky["id"],
                                                                                 "cond": "on_failure"}],
                                                   "pool": "idle"})).json()
        info = (await api.get(f"/v1/tasks/{later['id']}")).json()
        assert info["deps"] == [{"key": "flaky", "cond": "on_success"}, {"id": flaky["id"], "cond": "on_failure"}]
        assert "attempts" not in info   # never ran


def test_an_attempt_ends_with_the_next_status_and_only_the_latest_are_kept():
    cache = InfoCache(10)
    cache.put(1, TaskMeta(TaskSpec(None), "default", 100, 0))
    cache.saw(1, "ready", 1)
    cache.saw(1, "running", 2, attempt=1)
    cache.saw(1, "running", 3, attempt=1)             # handed to another worker: the first ends without a status
    cache.saw(1, "retrying", 4, attempt=1, message="boom")
    assert cache.get(1).attempts == [[1, None, "", 2, 3, "", None, None],
                                      [1, "retrying", "boom", 3, 4, "", None, None]]
    for n in range(2, 50):
        cache.saw(1, "running", 10 * n, attempt=n)
    assert len(cache.get(1).attempts) == 32 and cache.get(1).attempts[-1][0] == 49


# ---------------------------------------------------------------- resubmitting dead letters


@pytest.mark.asyncio
async def test_an_admin_resubmits_a_dead_letter_with_its_payload_and_options(server):
    async with http(server, CLIENT) as client, http(server, ADMIN) as admin:
        dead = (await client.post("/v1/tasks", json={
            "payload": {"fail": True}, "key": "dl/1", "priority": "high", "tenant": "acme", "tags": {"t": "1"},
            "retry": {"max_attempts": 1}, "wait": True})).json()
        assert dead["result"]["status"] == "dead_lettered"
        refused = await client.post(f"/v1/tasks/{dead['id']}:resubmit")
        assert refused.status_code == 403 and "admin role" in refused.json()["error"]
        again = (await admin.post(f"/v1/tasks/{dead['id']}:resubmit")).json()
        assert again["id"] != dead["id"] and again["duplicate"] is False
        info = (await admin.get(f"/v1/tasks/{again['id']}")).json()
        assert "key" not in info and info["priority"] == "high" and info["tenant"] == "acme"
        assert info["tags"] == {"t": "1", "resubmitted_from": dead["id"]} and info["max_attempts"] == 1
        result = (await admin.get(f"/v1/tasks/{again['id']}/result")).json()
        assert result["status"] == "dead_lettered" and result["message"].endswith("failed as asked")
        ok = (await client.post("/v1/tasks", json={"payload": {}, "wait": True})).json()
        r = await admin.post(f"/v1/tasks/{ok['id']}:resubmit")
        assert r.status_code == 409 and "is succeeded" in r.json()["error"]
        r = await admin.post("/v1/tasks/999999:resubmit")
        assert r.status_code == 404
        r = await admin.post("/v1/tasks/abc:resubmit")
        assert r.status_code == 400


def test_the_leader_keeps_the_payloads_of_its_last_dead_letters_only():
    cache = InfoCache(100, dead_letters=2)
    for task_id in range(1, 5):
        cache.put(task_id, TaskMeta(TaskSpec({"n": task_id}), "default", 1, 0))
    cache.saw(1, "dead_lettered", 1)
    cache.saw(2, "succeeded", 1)
    cache.saw(3, "dead_lettered", 1)
    assert cache.get(1).spec is not None and cache.get(2).spec is None
    cache.saw(4, "dead_lettered", 1)
    assert cache.get(1).spec is None and cache.get(3).spec.payload == {"n": 3} and cache.get(4).spec is not None


# ---------------------------------------------------------------- recurring schedules


@pytest.mark.asyncio
async def test_only_an_admin_removes_a_recurring_schedule(server):
    async with http(server, METRICS) as metrics, http(server, ADMIN) as admin:
        r = await metrics.delete("/v1/recurring/nightly%2Freport")
        assert r.status_code == 403 and "admin role" in r.json()["error"]
        assert (await admin.delete("/v1/recurring/nightly%2Freport")).json() == {"removed": True}
        assert (await admin.delete("/v1/recurring/nightly%2Freport")).json() == {"removed": False}
        assert (await metrics.get("/v1/recurring")).json() == {"schedules": []}
        assert (await admin.get("/v1/recurring/x")).status_code == 405
        assert (await admin.delete("/v1/recurring/a/b")).status_code == 404


# ---------------------------------------------------------------- the dashboard's files


@pytest.mark.asyncio
async def test_the_dashboard_files_are_served_without_credentials_and_locked_down(server):
    async with http(server) as anonymous:
        r = await anonymous.get("/ui")
        assert r.status_code == 308 and r.headers["location"] == "/ui/"
        page = await anonymous.get("/ui/")
        assert page.status_code == 200 and page.headers["content-type"] == "text/html; charset=utf-8"
        csp = page.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "connect-src 'self'" in csp and "frame-ancestors 'none'" in csp
        assert page.headers["x-content-type-options"] == "nosniff" and page.headers["referrer-policy"] == "no-referrer"
        for name in ("app.js", "app.css"):
            assert name in page.text
            r = await anonymous.get(f"/ui/{name}")
            assert r.status_code == 200 and r.headers["content-type"].startswith(
                "text/javascript" if name.endswith(".js") else "text/css")
        for path in ("/ui/missing.js", "/ui/.hidden.js", "/ui/sub/app.js", "/ui/%2e%2e/gateway.py",
                     "/ui/index.py"):
            assert (await anonymous.get(path)).status_code == 404, path
        r = await anonymous.post("/ui/")
        assert r.status_code == 405 and r.headers["allow"] == "GET, HEAD"
        head = await anonymous.head("/ui/app.js")
        assert head.status_code == 200 and head.content == b""


@pytest.mark.asyncio
async def test_server_ui_false_switches_the_dashboard_off():
    async with cronoq.server.serve(LISTEN + "ui = false\n") as server:
        async with http(server) as api:
            api.headers["host"] = "localhost"
            r = await api.get("/ui/")
            assert r.status_code == 404 and "server.ui = false" in r.json()["error"]
            assert (await api.get("/v1/snapshot")).status_code == 200   # the API stays on


def test_check_validates_server_ui(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text('[server]\nui = false\n')
    assert run_cli("--check", "--config", str(good)).returncode == 0
    bad = tmp_path / "bad.toml"
    bad.write_text('[server]\nui = "no"\n')
    result = run_cli("--check", "--config", str(bad))
    assert result.returncode == 2 and "server.ui" in result.stdout + result.stderr
