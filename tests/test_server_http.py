"""The HTTP/JSON gateway against a real cronoq-server process, over the
network: every route (submit with wait, batches, lookups by id and by
percent-encoded key, results with long-poll and 504, cancel, listing with
filters and pages, workers, recurring, snapshot, /metrics, probes, the
metrics listener) and every convention (bearer auth and roles, pool scope,
tenant pinning, JSON only, the body limit, unknown fields, NUL, both time
forms, durations, ids as strings, error bodies, time limits). The HTTP/1.1
mechanics are in test_server_http_wire.py, the OpenAPI document in
test_server_openapi.py, standbys and draining in test_server_http_ha.py."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest
import pytest_asyncio

import cronoq
from cronoq._proto import cronoq_pb2 as pb
from cronoq.client import Client, Worker
from httpkit import Raw, client, error_of, request_bytes, until
from serverkit import ADMIN, AUTH, CLIENT, LISTEN, METRICS, WORKER

pytestmark = pytest.mark.asyncio

SCOPED = "scoped-client-token-0123456789abcd"
SCOPED_METRICS = "scoped-metrics-token-0123456789ab"
TENANT = "tenant-client-token-0123456789abcd"

CONFIG = LISTEN + 'metrics_addr = "127.0.0.1:0"\n' + AUTH + f"""
[[auth.tokens]]
token = "{SCOPED}"
role = "client"
pools = ["other"]
[[auth.tokens]]
token = "{SCOPED_METRICS}"
role = "metrics"
pools = ["other"]
[[auth.tokens]]
token = "{TENANT}"
role = "client"
tenant = "acme"

[limits]
max_tasks_per_batch = 5
max_list = 50
max_deps = 3
max_wait_s = 3
request_timeout_s = 1
max_http_body_bytes = 65536

[[pools]]
name = "default"
retry = {{ max_attempts = 2, initial_backoff_s = 0.05, jitter = false }}
[[pools]]
name = "other"
[[pools]]
name = "idle"
[[pools]]
name = "bounded"
max_pending = 1
overflow = "reject"

[[resources]]
name = "gpu"
kind = "semaphore"
permits = 1

[[recurring]]
name = "yearly"
cron = "0 0 1 1 *"
pool = "idle"
kind = "report"
payload = {{ report = "yearly" }}
"""


async def handle(lease):
    """JSON: echo (or sleep, or fail); text: upper case; bytes: as they are."""
    if lease.content_type == "application/json":
        data = lease.json()
        if isinstance(data, dict) and "sleep" in data:
            await asyncio.sleep(data["sleep"])
        if isinstance(data, dict) and "fail" in data:
            raise cronoq.Permanent(data["fail"])
        return {"echo": data, "attempt": lease.attempt}
    if lease.content_type.startswith("text/plain"):
        return lease.text().upper()
    return lease.payload


@pytest.fixture(scope="module")
def server(module_servers):
    return module_servers(CONFIG, name="http")


@pytest_asyncio.fixture
async def worker(server):
    workers = [Worker(server.target, pool, handle, slots=4, token=WORKER, initial_backoff=0.05)
               for pool in ("default", "other")]
    tasks = [asyncio.create_task(w.run()) for w in workers]
    async with client(server, METRICS) as http:
        async def connected():
            return len((await http.get("/v1/workers")).json()["workers"]) >= 2
        await until(connected, what="the workers connecting")
    yield workers
    for w in workers:
        w.stop()
    await asyncio.wait_for(asyncio.gather(*tasks), 30)


# ---------------------------------------------------------------- routes


async def test_submit_with_wait_returns_the_result_in_every_payload_form(server, worker):
    async with client(server, CLIENT) as http:
        r = await http.post("/v1/tasks", json={"payload": {"n": 1}, "priority": "high", "key": "h-json",
                                               "wait": True, "wait_timeout_s": 30})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["duplicate"] is False and isinstance(body["id"], str) and body["id"].isdigit()
        result = body["result"]
        assert result["id"] == body["id"] and result["status"] == "succeeded" and result["output_available"]
        assert result["content_type"] == "application/json"
        assert result["output"] == {"echo": {"n": 1}, "attempt": 1}
        assert json.loads(base64.b64decode(result["output_b64"])) == result["output"]
        again = (await http.post("/v1/tasks", json={"payload": {"n": 2}, "key": "h-json"})).json()
        assert again == {"id": body["id"], "duplicate": True}
        raw = (await http.post("/v1/tasks", json={"payload_b64": base64.b64encode(b"\x00\xff").decode(),
                                                   "wait": True})).json()["result"]
        assert raw["content_type"] == "application/octet-stream" and base64.b64decode(raw["output_b64"]) == b"\x00\xff"
        assert "output" not in raw and "output_text" not in raw
        text = (await http.post("/v1/tasks", json={"payload_text": "h\u00e9llo", "wait": True})).json()["result"]
        assert text["output_text"] == "H\u00c9LLO" and text["content_type"] == "text/plain; charset=utf-8"
        failed = (await http.post("/v1/tasks", json={"payload": {"fail": "asked to fail"}, "wait": True})).json()
        assert failed["result"] == {"id": failed["id"], "status": "failed", "output_available": False,
                                    "message": "asked to fail"}
        # The same admission path as gRPC: the key submitted over HTTP is a duplicate there.
        async with Client(server.target, token=CLIENT) as grpc_client:
            sub = await grpc_client.submit("x", key="h-json")
            assert (str(sub.id), sub.duplicate) == (body["id"], True)


async def test_submit_wait_times_out_with_504_and_the_task_keeps_running(server):
    async with client(server, CLIENT) as http:
        r = await http.post("/v1/tasks", json={"pool": "idle", "key": "h-504", "wait": True, "wait_timeout_s": 0.2})
        assert error_of(r)[:2] == (504, "gateway_timeout") and "still running" in r.json()["error"]
        info = (await http.get("/v1/tasks/by-key/h-504")).json()
        assert info["status"] == "ready"
        # wait_timeout_s and timeout_s are capped at limits.max_wait_s (3 s).
        r = await http.get(f"/v1/tasks/{info['id']}/result", params={"timeout_s": 600})
        assert error_of(r)[0] == 504 and "after 3 s" in r.json()["error"]
        r = await http.get(f"/v1/tasks/{info['id']}/result", params={"timeout_s": 0})
        assert error_of(r)[0] == 504


async def test_result_long_polls_until_the_task_ends(server, worker):
    async with client(server, CLIENT) as http:
        sub = (await http.post("/v1/tasks", json={"payload": {"sleep": 0.5}, "key": "h-poll"})).json()
        r = await http.get("/v1/tasks/by-key/h-poll/result", params={"timeout_s": 2.9})
        assert r.status_code == 200, r.text
        assert r.json()["output"] == {"echo": {"sleep": 0.5}, "attempt": 1}
        by_id = (await http.get(f"/v1/tasks/{sub['id']}/result")).json()
        assert by_id == r.json()


async def test_batches_are_atomic_with_errors_naming_the_task(server, worker):
    async with client(server, CLIENT) as http:
        r = await http.post("/v1/tasks:batch", json={"tasks": [
            {"payload": "load", "key": "b-load", "after": ["b-extract"]},
            {"payload": "extract", "key": "b-extract"},
            {"payload": "alert", "deps": [{"key": "b-load", "cond": "on_failure"}]},
        ]})
        assert r.status_code == 200, r.text
        tasks = r.json()["tasks"]
        assert [t["duplicate"] for t in tasks] == [False] * 3 and all(isinstance(t["id"], str) for t in tasks)
        first = (await http.get(f"/v1/tasks/{tasks[0]['id']}/result")).json()
        assert first["output"] == {"echo": "load", "attempt": 1}
        assert (await http.get(f"/v1/tasks/{tasks[2]['id']}/result")).json()["status"] == "skipped"
        # One bad task refuses them all, naming it.
        r = await http.post("/v1/tasks:batch", json={"tasks": [{"key": "b-fine"}, {"after": ["b-nowhere"]}]})
        assert error_of(r)[0] == 400 and "task 1 of the batch" in r.json()["error"]
        assert r.headers["cronoq-error"] == "UnknownDependency"
        assert (await http.get("/v1/tasks/by-key/b-fine")).status_code == 404
        r = await http.post("/v1/tasks:batch", json={"tasks": [{"key": "b-fine"}, {"priority": "urgent"}]})
        assert error_of(r)[0] == 400 and r.json()["error"].startswith("tasks[1].priority: must be one of")
        r = await http.post("/v1/tasks:batch", json={"tasks": [{}] * 6})
        assert error_of(r)[0] == 400 and "at most 5 tasks" in r.json()["error"]
        assert (await http.post("/v1/tasks:batch", json={"tasks": []})).json() == {"tasks": []}
        assert error_of(await http.post("/v1/tasks:batch", json={}))[2] == "tasks: is required"


async def test_get_by_id_and_by_percent_encoded_key(server):
    async with client(server, CLIENT) as http:
        key = "report/2024 \u00e9t\u00e9?#%"
        sub = (await http.post("/v1/tasks", json={"pool": "idle", "key": key, "kind": "report",
                                                  "tags": {"team": "a"}, "priority": "low"})).json()
        encoded = "report%2F2024%20%C3%A9t%C3%A9%3F%23%25"
        info = (await http.get(f"/v1/tasks/by-key/{encoded}")).json()
        assert info == (await http.get(f"/v1/tasks/{sub['id']}")).json()
        assert {k: info[k] for k in ("id", "status", "pool", "key", "kind", "attempt", "priority", "tags",
                                     "max_attempts", "output_available")} == {
            "id": sub["id"], "status": "ready", "pool": "idle", "key": key, "kind": "report", "attempt": 0,
            "priority": "low", "tags": {"team": "a"}, "max_attempts": 3, "output_available": False}
        assert isinstance(info["created_unix_ns"], str) and int(info["created_unix_ns"]) > 0
        # An unencoded / splits the key: no such route, with the hint.
        r = await http.get("/v1/tasks/by-key/report/2024")
        assert error_of(r)[0] == 404 and "%2F" in r.json()["error"]
        r = await http.get("/v1/tasks/report-2024")
        assert error_of(r)[0] == 400 and "by-key" in r.json()["error"]
        for path in ("/v1/tasks/0", "/v1/tasks/18446744073709551616"):
            assert error_of(await http.get(path))[0] == 400
        assert error_of(await http.get("/v1/tasks/by-key/%FF"))[0] == 400
        r = await http.get(f"/v1/tasks/{10 ** 15}")
        assert error_of(r)[:2] == (404, "not_found") and r.headers["cronoq-error"] == "UnknownTask"


async def test_cancel_by_id_and_by_key(server):
    async with client(server, CLIENT) as http:
        one = (await http.post("/v1/tasks", json={"pool": "idle", "key": "c-one"})).json()
        two = (await http.post("/v1/tasks", json={"pool": "idle", "key": "c/two"})).json()
        assert (await http.delete(f"/v1/tasks/{one['id']}")).json() == {"cancelled": True}
        assert (await http.delete(f"/v1/tasks/{one['id']}")).json() == {"cancelled": False}
        assert (await http.delete("/v1/tasks/by-key/c%2Ftwo")).json() == {"cancelled": True}
        result = (await http.get(f"/v1/tasks/{two['id']}/result", params={"timeout_s": 0})).json()
        assert result == {"id": two["id"], "status": "cancelled", "output_available": False,
                          "message": result["message"]}
        assert error_of(await http.delete("/v1/tasks/by-key/c-none"))[0] == 404


async def test_listing_filters_by_pool_and_status_and_pages(server):
    async with client(server, CLIENT) as http:
        ids = [t["id"] for t in (await http.post("/v1/tasks:batch", json={"tasks": [
            {"pool": "idle", "tags": {"page": str(i)}} for i in range(5)]})).json()["tasks"]]
        seen, after, pages = [], "0", 0
        while True:
            page = (await http.get("/v1/tasks", params={"pool": "idle", "status": "ready,blocked",
                                                        "after": after, "limit": 2})).json()
            pages += 1
            assert len(page["tasks"]) <= 2 and pages < 100
            seen += [t["id"] for t in page["tasks"]]
            assert all(t["pool"] == "idle" and t["status"] == "ready" for t in page["tasks"])
            if "next_after" not in page:
                break
            assert isinstance(page["next_after"], str)
            after = page["next_after"]
        assert [i for i in seen if i in ids] == ids
        # Repeated parameters work like commas; ids accepted as numbers too.
        both = (await http.get("/v1/tasks?pool=idle&pool=other&status=ready&status=succeeded&limit=50")).json()
        assert {t["pool"] for t in both["tasks"]} <= {"idle", "other"}
        assert (await http.get("/v1/tasks", params={"pool": "idle", "after": int(ids[-1])})).json()["tasks"] == [
            t for t in (await http.get("/v1/tasks", params={"pool": "idle", "after": ids[-1]})).json()["tasks"]]
        capped = (await http.get("/v1/tasks", params={"limit": 100000})).json()
        assert len(capped["tasks"]) <= 50
        r = await http.get("/v1/tasks", params={"status": "done"})
        assert error_of(r)[0] == 400 and r.json()["error"].startswith("status: must be one of")
        assert error_of(await http.get("/v1/tasks", params={"pool": "nowhere"}))[0] == 404
        assert error_of(await http.get("/v1/tasks", params={"limit": "ten"}))[2].startswith("limit: must be an integer")
        r = await http.get("/v1/tasks", params={"pools": "idle"})
        assert error_of(r)[0] == 400 and "unknown query parameter" in r.json()["error"]
        assert error_of(await http.get("/v1/tasks?limit=1&limit=2"))[2] == "limit: is given more than once"


async def test_workers_recurring_and_snapshot_need_the_metrics_role(server, worker):
    async with client(server, METRICS) as http:
        workers = (await http.get("/v1/workers")).json()["workers"]
        assert {w["pool"] for w in workers} >= {"default", "other"}
        for w in workers:
            assert set(w) == {"id", "name", "pool", "labels", "slots", "busy", "connected_unix_ns", "health",
                              "lease_expiries", "last_seen_unix_ns"}
            assert (w["health"], w["lease_expiries"]) == ("healthy", 0) and isinstance(w["last_seen_unix_ns"], str)
            assert isinstance(w["id"], str) and isinstance(w["connected_unix_ns"], str) and w["slots"] == 4
        only = (await http.get("/v1/workers", params={"pool": "other"})).json()["workers"]
        assert [w["pool"] for w in only] == ["other"]
        schedules = (await http.get("/v1/recurring")).json()["schedules"]
        yearly = next(s for s in schedules if s["name"] == "yearly")
        assert {k: yearly[k] for k in ("cron", "pool", "kind", "overlap")} == {
            "cron": "0 0 1 1 *", "pool": "idle", "kind": "report", "overlap": "skip"}
        assert "tz" not in yearly and isinstance(yearly["next_unix_ns"], str) and "last_task_id" not in yearly
        snap = (await http.get("/v1/snapshot")).json()
        assert set(snap) == set(pb.SnapshotResponse.DESCRIPTOR.fields_by_name)
        assert snap["unavailable_shards"] == [] and isinstance(snap["at_unix_ns"], str)
        assert {"submitted", "succeeded", "dead_lettered"} <= set(snap["totals"])
        pools = {p["name"]: p for p in snap["pools"]}
        assert set(pools) == {"default", "other", "idle", "bounded"}
        for pool in pools.values():   # every field of the pool snapshot
            assert set(pool) == set(pb.PoolSnapshot.DESCRIPTOR.fields_by_name)
            assert list(pool["pending_by_class"]) == ["critical", "high", "normal", "low"]
        assert pools["default"]["capacity"] == 4 and pools["default"]["workers_connected"] >= 1
        assert pools["default"]["groups"] == [{"labels": {}, "capacity": 4, "busy": pools["default"]["busy"]}]
    async with client(server, CLIENT) as http:
        for path in ("/v1/workers", "/v1/recurring", "/v1/snapshot", "/metrics"):
            status, code, message = error_of(await http.get(path))
            assert (status, code) == (403, "forbidden") and "metrics role" in message
    async with client(server, METRICS) as http:
        status, _, message = error_of(await http.get("/v1/tasks"))
        assert status == 403 and "client role" in message
    async with client(server, ADMIN) as http:   # admin passes every check
        assert (await http.get("/v1/snapshot")).status_code == 200
        assert (await http.get("/v1/tasks", params={"limit": 1})).status_code == 200


async def test_metrics_are_prometheus_text_for_the_metrics_role(server, worker):
    async with client(server, METRICS) as http:
        r = await http.get("/metrics")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        assert 'cronoq_pool_workers{pool="default"} 4.0' in r.text
        assert "cronoq_scheduler_up 1.0" in r.text and "cronoq_tasks_submitted_total" in r.text
    async with client(server, SCOPED_METRICS) as http:   # a scoped credential sees its pools only
        text = (await http.get("/metrics")).text
        assert 'pool="other"' in text and 'pool="default"' not in text
        snap = (await http.get("/v1/snapshot")).json()
        assert [p["name"] for p in snap["pools"]] == ["other"]
        assert (await http.get("/v1/workers", params={"pool": "default"})).status_code == 403
    async with client(server) as http:
        assert error_of(await http.get("/metrics"))[0] == 401


async def test_the_metrics_listener_serves_metrics_and_probes_without_credentials(server, worker):
    assert server.metrics_port and server.metrics_port != server.http_port
    async with client(server, port=server.metrics_port) as http:
        r = await http.get("/metrics")
        assert r.status_code == 200 and 'cronoq_pool_workers{pool="default"} 4.0' in r.text
        assert (await http.get("/healthz")).text == "ok\n"
        assert (await http.get("/readyz")).text == "ready\n"
        for path in ("/v1/tasks", "/v1/snapshot", "/v1/openapi.json"):
            assert error_of(await http.get(path))[0] == 404
        assert error_of(await http.post("/metrics"))[0] == 405


async def test_probes_need_no_credentials(server):
    async with client(server) as http:
        assert ((await http.get("/healthz")).status_code, (await http.get("/healthz")).text) == (200, "ok\n")
        assert (await http.get("/readyz")).text == "ready\n"
        head = await http.head("/readyz")
        assert head.status_code == 200 and head.content == b"" and head.headers["content-length"] == "6"
        assert (await http.get("/v1/openapi.json")).json()["openapi"].startswith("3.1")


# ---------------------------------------------------------------- conventions


async def test_bearer_authentication(server):
    async with client(server) as http:
        for headers in ({}, {"authorization": "Bearer not-a-token-of-this-server"},
                        {"authorization": "Basic dXNlcjpwYXNz"}, {"authorization": "Bearer"}):
            r = await http.post("/v1/tasks", json={}, headers=headers)
            assert error_of(r)[:2] == (401, "unauthorized")
            assert r.headers["www-authenticate"] == "Bearer"
        r = await http.post("/v1/tasks", json={"pool": "idle"}, headers={"authorization": f"bearer {CLIENT}"})
        assert r.status_code == 200
        r = await http.post("/v1/tasks", json={"pool": "idle"}, headers={"authorization": f"Bearer {WORKER}"})
        assert error_of(r)[:2] == (403, "forbidden")


async def test_pool_scope_hides_other_pools(server):
    async with client(server, CLIENT) as everyone, client(server, SCOPED) as scoped:
        hidden = (await everyone.post("/v1/tasks", json={"pool": "idle", "key": "s-hidden"})).json()
        mine = (await scoped.post("/v1/tasks", json={"pool": "other", "key": "s-mine"})).json()
        assert (await scoped.get(f"/v1/tasks/{mine['id']}")).json()["pool"] == "other"
        # Exactly as if they did not exist.
        for path, missing in ((f"/v1/tasks/{hidden['id']}", f"/v1/tasks/{10 ** 15}"),
                              ("/v1/tasks/by-key/s-hidden", "/v1/tasks/by-key/s-nowhere"),
                              (f"/v1/tasks/{hidden['id']}/result", f"/v1/tasks/{10 ** 15}/result")):
            r, absent = await scoped.get(path), await scoped.get(missing)
            assert error_of(r)[0] == error_of(absent)[0] == 404
            assert r.json()["error"].replace(hidden["id"], "N").replace("s-hidden", "N") == \
                absent.json()["error"].replace(str(10 ** 15), "N").replace("s-nowhere", "N")
        assert error_of(await scoped.delete(f"/v1/tasks/{hidden['id']}"))[0] == 404
        assert error_of(await scoped.post("/v1/tasks", json={"pool": "idle"}))[:2] == (403, "forbidden")
        r = await scoped.post("/v1/tasks", json={"pool": "other", "key": "s-hidden"})
        assert error_of(r)[:2] == (409, "conflict") and "s-hidden" in r.json()["error"]
        assert error_of(await scoped.get("/v1/tasks", params={"pool": "idle"}))[0] == 403
        listed = (await scoped.get("/v1/tasks", params={"limit": 50})).json()["tasks"]
        assert listed and {t["pool"] for t in listed} == {"other"}


async def test_tenant_pinning(server):
    async with client(server, TENANT) as http:
        sub = (await http.post("/v1/tasks", json={"pool": "idle"})).json()
        assert (await http.get(f"/v1/tasks/{sub['id']}")).json()["tenant"] == "acme"
        assert (await http.post("/v1/tasks", json={"pool": "idle", "tenant": "acme"})).status_code == 200
        r = await http.post("/v1/tasks", json={"pool": "idle", "tenant": "globex"})
        assert error_of(r)[:2] == (403, "forbidden") and "acme" in r.json()["error"]


async def test_bodies_must_be_json_objects_within_the_limit(server):
    async with client(server, CLIENT) as http:
        for headers in ({}, {"content-type": "text/plain"}, {"content-type": "application/x-www-form-urlencoded"},
                        {"content-type": "application/json; charset=latin-1"}):
            r = await http.post("/v1/tasks", content=b"{}", headers=headers)
            assert error_of(r)[:2] == (415, "unsupported_media_type")
        ok = await http.post("/v1/tasks", content=b'{"pool": "idle"}',
                             headers={"content-type": "Application/JSON; charset=UTF-8"})
        assert ok.status_code == 200
        big = json.dumps({"pool": "idle", "payload": "x" * 70000}).encode()
        r = await http.post("/v1/tasks", content=big, headers={"content-type": "application/json"})
        assert error_of(r)[:2] == (413, "content_too_large") and "65536" in r.json()["error"]
        fits = json.dumps({"pool": "idle", "payload": "x" * 60000}).encode()
        assert (await http.post("/v1/tasks", content=fits, headers={"content-type": "application/json"})
                ).status_code == 200
        for body, expected in ((b"[]", "must be a JSON object"), (b"{", "not valid JSON"),
                               (b'{"pool": "idle"} x', "not valid JSON"), (b"\xff{}", "not UTF-8"),
                               (b'{"payload": NaN}', "NaN is not a JSON number"),
                               (b'{"payload": Infinity}', "Infinity is not a JSON number"),
                               (b"[" * 60000, "not valid JSON")):
            r = await http.post("/v1/tasks", content=body, headers={"content-type": "application/json"})
            assert error_of(r)[0] == 400 and expected in r.json()["error"], (body[:20], r.text)
        r = await http.request("GET", "/v1/tasks/1", content=b"{}")
        assert error_of(r)[0] == 400 and "takes no request body" in r.json()["error"]


async def test_unknown_fields_are_refused_naming_them(server):
    async with client(server, CLIENT) as http:
        cases = [({"priorty": "high"}, "priorty: unknown field: did you mean 'priority'?"),
                 ({"pool": "idle", "zzz": 1}, "zzz: unknown field (the fields of SubmitRequest: /v1/openapi.json)"),
                 ({"retry": {"max_attempt": 2}}, "retry.max_attempt: unknown field"),
                 ({"deps": [{"key": "a", "condition": "on_failure"}]}, "deps[0].condition: unknown field"),
                 ({"after": [{"id": 1, "name": "x"}]}, "after[0].name: unknown field")]
        for body, message in cases:
            r = await http.post("/v1/tasks", json=body)
            assert error_of(r)[0] == 400 and r.json()["error"].startswith(message), r.text
        r = await http.post("/v1/tasks:batch", json={"tasks": [{}, {"wait": True}]})
        assert error_of(r)[0] == 400 and r.json()["error"].startswith("tasks[1].wait: unknown field")


async def test_strings_with_nul_are_refused(server):
    async with client(server, CLIENT) as http:
        for body, field in (({"key": "a\x00b"}, "key"), ({"pool": "id\x00le"}, "pool"),
                            ({"tags": {"t": "a\x00"}}, "tags.t"), ({"tags": {"t\x00": "a"}}, "tags"),
                            ({"payload_text": "\x00"}, "payload_text"), ({"after": ["a\x00"]}, "after[0]")):
            r = await http.post("/v1/tasks", json=body)
            assert error_of(r)[0] == 400 and r.json()["error"].startswith(field) and "NUL" in r.json()["error"]
        assert error_of(await http.get("/v1/tasks/by-key/a%00b"))[0] == 400
        assert error_of(await http.get("/v1/tasks", params={"pool": "a\x00"}))[0] == 400
        # A JSON payload may hold any string: it is data.
        assert (await http.post("/v1/tasks", json={"pool": "idle", "payload": "a\x00b"})).status_code == 200


async def test_times_durations_and_ids(server):
    async with client(server, CLIENT) as http:
        r = await http.post("/v1/tasks", json={"pool": "idle", "deadline_in_s": 5, "deadline_unix_ns": 1})
        assert error_of(r)[0] == 400 and "deadline_in_s or deadline_unix_ns, not both" in r.json()["error"]
        r = await http.post("/v1/tasks", json={"pool": "idle", "start_in_s": 5, "start_unix_ns": "1"})
        assert error_of(r)[0] == 400 and "not both" in r.json()["error"]
        for field in ("deadline_in_s", "timeout_s", "tolerance_s", "duration_hint_s", "start_in_s", "wait_timeout_s"):
            for bad in ("-1", "1e999", '"5"', "true", "-0.001"):   # (1e999 parses as infinity)
                r = await http.post("/v1/tasks", content=f'{{"pool": "idle", "{field}": {bad}}}'.encode(),
                                    headers={"content-type": "application/json"})
                assert error_of(r)[0] == 400 and r.json()["error"].startswith(f"{field}: must be"), (field, bad)
        r = await http.post("/v1/tasks", json={"pool": "idle", "retry": {"initial_backoff_s": -0.5}})
        assert error_of(r)[0] == 400 and r.json()["error"].startswith("retry.initial_backoff_s")
        # *_unix_ns and ids: numbers or decimal strings in, strings out.
        far = 4_000_000_000 * 10 ** 9
        for value in (far, str(far)):
            sub = (await http.post("/v1/tasks", json={"pool": "idle", "deadline_unix_ns": value})).json()
            assert isinstance(sub["id"], str)
        for bad in (-1, "1e3", "0x10", 1.5, 2 ** 63):
            r = await http.post("/v1/tasks", json={"pool": "idle", "deadline_unix_ns": bad})
            assert error_of(r)[0] == 400 and r.json()["error"].startswith("deadline_unix_ns: must be")
        first = (await http.post("/v1/tasks", json={"pool": "idle", "key": "t-first"})).json()
        for ref in (int(first["id"]), {"id": first["id"]}, {"id": int(first["id"])}, "t-first", {"key": "t-first"}):
            r = await http.post("/v1/tasks", json={"pool": "idle", "after": [ref]})
            assert r.status_code == 200, (ref, r.text)
        for ref in ({"id": 1, "key": "a"}, {}, 1.5, None, [1]):
            r = await http.post("/v1/tasks", json={"pool": "idle", "after": [ref]})
            assert error_of(r)[0] == 400 and r.json()["error"].startswith("after[0]"), (ref, r.text)
        r = await http.post("/v1/tasks", json={"pool": "idle", "deps": [{"id": first["id"]}]})
        assert r.status_code == 200
        r = await http.post("/v1/tasks", json={"pool": "idle", "deps": [{"cond": "on_failure"}]})
        assert error_of(r)[0] == 400 and "exactly one of id and key" in r.json()["error"]


async def test_other_fields_of_the_task_object_reach_the_scheduler(server, worker):
    async with client(server, CLIENT) as http:
        r = await http.post("/v1/tasks", json={
            "payload": {"n": 7}, "kind": "k", "tenant": "t1", "tags": {"a": "b"}, "timeout_s": 30,
            "duration_hint_s": 0.1, "deadline_in_s": 60, "retry": {"max_attempts": 5, "initial_backoff_s": 0.1,
                                                                   "multiplier": 1.5, "max_backoff_s": 1,
                                                                   "jitter": False},
            "resources": {"gpu": 1}, "content_type": "application/vnd.x+json", "wait": True})
        result = r.json()["result"]   # (the worker returned the payload's bytes: not JSON to it)
        assert base64.b64decode(result["output_b64"]) == b'{"n":7}'
        assert result["content_type"] == "application/octet-stream"
        info = (await http.get(f"/v1/tasks/{r.json()['id']}")).json()
        assert (info["kind"], info["tenant"], info["max_attempts"]) == ("k", "t1", 5)
        start = (await http.post("/v1/tasks", json={"pool": "idle", "start_in_s": 600, "tolerance_s": 30,
                                                    "on_miss": "skip"})).json()
        assert (await http.get(f"/v1/tasks/{start['id']}")).json()["status"] == "scheduled"
        for body, expected in (({"resources": {"tpu": 1}}, "UnknownResource"),
                               ({"resources": {"gpu": 2}}, "ResourceExceedsCapacity"),
                               ({"payload": 1, "payload_text": "x"}, None),
                               ({"payload_b64": "", "payload_text": "x"}, None),
                               ({"retry": {"max_attempts": 0}}, None),
                               ({"on_miss": "later"}, None),
                               ({"payload_b64": "not base64!"}, None),
                               ({"after": ["a", "b", "c", "d"]}, None)):
            r = await http.post("/v1/tasks", json={"pool": "idle", **body})
            assert error_of(r)[0] == 400, (body, r.text)
            if expected:
                assert r.headers["cronoq-error"] == expected


async def test_error_codes_are_lower_case_reason_phrases(server):
    async with client(server, CLIENT) as http:
        await http.post("/v1/tasks", json={"pool": "bounded"})
        r = await http.post("/v1/tasks", json={"pool": "bounded"})
        assert error_of(r)[:2] == (429, "too_many_requests") and r.headers["cronoq-error"] == "QueueFull"
        assert error_of(await http.post("/v1/tasks", json={"pool": "nowhere"}))[:2] == (404, "not_found")
        r = await http.put("/v1/tasks", json={})
        assert error_of(r)[:2] == (405, "method_not_allowed") and r.headers["allow"] == "GET, POST"
        r = await http.post("/v1/tasks/1")
        assert error_of(r)[0] == 405 and r.headers["allow"] == "DELETE, GET"
        assert error_of(await http.get("/v2/tasks"))[:2] == (404, "not_found")


async def test_a_body_that_does_not_arrive_within_the_request_timeout_gets_408(server):
    # limits.request_timeout_s = 1: a body that never completes (the client is late: 408, not 504).
    with Raw(server.http_port) as raw:
        raw.send(request_bytes("POST", "/v1/tasks:batch", token=CLIENT,
                               headers={"content-type": "application/json", "content-length": "100"}) + b'{"tas')
        status, headers, body = raw.response()
        assert status == 408 and json.loads(body)["code"] == "request_timeout"
        assert headers["connection"] == "close" and raw.closed_by_peer()
